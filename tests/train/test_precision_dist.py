"""bf16-sr (bf16 weights, grads and Adam state, stochastic rounding) under torchrun: DDP, ZeRO-1,
FSDP2 (dp 2) and tensor parallel 2 on gloo, and an exact resume under FSDP2.

Every layout runs in one scenario of the shared launch (precision_dist_worker.py, tests/runs.py);
the FSDP2 runs use the compiled optimizer update on sharded parameters, the others its eager twin.
"""

import json
import math

import pytest

from runs import Scenario, ScenarioResults

LAYOUTS = ("ddp", "zero1", "fsdp", "tp2")
SCENARIOS = [Scenario("precision-dist", "train/precision_dist_worker.py:layouts", 2)]


@pytest.fixture(scope="module")
def results(scenarios: ScenarioResults):
    out = scenarios.path("precision-dist")

    def read(name: str, rank: int = 0) -> dict:
        return json.loads((out / f"{name}.rank{rank}.json").read_text())

    return read


@pytest.mark.parametrize("layout", LAYOUTS)
def test_bf16_sr_trains_under_layout(results, layout):
    for rank in (0, 1):
        run = results(layout, rank)
        assert run["step"] == 6
        # Weights and the Adam moments stay bf16 on every rank's shard (gradients are freed after the step).
        assert run["params"] == ["torch.bfloat16"] and run["optim_state"] == ["torch.bfloat16"]
    losses = results(layout)["losses"]
    assert len(losses) == 6 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] - 0.3, losses  # lr 1e-2 from ln(512) = 6.24: clearly learning
    assert sum(losses[3:]) < sum(losses[:3]), losses


def test_replicas_stay_identical_and_zero1_shards_the_state(results):
    # DDP and ZeRO-1 replicas draw the same rounding noise, so they never drift apart.
    for layout in ("ddp", "zero1"):
        assert results(layout, 0)["digest"] == results(layout, 1)["digest"], layout
    assert results("fsdp", 0)["digest"] != results("fsdp", 1)["digest"]  # FSDP2: each rank its own shard
    assert results("zero1", 0)["n_state"][0] < results("ddp", 0)["n_state"][0]  # ZeRO-1: each rank a partition


def test_tied_copies_round_alike_under_pp(results):
    # PP 2 with tied embeddings: stage 0 (rank 0) and the last stage (rank 1) each hold the matrix and
    # update it with their own optimizer; the same summed gradient and rounding noise keyed by the
    # shared name keep the two copies bit-identical (keyed by position they drift apart in 3 steps).
    assert results("pp2-tied", 0)["tied_digest"] == results("pp2-tied", 1)["tied_digest"]


def test_dp_layouts_agree(results):
    # Same model, data and global batch: DDP, ZeRO-1 and FSDP2 start identically and stay close
    # (reduction order differs, so later steps agree only approximately).
    first = {layout: results(layout)["losses"] for layout in ("ddp", "zero1", "fsdp")}
    assert first["ddp"][:2] == first["zero1"][:2] == first["fsdp"][:2]
    for layout in ("zero1", "fsdp"):
        assert first[layout][-1] == pytest.approx(first["ddp"][-1], abs=0.02)


def test_fsdp_resume_is_exact(results):
    straight = results("straight")["losses"]
    assert results("second")["step"] == 4
    resumed = results("first")["losses"] + results("second")["losses"]
    assert resumed == straight  # bit-identical: weights, moments, step counts and noise seed all restored
