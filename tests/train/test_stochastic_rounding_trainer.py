"""bf16-sr rounds each weight update stochastically as a user's run does it, through the Trainer:
updates well under half a bf16 ulp move the weights in expectation under bf16-sr, and never under
bf16 (round to nearest). A trainer that rounded to nearest everywhere (e.g. by taking every device
for one that rounds in hardware) fails here, though it passes every loss-based test."""

from __future__ import annotations

import pytest
import torch

from device import simulated_device
from hlat.train.trainer import Trainer
from test_trainer import quiet, tiny_cfg

# at import, before any test of the session runs a backward: torch's autograd engine sizes its
# per-device queues at a process's first backward, and a device registered later cannot run one
simulated_device.register()

# AdamW moves each weight by at most ~1.5 lr a step in its first steps; weights of magnitude at
# least 2^-7 have a bf16 ulp of at least 2^-14 (6.1e-5), so their update is under a sixth of an ulp:
# round to nearest keeps every one, stochastic rounding moves a few percent of them a step, by one
# ulp in the update's direction (smaller weights, whose ulp is finer, are left out of the count)
LR = 5e-6
LARGE = 2.0**-7
STEPS = 2


def _matrices(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {
        name: p.detach().float().clone()
        for name, p in trainer.model.parts[0].named_parameters()
        if p.ndim == 2 and "layers." in name
    }


def _large(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: w.abs() >= LARGE for name, w in weights.items()}


def _train(corpus, tmp_path, mode: str, device: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:  # type: ignore[no-untyped-def]
    cfg = tiny_cfg(
        corpus, tmp_path / mode, "--precision.mode", mode, "--train.device", device, "--precision.compile_optimizer", "false",
        "--optim.lr", str(LR), "--optim.weight_decay", "0", "--schedule.name", "constant",
        "--schedule.warmup_steps", "0", "--train.steps", str(STEPS), "--checkpoint.every", str(STEPS),
    )  # fmt: skip
    with simulated_device.present():
        trainer = Trainer(cfg, resume="fresh", out=quiet)
        before = _matrices(trainer)
        trainer.fit()
        return before, _matrices(trainer)


def test_updates_under_half_an_ulp_move_weights_only_under_stochastic_rounding(small_corpus, tmp_path):
    before, after = _train(small_corpus, tmp_path, "bf16", "cpu")
    large = _large(before)
    assert all(torch.equal(before[k][large[k]], after[k][large[k]]) for k in before)  # nearest: all lost

    before, after = _train(small_corpus, tmp_path, "bf16-sr", "cpu")
    reference_before, reference_after = _train(small_corpus, tmp_path, "fp32", "cpu")
    moved = changed = agreeing = 0
    for name, mask in _large(before).items():
        delta = (after[name] - before[name])[mask]
        direction = (reference_after[name] - reference_before[name])[mask]  # the fp32 run's update, same data
        hit = delta != 0
        moved += int(hit.sum())
        changed += delta.numel()
        agreeing += int((torch.sign(delta[hit]) == torch.sign(direction[hit])).sum())
    assert moved / changed > 0.05, f"only {moved} of {changed} weights moved under bf16-sr"
    assert agreeing / moved > 0.9, f"{agreeing} of {moved} moved weights went the fp32 update's way"


def test_the_simulated_accelerator_rounds_stochastically_too(small_corpus, tmp_path):
    """The same bound on a device that is not the CPU (its rounding chosen by its device record)."""
    before, after = _train(small_corpus, tmp_path, "bf16-sr", simulated_device.TYPE)
    moved = sum(int((after[k] != before[k])[m].sum()) for k, m in _large(before).items())
    total = sum(int(m.sum()) for m in _large(before).values())
    assert moved / total > 0.05, f"only {moved} of {total} weights moved under bf16-sr"


@pytest.fixture(autouse=True)
def _same_init() -> None:
    torch.manual_seed(0)
