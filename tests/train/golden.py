"""The golden loss trajectory of the default path: `hlat train` with the tiny preset's defaults on
the embedded corpus (compile auto: compiled on CPU), shortened to a few steps. test_golden.py
checks that the default path still reproduces golden_tiny.json; a deliberate change of a default
(model, data, tokenizer, optimizer, schedule, compile) changes the losses, so regenerate the file
and let the diff show in review:

    python tests/train/golden.py            # rewrites tests/train/golden_tiny.json (~2 min on 2 cores)

It also runs the same steps eager and records the largest eager-vs-compiled difference it saw,
which the tolerance must exceed with a margin.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import torch

from hlat.config.load import load_config
from hlat.train.trainer import Trainer

GOLDEN = Path(__file__).with_name("golden_tiny.json")
OVERRIDES = [
    "--train.steps", "8", "--train.log_every", "1", "--eval.every", "0", "--train.plot", "false",
    "--train.tensorboard", "false",
]  # fmt: skip


def command(run_dir: str = "RUN_DIR") -> str:
    return " ".join(["hlat", "train", "--fresh", *OVERRIDES, "--train.run_dir", run_dir])


def default_run(run_dir: Path, *extra: str) -> tuple[list[float], list[str]]:
    """What `hlat train --fresh OVERRIDES EXTRA` does, in this process: (per-step losses, printed lines)."""
    lines: list[str] = []
    cfg = load_config(None, None, [*OVERRIDES, "--train.run_dir", str(run_dir), *extra])
    return Trainer(cfg, resume="fresh", out=lines.append).fit().losses, lines


def relative_difference(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))


def regenerate() -> None:
    if torch._dynamo.config.disable:
        sys.exit("TORCH_COMPILE_DISABLE is set: the golden file records the compiled default path; unset it")
    with tempfile.TemporaryDirectory() as tmp:
        compiled, lines = default_run(Path(tmp) / "compiled")
        eager, _ = default_run(Path(tmp) / "eager", "--parallel.compile", "false")
    old = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}
    record = {
        "command": command(),
        "compile": next(line for line in lines if line.startswith("compile:")),
        "torch": torch.__version__,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "losses": compiled,
        "eager_losses": eager,
        "eager_vs_compiled_rel": relative_difference(compiled, eager),
        "rtol": old.get("rtol", 1e-4),
        "rtol_reason": old.get(
            "rtol_reason",
            "compiled vs eager and CPU kinds differ by rounding only; set with a margin over what was measured",
        ),
    }
    GOLDEN.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {GOLDEN}: eager vs compiled at most {record['eager_vs_compiled_rel']:.2e} relative")


if __name__ == "__main__":
    regenerate()
