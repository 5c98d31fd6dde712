"""The default path (`hlat train`, tiny preset, embedded corpus, compile auto: compiled here)
reproduces the golden loss trajectory of golden_tiny.json step by step, within the file's `rtol`
(its `rtol_reason` says why), and compiled training agrees with eager step by step (losses,
gradient and parameter norms); the golden file's first steps also equal an independent
reference: transformers' LlamaForCausalLM and torch's AdamW on the same weights and batches.

After a deliberate change of a default, regenerate the file: python tests/train/golden.py
"""

import json
from pathlib import Path

import pytest
import torch._dynamo.config

from deps import require
from golden import GOLDEN, OVERRIDES, command, default_run
from hlat.config.load import load_config
from hlat.metrics.sinks import read_metrics
from hlat.model.hf import hf_config_dict, hlat_to_hf
from hlat.train.trainer import Trainer

EAGER_STEPS = 3  # eager steps cost ~1 s each here; the compiled run's first ones are compared
REFERENCE_STEPS = 4  # the independent reference's steps (eager, ~1 s each)
REFERENCE_RTOL = 1e-6  # measured 0: bit-identical to the golden losses on this machine
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


def test_golden_losses_follow_an_independent_reference(tmp_path):
    """The golden file is made by the code under test; its first steps are checked here against the
    same model, initial weights and batches trained by transformers' LlamaForCausalLM and
    torch.optim.AdamW (hlat's schedule, decay groups and clipping written out from the config)."""
    transformers = require("transformers")
    trainer = Trainer(
        load_config(None, None, [*OVERRIDES, "--train.run_dir", str(tmp_path), "--parallel.compile", "false"]),
        resume="fresh",
        out=lambda _: None,
    )
    cfg = trainer.cfg
    init = {k: v.detach().clone() for k, v in trainer.model.raw_parts[0].state_dict().items()}
    batches = [trainer.loader.next_batch() for _ in range(REFERENCE_STEPS)]
    trainer.loader.close()
    hf_cfg = transformers.LlamaConfig(**hf_config_dict(cfg.model))
    hf_cfg._attn_implementation = "sdpa"
    model = transformers.LlamaForCausalLM(hf_cfg)
    model.load_state_dict(hlat_to_hf(init), strict=False)
    named = list(model.named_parameters())
    # decay the matrices but the input embedding (optim.weight_decay_scope = "matrices")
    no_decay = [p for n, p in named if p.ndim < 2 or n == "model.embed_tokens.weight"]
    decay = [p for n, p in named if not (p.ndim < 2 or n == "model.embed_tokens.weight")]
    optim = cfg.optim
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=optim.lr,
        betas=(optim.beta1, optim.beta2),
        eps=optim.eps,
    )
    warmup = cfg.schedule.warmup_steps
    assert REFERENCE_STEPS <= warmup  # the schedule is its linear warmup here, step 1 at peak / warmup
    losses = []
    for step, batch in enumerate(batches):
        for group in opt.param_groups:
            group["lr"] = optim.lr * (step + 1) / warmup
        logits = model(input_ids=batch.tokens).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=-100)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), optim.grad_clip)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    golden = json.loads(GOLDEN.read_text())["losses"][:REFERENCE_STEPS]
    assert losses == pytest.approx(golden, rel=REFERENCE_RTOL)
