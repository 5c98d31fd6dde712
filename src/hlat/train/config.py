"""Training-loop, precision and logging settings."""

from __future__ import annotations

from dataclasses import dataclass

DEVICES = ("auto", "cpu", "cuda")
PRECISION_MODES = ("fp32", "mixed")


@dataclass
class TrainConfig:
    steps: int = 430_000  # optimizer steps (HLAT 7B: ~430k steps = 1.8T tokens)
    global_batch: int = 1024  # sequences per optimizer step; gradient accumulation fills it
    micro_batch: int = 1  # sequences per forward/backward pass
    seed: int = 0
    device: str = "auto"  # "auto" takes CUDA when present, else the CPU
    run_dir: str = ""  # "" = runs/<preset or config name>
    log_every: int = 10
    peak_tflops: float = 0.0  # MFU denominator; 0 = known device table, or measured on a CPU
    tensorboard: bool = True

    def validate(self) -> list[tuple[str, str]]:
        problems = []
        for name in ("steps", "global_batch", "micro_batch", "log_every"):
            if getattr(self, name) < 1:
                problems.append((name, f"must be >= 1, got {getattr(self, name)}"))
        if self.micro_batch >= 1 and self.global_batch % self.micro_batch:
            problems.append(("global_batch", f"{self.global_batch} is not divisible by train.micro_batch={self.micro_batch}; make the global batch a multiple of the micro batch"))
        if self.device not in DEVICES:
            problems.append(("device", f"got {self.device!r}; choose one of {', '.join(DEVICES)}"))
        if self.peak_tflops < 0:
            problems.append(("peak_tflops", f"must be >= 0 (0 = automatic), got {self.peak_tflops}"))
        return problems


@dataclass
class PrecisionConfig:
    # "fp32": everything in fp32. "mixed": bf16 autocast compute with fp32 weights, gradients and
    # optimizer state; norms, softmax and the loss stay in fp32 (HLAT's 70B mode).
    mode: str = "fp32"

    def validate(self) -> list[tuple[str, str]]:
        if self.mode not in PRECISION_MODES:
            return [("mode", f"got {self.mode!r}; choose one of {', '.join(PRECISION_MODES)}")]
        return []
