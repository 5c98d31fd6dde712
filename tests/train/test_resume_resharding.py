"""A checkpoint saved in one layout resumes in another with identical model and optimizer state.

TP 2 x DP 2 (zero2) on 4 gloo processes -> HSDP (fsdp over DP 4: 2 replicas x 2 shards) -> one
process; TP 2 x DP 2 -> one process -> TP 2 x DP 2 again; and ZeRO-1 on 2 processes -> one process
-> ZeRO-1; and tied embeddings under PP 2 (the first and last stages each hold a copy) -> one
process -> PP 2: each resumed run saves again at once, and every tensor of the two checkpoints
(weights, Adam moments, step counts) is bit-identical. The TP 2 chain's vocabulary (511) is
sharded unevenly (256 + 255 rows). The data position is merged over the saved ranks and dealt to
the new ones. All of it runs as scenarios of the shared launch (tests/runs.py), 2 steps of the
tiny model each.
"""

from pathlib import Path

import pytest

from hlat.checkpoint.manager import CheckpointManager
from runs import Scenario, ScenarioResults, assert_same_tensors, checkpoint_tensors

TRAIN = "train/layout_runs.py:train"
ODD = ["--model.vocab_size", "511"]
TP2_DP2 = ["--parallel.tp", "2", "--parallel.dp_sharding", "zero2", *ODD]
ZERO1 = ["--parallel.dp_sharding", "zero1"]
HSDP = ["--parallel.dp_sharding", "fsdp", "--parallel.dp_shard", "2", *ODD]
TIED = ["--model.tie_embeddings", "true"]
PP2_TIED = ["--parallel.pp", "2", *TIED]
SAVED = "reshard-tp2xdp2"


def resave(name: str, world: int, start_from: str, layout: list[str]) -> Scenario:
    return Scenario(
        name,
        TRAIN,
        world,
        {"steps": 2, "extra": layout, "resume": "require", "start_from": start_from, "save_only": True},
    )


SCENARIOS = [
    Scenario(SAVED, TRAIN, 4, {"steps": 2, "extra": TP2_DP2}),
    resave("reshard-hsdp", 4, SAVED, HSDP),  # DP 4 under fsdp, sharded over 2 of the 4
    resave("reshard-hsdp-single", 1, "reshard-hsdp", ODD),
    resave("reshard-single", 1, SAVED, ODD),
    resave("reshard-back", 4, "reshard-single", TP2_DP2),
    Scenario("reshard-back-trains", TRAIN, 4, {"steps": 3, "extra": TP2_DP2, "start_from": "reshard-back"}),
    Scenario("zero1", TRAIN, 2, {"steps": 2, "extra": ZERO1}),
    resave("zero1-single", 1, "zero1", []),
    resave("zero1-back", 2, "zero1-single", ZERO1),
    Scenario("tied-pp2", TRAIN, 2, {"steps": 2, "extra": PP2_TIED}),
    resave("tied-pp2-single", 1, "tied-pp2", TIED),
    resave("tied-pp2-back", 2, "tied-pp2-single", PP2_TIED),
]


def tensors(scenarios: ScenarioResults, name: str, scratch: Path):
    return checkpoint_tensors(CheckpointManager(scenarios.path(name) / "run" / "checkpoints", None).latest(), scratch)


def resharded(scenarios: ScenarioResults, name: str) -> bool:
    return any("resharded from" in m for m in scenarios.json(name, "summary.rank0.json")["messages"])


@pytest.mark.parametrize(
    "saved, resumed",
    [
        (SAVED, ["reshard-hsdp", "reshard-hsdp-single", "reshard-single", "reshard-back"]),
        ("zero1", ["zero1-single", "zero1-back"]),
        ("tied-pp2", ["tied-pp2-single", "tied-pp2-back"]),
    ],
    ids=["tp2xdp2-hsdp-single", "zero1-single", "tied-pp2-single"],
)
def test_resharded_checkpoints_are_identical(scenarios, tmp_path, saved, resumed):
    reference = tensors(scenarios, saved, tmp_path)
    assert any(".exp_avg_sq" in k for k in reference) and any(k.startswith("model.") for k in reference)
    if saved == "tied-pp2":  # both stages' copies saved as one tensor, with one set of Adam moments
        assert "model.tok_embeddings.weight" in reference and not any("output.weight" in k for k in reference)
    for name in resumed:
        assert resharded(scenarios, name), name
        assert_same_tensors(tensors(scenarios, name, tmp_path), reference)


def test_merged_data_position_and_training_goes_on(scenarios):
    # the 2 saved dp ranks' tokens, now read by one rank
    assert sum(scenarios.json("reshard-single", "summary.rank0.json")["tokens_emitted"]) == 2 * 8 * 32
    trained = scenarios.json("reshard-back-trains", "summary.rank0.json")
    assert trained["step"] == 3 and len(trained["losses"]) == 1
