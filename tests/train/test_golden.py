"""The default path (`hlat train`, tiny preset, embedded corpus, compile auto: compiled here)
reproduces the golden loss trajectory of golden_tiny.json step by step, within the file's `rtol`
(its `rtol_reason` says why), and compiled training agrees with eager step by step (losses,
gradient and parameter norms).

After a deliberate change of a default, regenerate the file: python tests/train/golden.py
"""

import json
from pathlib import Path

import pytest
import torch._dynamo.config

from golden import GOLDEN, command, default_run
from hlat.train.sinks import read_metrics

EAGER_STEPS = 3  # eager steps cost ~1 s each here; the compiled run's first ones are compared
EAGER_RTOL = 1e-6  # measured 0 here; >10x the 6.1e-8 that other CPU kernels moved the losses by


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The default path's 8 compiled steps: (losses, printed lines, run directory). Compiling costs
    ~10-25 s cold."""
    run = tmp_path_factory.mktemp("golden") / "compiled"
    with torch._dynamo.config.patch(disable=False):
        yield (*default_run(run), run)


def test_default_path_reproduces_golden_losses(compiled):
    golden = json.loads(GOLDEN.read_text())
    losses, lines, _ = compiled
    assert any(line.startswith("compile: on (inductor") for line in lines), lines
    assert golden["command"] == command()
    assert losses == pytest.approx(golden["losses"], rel=golden["rtol"]), (
        f"the default path's losses moved from {GOLDEN.name} (made by: {golden['command']}); if a default changed "
        "on purpose, regenerate it: python tests/train/golden.py"
    )


def _trajectory(run: Path, steps: int) -> list[tuple[float, float, float]]:
    """(loss, pre-clip gradient norm, parameter norm) of the first `steps` steps."""
    records = [r for r in read_metrics(run) if "loss" in r][:steps]
    assert len(records) == steps
    return [(r["loss"], r["grad_norm"], r["param_norm"]) for r in records]


def test_compiled_matches_eager_step_by_step(compiled, tmp_path):
    """Inductor fuses the blocks' elementwise ops and reductions (RMSNorm, RoPE, SwiGLU): rounding
    differences only. A block's output moves by ~2e-7; over the golden steps the fp32 losses were
    bit-identical (golden_tiny.json: eager_vs_compiled_rel; other CPU kernels moved them by
    6.1e-8), so losses, gradient norms and parameter norms are held to EAGER_RTOL, not the golden rtol."""
    eager, lines = default_run(tmp_path / "eager", "--parallel.compile", "false", "--train.steps", str(EAGER_STEPS))
    assert "compile: off (parallel.compile false)" in lines
    assert eager == pytest.approx(compiled[0][:EAGER_STEPS], rel=EAGER_RTOL)
    for step, (e, c) in enumerate(
        zip(_trajectory(tmp_path / "eager", EAGER_STEPS), _trajectory(compiled[2], EAGER_STEPS))
    ):
        assert e == pytest.approx(c, rel=EAGER_RTOL), (
            f"step {step + 1}: eager (loss, grad norm, param norm) {e}, compiled {c}"
        )
