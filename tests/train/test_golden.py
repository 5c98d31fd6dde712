"""The default path (`hlat train`, tiny preset, embedded corpus, compile auto: compiled here)
reproduces the golden loss trajectory of golden_tiny.json step by step, within the file's `rtol`
(its `rtol_reason` says why), and compiled training agrees with eager step by step.

After a deliberate change of a default, regenerate the file: python tests/train/golden.py
"""

import json

import pytest
import torch._dynamo.config

from golden import GOLDEN, command, default_run

EAGER_STEPS = 3  # eager steps cost ~1 s each here; the compiled run's first ones are compared


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The default path's 8 compiled steps: (losses, printed lines). Compiling costs ~10-25 s cold."""
    with torch._dynamo.config.patch(disable=False):
        yield default_run(tmp_path_factory.mktemp("golden") / "compiled")


def test_default_path_reproduces_golden_losses(compiled):
    golden = json.loads(GOLDEN.read_text())
    losses, lines = compiled
    assert any(line.startswith("compile: on (inductor") for line in lines), lines
    assert golden["command"] == command()
    assert losses == pytest.approx(golden["losses"], rel=golden["rtol"]), (
        f"the default path's losses moved from {GOLDEN.name} (made by: {golden['command']}); if a default changed "
        "on purpose, regenerate it: python tests/train/golden.py"
    )


def test_compiled_matches_eager_step_by_step(compiled, tmp_path):
    """Inductor fuses the blocks' elementwise ops and reductions (RMSNorm, RoPE, SwiGLU): rounding
    differences only. A block's output moves by ~2e-7; over the golden steps the fp32 losses were
    bit-identical (golden_tiny.json: eager_vs_compiled_rel). Checked at the golden file's rtol."""
    eager, lines = default_run(tmp_path / "eager", "--parallel.compile", "false", "--train.steps", str(EAGER_STEPS))
    assert "compile: off (parallel.compile false)" in lines
    assert eager == pytest.approx(compiled[0][:EAGER_STEPS], rel=json.loads(GOLDEN.read_text())["rtol"])
