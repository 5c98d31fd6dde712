"""`hlat train --optim.name muon` trains the same weights on every kind of layout, 4 steps of the
tiny model: TP, PP and CP what one process trains; FSDP2, ZeRO-1, ZeRO-2, FSDP2 x TP (strided
shards) and HSDP (2 replicas of 1 shard) what DDP trains at the same dp (it reads the same data, and
orthogonalises whole matrices as one process does, each rank its share, broadcast); and a
checkpoint of FSDP2 resumes under ZeRO-1 (momentum resharded from shards of every matrix to whole
matrices per rank), continuing the FSDP2 run. Newton-Schulz runs in fp32 so that layouts differ by
fp32 rounding only."""

import pytest
import torch

from hlat.checkpoint.manager import CheckpointManager
from runs import Scenario, ScenarioResults, assert_weights_match, checkpoint_tensors

TRAIN = "train/layout_runs.py:train"
MUON = ["--optim.name", "muon", "--optim.muon_ns_dtype", "float32", "--checkpoint.every", "2"]
BF16_SR = ["--precision.mode", "bf16-sr"]
DETERMINISTIC = ["--train.deterministic", "true", "--parallel.compile", "false"]
DET_LAYOUTS = {"dp1": (1, []), "ddp2": (2, []), "fsdp2": (2, ["--parallel.dp_sharding", "fsdp"])}
LAYOUTS = {  # name: (processes, flags, the run it must equal)
    "tp2": (2, ["--parallel.tp", "2"], "one"),
    "pp2": (2, ["--parallel.pp", "2"], "one"),
    "cp2": (2, ["--parallel.cp", "2"], "one"),
    "fsdp2": (2, ["--parallel.dp_sharding", "fsdp"], "ddp2"),
    "zero1": (2, ["--parallel.dp_sharding", "zero1"], "ddp2"),
    "zero2": (2, ["--parallel.dp_sharding", "zero2"], "ddp2"),
    "fsdp2xtp2": (4, ["--parallel.tp", "2", "--parallel.dp_sharding", "fsdp"], "ddp2"),
    "hsdp2x1": (2, ["--parallel.dp_sharding", "fsdp", "--parallel.dp_shard", "1"], "ddp2"),  # 2 replicas
}
SCENARIOS = [
    Scenario("muon-one", TRAIN, 1, {"steps": 4, "extra": MUON}),
    Scenario("muon-ddp2", TRAIN, 2, {"steps": 4, "extra": MUON}),
    *(
        Scenario(f"muon-{name}", TRAIN, n, {"steps": 4, "extra": [*MUON, *flags]})
        for name, (n, flags, _) in LAYOUTS.items()
    ),
    Scenario("muon-bf16sr-fsdp2", TRAIN, 2, {"steps": 4, "extra": [*MUON, *BF16_SR, *LAYOUTS["fsdp2"][1]]}),
    *(
        Scenario(f"muon-det-{name}", TRAIN, n, {"steps": 4, "extra": [*MUON, *DETERMINISTIC, *flags]})
        for name, (n, flags) in DET_LAYOUTS.items()
    ),
    Scenario("muon-fsdp2-first", TRAIN, 2, {"steps": 2, "extra": [*MUON, *LAYOUTS["fsdp2"][1]]}),
    Scenario(
        "muon-fsdp2-resumed-at-zero1",
        TRAIN,
        2,
        {"steps": 4, "extra": [*MUON, *LAYOUTS["zero1"][1]], "resume": "require", "start_from": "muon-fsdp2-first"},
    ),
]


def final_state(scenarios: ScenarioResults, name: str, scratch) -> dict:
    path = CheckpointManager(scenarios.path(name) / "run" / "checkpoints", None).latest()
    assert path is not None and path.name == "step_00000004", path
    return checkpoint_tensors(path, scratch)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_muon_trains_the_same_weights_in_every_layout(scenarios: ScenarioResults, tmp_path, layout: str):
    reference = f"muon-{LAYOUTS[layout][2]}"
    want, got = (scenarios.json(name, "summary.rank0.json") for name in (reference, f"muon-{layout}"))
    assert got["losses"] == pytest.approx(want["losses"], rel=1e-5)
    want_state, state = final_state(scenarios, reference, tmp_path), final_state(scenarios, f"muon-{layout}", tmp_path)
    assert any(k.endswith(".momentum_buffer") for k in want_state) and any(k.endswith(".exp_avg") for k in want_state)
    assert_weights_match(state, want_state)


def test_muon_checkpoint_resumes_in_another_layout(scenarios: ScenarioResults, tmp_path):
    straight, first, resumed = (
        scenarios.json(name, "summary.rank0.json")
        for name in ("muon-fsdp2", "muon-fsdp2-first", "muon-fsdp2-resumed-at-zero1")
    )
    assert any("resuming from" in m and "step_00000002" in m for m in resumed["messages"]), resumed["messages"]
    assert first["losses"] + resumed["losses"] == pytest.approx(straight["losses"], rel=1e-5)
    assert_weights_match(
        final_state(scenarios, "muon-fsdp2-resumed-at-zero1", tmp_path), final_state(scenarios, "muon-fsdp2", tmp_path)
    )


def test_muon_trains_hlats_bf16_weights_with_stochastic_rounding(scenarios: ScenarioResults, tmp_path):
    """bf16-sr under FSDP2: weights and Muon's momentum stay bf16, and the losses follow fp32's."""
    fp32, bf16 = (scenarios.json(name, "summary.rank0.json")["losses"] for name in ("muon-fsdp2", "muon-bf16sr-fsdp2"))
    assert bf16 == pytest.approx(fp32, rel=0.02)
    state = final_state(scenarios, "muon-bf16sr-fsdp2", tmp_path)
    assert {v.dtype for k, v in state.items() if k.startswith("model.")} == {torch.bfloat16}
    assert {v.dtype for k, v in state.items() if k.endswith(".momentum_buffer")} == {torch.bfloat16}


def test_muon_keeps_the_deterministic_modes_bits_over_dp(scenarios: ScenarioResults, tmp_path):
    """train.deterministic with Muon: dp 1, DDP (each rank orthogonalising its share) and FSDP2
    (stacks shared out) save the same bits: the mode's sums give every layout the same gradients,
    and a matrix's Newton-Schulz is the same on whichever rank runs it."""
    digests = {}
    for name in DET_LAYOUTS:
        state = final_state(scenarios, f"muon-det-{name}", tmp_path)
        digests[name] = {k: v.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() for k, v in state.items()}
    assert any(k.endswith(".momentum_buffer") for k in digests["dp1"])
    for name in ("ddp2", "fsdp2"):
        assert [k for k in digests["dp1"] if digests[name].get(k) != digests["dp1"][k]] == [], name
    one, *others = (scenarios.json(f"muon-det-{name}", "summary.rank0.json")["losses"] for name in DET_LAYOUTS)
    assert all(losses == one for losses in others)
