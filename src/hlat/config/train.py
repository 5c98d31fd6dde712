"""The training loop: steps, batch sizes, device, run directory, logging, sample and slow-rank report."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from hlat.config.fields import choice_problems
from hlat.device.names import device_name_problem


@dataclass
class TrainConfig:
    """`[train]`: the training loop: steps, batch sizes, device, run directory, logging, sample and
    slow-rank report."""

    steps: int = 430_000
    """Optimizer steps (HLAT 7B: ~430k steps = 1.8T tokens)."""
    global_batch: int = 1024
    """Sequences per optimizer step; gradient accumulation fills it."""
    micro_batch: int = 1
    """Sequences per forward/backward pass."""
    seed: int = 0
    """Seeds the weight initialisation and the data order."""
    deterministic: bool = False
    """Bit-identical training across data-parallel layouts: the saved model, optimizer and loader
    state and the logged losses are the same bits for any dp degree (a power of two), DDP, ZeRO-1/2,
    FSDP2 or HSDP (2 replicas), any split of the global batch into accumulation steps and any resume
    point, at fixed tensor-, context- and pipeline-parallel degrees, and for elastic groups joining
    and leaving. The global
    batch is read as global_batch / micro_batch (a power of two) data shares and summed in one
    fixed order; one reduction per micro-batch, one intra-op thread on the CPU
    (docs/reproducibility.md)."""
    replay_every: int = 0
    """train.deterministic runs: every this many steps each data-parallel rank recomputes another
    rank's first micro-batch and compares the gradient's SHA-256 with the owner's; a rank two others
    disagree with is named (rank, host, device) and the run stops with exit status 3 (silent data
    corruption; docs/reproducibility.md). 0 = off."""
    device: str = "auto"
    """The device to train on: "auto" = the accelerator torch finds (torch.accelerator: CUDA, ROCm, XPU,
    MPS, Trainium's neuron, ...), else the CPU; or a device type as torch names it ("cpu", "cuda",
    "neuron", ...), with an index ("cuda:1") or without one (each torchrun process takes its local
    rank's); docs/devices.md."""
    attention_backend: Literal["auto", "cudnn", "flash", "efficient", "math"] = "auto"
    """The SDPA kernel attention runs (torch.nn.attention.sdpa_kernel, forward and backward):
    "auto" = torch's choice (cuDNN first on Hopper and Blackwell with torch 2.13's CUDA 13 wheels,
    unless TORCH_CUDNN_SDPA_DEPRIORITIZED=1); "cudnn" (cuDNN's fused attention),
    "flash", "efficient" (memory-efficient) or "math" (the reference) only, where the device has
    it (CUDA: all four; CPU: flash and math; docs/devices.md). FlexAttention (document masking on
    CUDA) is not SDPA and ignores it."""
    run_dir: str = ""
    """Where the run writes its config, metrics and checkpoints; "" = runs/<preset or config name>."""
    log_every: int = 10
    """Optimizer steps per log record (console, metrics.jsonl, TensorBoard, W&B)."""
    peak_tflops: float = 0.0
    """The MFU denominator per device; 0 = the accelerator table, or the CPU formula (docs/training.md)."""
    price_per_node_hour: float = 0.0
    """> 0: each record carries the cost so far and per million tokens (nodes = world / ranks per node)."""
    tensorboard: bool = True
    """Write the metrics as TensorBoard events under <run_dir>/tensorboard."""
    plot: bool = True
    """Draw loss.png at the end of a run (matplotlib; about a second)."""
    sample_prompt: str = "auto"
    """The run ends by printing the model's greedy continuation of this prompt: "auto" = the first
    line of the training data's first document; "" = no sample."""
    sample_tokens: int = 32
    """Tokens the end-of-run sample generates."""
    slow_rank_threshold: float = 0.1
    """Multi-process CPU runs: name a rank whose compute per step stays this fraction above the
    median rank's (a rolling score) for slow_rank_windows log windows in a row (docs/operations.md)."""
    slow_rank_windows: int = 3
    """Log windows in a row a rank must stay over slow_rank_threshold to be named."""
    interrupt_save_s: float = 25.0
    """On SIGINT, SIGTERM or SIGHUP (Ctrl-C, a preemption, a closed terminal) the run stops after the current step and saves its
    checkpoint, if that is done within this many seconds of the signal; else, or on a second signal,
    it stops at once without saving, and a resume starts from the newest checkpoint. 0 = stop at once.
    Keep it under the launcher's grace period (torchrun --shutdown_timeout, SLURM's KillWait: 30 s)."""
    callbacks: list[str] = field(default_factory=list)
    """Your own callbacks, each "package.module:ClassName" naming a subclass of
    hlat.train.callbacks.base.Callback (docs/training.md); checked when the trainer starts.
    A config file that sets this names code that runs when you train with it: read a config
    someone else handed you before training with it. Modules are imported from PYTHONPATH and
    installed packages, never from the working directory alone (also under `python -m hlat`)."""

    def validate(self) -> list[tuple[str, str]]:
        problems = []
        for name in ("steps", "global_batch", "micro_batch", "log_every", "sample_tokens", "slow_rank_windows"):
            if getattr(self, name) < 1:
                problems.append((name, f"must be >= 1, got {getattr(self, name)}"))
        if self.micro_batch >= 1 and self.global_batch % self.micro_batch:
            problems.append(
                (
                    "global_batch",
                    f"{self.global_batch} is not divisible by train.micro_batch={self.micro_batch}; make the global batch a multiple of the micro batch",
                )
            )
        device = device_name_problem(self.device)
        if device:
            problems.append(("device", device))
        problems += choice_problems(self, "attention_backend")
        if self.slow_rank_threshold <= 0:
            problems.append(
                (
                    "slow_rank_threshold",
                    f"must be > 0 (a fraction of the median rank's compute time, e.g. 0.1), "
                    f"got {self.slow_rank_threshold}",
                )
            )
        if self.interrupt_save_s < 0:
            problems.append(
                ("interrupt_save_s", f"must be >= 0 seconds (0 = stop at once), got {self.interrupt_save_s}")
            )
        if self.replay_every < 0:
            problems.append(("replay_every", f"must be >= 0 (0 = off), got {self.replay_every}"))
        if self.peak_tflops < 0:
            problems.append(("peak_tflops", f"must be >= 0 (0 = automatic), got {self.peak_tflops}"))
        if self.price_per_node_hour < 0:
            problems.append(
                ("price_per_node_hour", f"must be >= 0 (0 = no cost in the log), got {self.price_per_node_hour}")
            )
        return problems
