"""The offline GPU install of docs/parallelism.md lists exactly what the training path imports."""

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINE = "Run-time imports of the training path"


def documented() -> list[str]:
    (line,) = [ln for ln in (ROOT / "docs" / "parallelism.md").read_text().splitlines() if ln.startswith(LINE)]
    return sorted(re.findall(r"`([a-z_]+)`", line.split(":", 1)[1]))


def test_the_documented_list_is_what_training_imports(tmp_path: Path) -> None:
    """A tiny `hlat train` (with its default loss plot and TensorBoard events, a checkpoint) in a
    fresh interpreter, recording each import statement hlat's own modules run; ZeRO-1's module is
    not among what it loads (hlat.train.optimizers.zero1_optimizer)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "project" / "training_imports.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["exit_code"] == 0
    assert result["imported"] == documented()
    assert not result["zero1"], "a run without ZeRO-1 imported torch.distributed.optim (0.3 CPU-s of TorchScript)"
