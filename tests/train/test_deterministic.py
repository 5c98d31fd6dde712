"""train.deterministic: the same bits for every data-parallel arrangement of one run.

Six arrangements of the tiny model's run (8 steps, global batch 8 in micro-batches of 2: 4 data
shares) end with equal SHA-256 digests of every saved tensor (model and optimizer), the same
loader state and the same logged losses: dp 1 on two intra-op threads (accumulating 4 micro-batches),
dp 2 under DDP, ZeRO-1 and FSDP2 (2 each), dp 4 under ZeRO-2 and HSDP (2 replicas x 2 shards: 1
each), and FSDP2 on dp 2 to step 4 resumed as ZeRO-1 on dp 4 to step 8. Without the mode, dp 1 and
FSDP2 on dp 2 differ from the first step. bf16-sr on dp 1 and FSDP2 on dp 2 agree too (4 steps).
With tensor parallelism 2 held fixed, tp 2 alone and ZeRO-2 and FSDP2 over dp 2 agree the same way;
with context parallelism 2, cp 2 alone (replicated and FSDP2) and DDP and FSDP2 over dp 2 (4 steps);
with pipeline parallelism 2, pp 2 alone and ZeRO-2 and FSDP2 over dp 2 (4 steps). Three elastic
groups, one killed and restarted, save dp 1's bits.
Planted bugs this catches (each tried on the code):
the slot order reversed (rank r computing micro-batch r*accum + t), the cross-rank tree replaced
by a plain all-reduce, and the fp64 norm replaced by the default one. Replay: see its test.
"""

import hashlib
import json
import re
import socket

import pytest
import torch

from hlat.cli import _report
from hlat.config.load import load_config
from hlat.errors import ConfigError
from hlat.train.deterministic import fix_numerics
from hlat.train.replay import WrongComputation
from hlat.train.trainer import Trainer
from runs import Scenario, ScenarioResults, checkpoint_tensors, tiny_args

STEPS, MIDDLE = 8, 4
TRAIN, THREADS = "train/layout_runs.py:train", "train/deterministic_runs.py:train_with_threads"
EXPECTING = "train/deterministic_runs.py:train_expecting_wrong_computation"
ON = ["--train.deterministic", "true", "--parallel.compile", "false"]
FSDP, ZERO1, ZERO2 = (["--parallel.dp_sharding", s] for s in ("fsdp", "zero1", "zero2"))
ARRANGEMENTS = {  # name: (world, extra)
    "det-dp1": (1, []),
    "det-dp2-ddp": (2, []),
    "det-dp2-zero1": (2, ZERO1),
    "det-dp2-fsdp": (2, FSDP),
    "det-dp4-zero2": (4, ZERO2),
    "det-dp4-hsdp": (4, [*FSDP, "--parallel.dp_shard", "2"]),
}
BF16_SR = ["--precision.mode", "bf16-sr"]
TP_ARRANGEMENTS = {"det-tp2": (2, ZERO2), "det-tp2-dp2-zero2": (4, ZERO2), "det-tp2-dp2-fsdp": (4, FSDP)}
CP_STEPS, CP = 4, ["--parallel.cp", "2"]
PP = ["--parallel.pp", "2"]
PP_ARRANGEMENTS = {"det-pp2": (2, []), "det-pp2-dp2-zero2": (4, ZERO2), "det-pp2-dp2-fsdp": (4, FSDP)}
ELASTIC, REPLAY_GROUPS = "det-elastic-killed-restarted", "replay-elastic-groups"
ELASTIC_GROUPS = [
    "--elastic.enabled", "true", "--elastic.lighthouse", "localhost:1", "--elastic.group", "0",
    "--elastic.trusted_network", "true", "--elastic.max_groups",
]  # fmt: skip
CP_ARRANGEMENTS = {"det-cp2": (2, []), "det-cp2-fsdp": (2, FSDP), "det-cp2-dp2": (4, []), "det-cp2-dp2-fsdp": (4, FSDP)}
SCENARIOS = [
    Scenario("det-dp1", THREADS, 1, {"threads": 2, "steps": STEPS, "extra": ON}),
    *(
        Scenario(name, TRAIN, world, {"steps": STEPS, "extra": [*ON, *extra]})
        for name, (world, extra) in ARRANGEMENTS.items()
        if name != "det-dp1"
    ),
    Scenario("det-dp2-fsdp-first", TRAIN, 2, {"steps": MIDDLE, "extra": [*ON, *FSDP]}),
    Scenario(
        "det-dp4-zero1-resumed",
        TRAIN,
        4,
        {"steps": STEPS, "extra": [*ON, *ZERO1], "resume": "require", "start_from": "det-dp2-fsdp-first"},
    ),
    # replay: every step on 4 FSDP2 ranks with nothing wrong (each pair checked at least once), and a
    # bit flipped in rank 2's matmul at step 2 on DDP ranks (4 and 2), replay every 2 steps
    Scenario("replay-clean", TRAIN, 4, {"steps": 4, "extra": [*ON, *FSDP, "--train.replay_every", "1"]}),
    *(
        Scenario(
            f"replay-flip-{world}",
            EXPECTING,
            world,
            {"steps": 4, "extra": [*ON, "--train.replay_every", "2"], "env": {"HLAT_FAULT": f"flip:2:{world - 1}"}},
        )
        for world in (4, 2)
    ),
    # a fixed tensor-parallel degree: tp 2 alone, and under ZeRO-2 and FSDP2 over dp 2
    *(
        Scenario(name, TRAIN, world, {"steps": STEPS, "extra": [*ON, "--parallel.tp", "2", *extra]})
        for name, (world, extra) in TP_ARRANGEMENTS.items()
    ),
    # a fixed context-parallel degree: cp 2 alone, under FSDP2, and over dp 2 (DDP and FSDP2)
    *(
        Scenario(name, TRAIN, world, {"steps": CP_STEPS, "extra": [*ON, *CP, *extra]})
        for name, (world, extra) in CP_ARRANGEMENTS.items()
    ),
    # a fixed pipeline degree: pp 2 alone, and ZeRO-2 and FSDP2 over dp 2 (each micro-batch its own schedule step)
    *(
        Scenario(name, TRAIN, world, {"steps": CP_STEPS, "extra": [*ON, *PP, *extra]})
        for name, (world, extra) in PP_ARRANGEMENTS.items()
    ),
    # HLAT's bf16 weights with stochastic rounding: the noise is keyed by an element's global index
    *(
        Scenario(f"det-bf16sr-{name}", TRAIN, world, {"steps": 4, "extra": [*ON, *BF16_SR, *extra]})
        for name, world, extra in (("dp1", 1, []), ("dp2-fsdp", 2, FSDP))
    ),
    # three elastic groups of one process each: group 1 killed before step 3, restarted after step 4
    Scenario(ELASTIC, "train/elastic_runs.py:deterministic", 1, {"steps": STEPS, "kill": 3, "extra": ON}, waiting=True),
    # replay inside two elastic groups of two FSDP2 ranks, group 1 computing wrong at step 2
    Scenario(
        REPLAY_GROUPS,
        "train/elastic_group_runs.py:replay_excludes_a_group",
        1,
        {"steps": MIDDLE, "extra": [*ON, "--train.replay_every", "1", "--recovery.wrong_computation", "exclude"]},
        waiting=True,
    ),
    Scenario("plain-dp1", TRAIN, 1, {"steps": 1, "extra": ["--parallel.compile", "false"]}),
    Scenario("plain-dp2-fsdp", TRAIN, 2, {"steps": 1, "extra": ["--parallel.compile", "false", *FSDP]}),
]


def digests(scenarios: ScenarioResults, name: str, tmp_path, step: int = STEPS, run: str = "run") -> dict[str, str]:
    checkpoint = scenarios.path(name) / run / "checkpoints" / f"step_{step:08d}"
    return {
        key: hashlib.sha256(value.reshape(-1).contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
        for key, value in checkpoint_tensors(checkpoint, tmp_path).items()
    }


def loader_states(scenarios: ScenarioResults, name: str, world: int, run: str = "run") -> list[str]:
    checkpoint = scenarios.path(name) / run / "checkpoints" / f"step_{STEPS:08d}"
    return [
        json.dumps(torch.load(checkpoint / f"rank_{r:05d}.pt", weights_only=True)["loader"], sort_keys=True)
        for r in range(world)
    ]


def losses(scenarios: ScenarioResults, name: str) -> list[float]:
    return scenarios.json(name, "summary.rank0.json")["losses"]


def assert_same_bits(scenarios: ScenarioResults, tmp_path, names: list[str], steps: int) -> None:
    """Every scenario of `names` saved and logged what the first did after `steps` steps."""
    reference, reference_losses = digests(scenarios, names[0], tmp_path, step=steps), losses(scenarios, names[0])
    assert len(reference_losses) == steps
    for name in names[1:]:
        found = digests(scenarios, name, tmp_path, step=steps)
        assert found.keys() == reference.keys() and [k for k in reference if found[k] != reference[k]] == [], name
        assert losses(scenarios, name) == reference_losses, name


def test_every_arrangement_saves_and_logs_the_same_bits(scenarios: ScenarioResults, tmp_path):
    reference = digests(scenarios, "det-dp1", tmp_path)
    assert any(key.startswith("optim.") for key in reference) and any(key.startswith("model.") for key in reference)
    (reference_loader,) = loader_states(scenarios, "det-dp1", 1)
    reference_losses = losses(scenarios, "det-dp1")
    assert len(reference_losses) == STEPS
    for name, (world, _) in [*ARRANGEMENTS.items(), ("det-dp4-zero1-resumed", (4, ZERO1))]:
        found = digests(scenarios, name, tmp_path)
        assert found.keys() == reference.keys(), name
        assert [k for k in reference if found[k] != reference[k]] == [], name
        assert loader_states(scenarios, name, world) == [reference_loader] * world, name
    for name in ARRANGEMENTS:
        assert losses(scenarios, name) == reference_losses, name
    resumed = losses(scenarios, "det-dp2-fsdp-first") + losses(scenarios, "det-dp4-zero1-resumed")
    assert resumed == reference_losses


def test_a_fixed_tensor_parallel_degree_keeps_the_same_bits_over_dp(scenarios: ScenarioResults, tmp_path):
    assert_same_bits(scenarios, tmp_path, list(TP_ARRANGEMENTS), STEPS)
    (reference_loader,) = set(loader_states(scenarios, "det-tp2", 2))
    for name, (world, _) in TP_ARRANGEMENTS.items():
        assert loader_states(scenarios, name, world) == [reference_loader] * world, name


def test_a_fixed_context_parallel_degree_keeps_the_same_bits_over_dp(scenarios: ScenarioResults, tmp_path):
    """Each micro-batch's parts on its cp ranks are summed in cp rank order, then the dp tree: the
    same bits whether FSDP2 sums them in its reduce-scatter over dp x cp or they are summed here."""
    assert_same_bits(scenarios, tmp_path, list(CP_ARRANGEMENTS), CP_STEPS)


def test_a_fixed_pipeline_degree_keeps_the_same_bits_over_dp(scenarios: ScenarioResults, tmp_path):
    """Each micro-batch runs a schedule step of its own, so .grad holds it alone when the dp tree
    takes it; the loss comes from the last stage and the norm adds the stages' sums in stage order."""
    assert_same_bits(scenarios, tmp_path, list(PP_ARRANGEMENTS), CP_STEPS)


def test_bf16_weights_with_stochastic_rounding_keep_the_same_bits(scenarios: ScenarioResults, tmp_path):
    one, two = (digests(scenarios, f"det-bf16sr-{name}", tmp_path, step=4) for name in ("dp1", "dp2-fsdp"))
    assert one.keys() == two.keys() and [k for k in one if one[k] != two[k]] == []
    assert losses(scenarios, "det-bf16sr-dp1") == losses(scenarios, "det-bf16sr-dp2-fsdp")


def test_elastic_groups_leaving_and_rejoining_keep_the_bits_of_one_process(scenarios: ScenarioResults, tmp_path):
    """Steps 1-2 on three groups, 3-4 on two, 5-8 on three again (group 1 healed from a survivor):
    each group's last checkpoint and group 0's logged losses are those of dp 1. Three groups add
    their sums in an order a plain all-reduce does not keep (planted: with it, or with the shares
    dealt round-robin, this fails)."""
    out = scenarios.path(ELASTIC)
    assert "killed rank 0" in (out / "killed").read_text()
    present = [line for f in sorted(out.glob("group0.*.log")) for line in f.read_text().splitlines()]
    assert any("3 group(s) present at step 1" in line and "shares [0] of 4" in line for line in present), present
    assert any("2 group(s) present at step 3" in line and "shares [0, 1] of 4" in line for line in present), present
    assert any("3 group(s) present at step 5" in line for line in present), present
    reference = digests(scenarios, "det-dp1", tmp_path)
    (reference_loader,) = loader_states(scenarios, "det-dp1", 1)
    for group in ("group0", "group1", "group2"):
        found = digests(scenarios, ELASTIC, tmp_path, run=group)
        assert found.keys() == reference.keys(), group
        assert [k for k in reference if found[k] != reference[k]] == [], group
        assert loader_states(scenarios, ELASTIC, 1, run=group) == [reference_loader], group
    records = [json.loads(line) for line in (out / "group0" / "metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in records if "loss" in r] == losses(scenarios, "det-dp1")


def test_the_mode_says_so_and_without_it_layouts_differ(scenarios: ScenarioResults):
    messages = scenarios.json("det-dp2-fsdp", "summary.rank0.json")["messages"]
    assert any(m.startswith("deterministic: on") for m in messages), messages
    assert losses(scenarios, "plain-dp1") != losses(scenarios, "plain-dp2-fsdp")


@pytest.mark.parametrize(
    "extra, field",
    [
        (["--train.global_batch", "12"], "train.global_batch"),  # 6 micro-batches: no binary tree
        (["--precision.mode", "bf16-sr", "--precision.fp32_grad_accum", "true"], "precision.fp32_grad_accum"),
        ([*PP, "--model.tie_embeddings", "true"], "model.tie_embeddings"),
        ([*PP, "--train.replay_every", "1"], "train.replay_every"),
        (["--parallel.cp", "2", "--train.replay_every", "1"], "train.replay_every"),  # a cp rank holds a part
        (["--parallel.cp", "2", "--parallel.dp_sharding", "fsdp", "--parallel.dp_shard", "1"], "parallel.dp_shard"),
        (["--parallel.dp_sharding", "fsdp", "--parallel.dp_shard", "1"], "parallel.dp_shard"),  # 4 replicas
        (["--recovery.wrong_computation", "exclude"], "recovery.wrong_computation"),  # not elastic
        ([*ELASTIC_GROUPS, "8"], "elastic.max_groups"),  # 8 groups, 4 micro-batches
        ([*ELASTIC_GROUPS, "2", "--parallel.dp_sharding", "fsdp"], "train.global_batch"),  # 2 micro-batches, 4 ranks
    ],
)
def test_what_the_mode_cannot_keep_identical_is_refused_by_name(extra, field, small_corpus, tmp_path):
    args = tiny_args(small_corpus, tmp_path / "run", "--train.deterministic", "true", *extra)
    with pytest.raises(ConfigError) as refused:
        load_config("tiny", None, args, world=4)
    assert field in [name for name, _ in refused.value.problems], refused.value.problems


def test_a_pipeline_under_the_mode_needs_no_more_micro_batches_than_one(small_corpus, tmp_path):
    """Each micro-batch is a schedule step of its own, so a rank may hold fewer than pp of them."""
    args = tiny_args(small_corpus, tmp_path / "run", *PP, "--train.global_batch", "4", "--train.micro_batch", "2")
    with pytest.raises(ConfigError, match="pipeline parallel needs at least pp=2 micro-batches"):
        load_config("tiny", None, args, world=4)
    load_config("tiny", None, [*args, *ON, "--parallel.dp_sharding", "zero2"], world=4)


class _AskedSteps:
    """A replay that records which steps it is asked about and checks none."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def due(self, step: int) -> bool:
        self.asked.append(step)
        return False


def test_a_resumed_run_replays_at_the_run_s_steps(small_corpus, tmp_path):
    """Replay's schedule, the step its line and record name, and HLAT_FAULT's flip count the run's
    steps: a run resumed at step 2 asks about steps 3 and 4, as the uninterrupted run does (counted
    by the process, it asked about 1 and 2: a record naming the wrong step, checks moved)."""
    for steps in (2, 4):
        trainer = Trainer(
            load_config("tiny", None, tiny_args(small_corpus, tmp_path, *ON, "--train.steps", str(steps)))
        )
        trainer.module.replay = replay = _AskedSteps()
        trainer.fit()
    assert replay.asked == [3, 4]


def test_the_mode_runs_one_intra_op_thread_where_threads_change_a_matmul():
    """The CPU may split a long reduction over its threads (here 64 x 4096 x 64 gave 9e-5 apart on
    two threads on one host, the same bits on another): the mode's processes all run one, whatever
    they were started with, so the product is the one-thread product on every host."""
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 4096, generator=generator), torch.randn(4096, 64, generator=generator)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = a @ b
        torch.set_num_threads(2)
        fix_numerics(torch.device("cpu"))
        assert torch.get_num_threads() == 1 and torch.equal(a @ b, one)
    finally:
        torch.set_num_threads(before)


def test_replay_names_the_rank_that_computed_wrong(scenarios: ScenarioResults):
    clean = scenarios.json("replay-clean", "summary.rank0.json")
    assert clean["step"] == 4 and not list(scenarios.path("replay-clean").glob("refused.*"))
    assert clean["losses"] == losses(scenarios, "det-dp1")[:4]  # recomputing left the step's gradients as they were
    records = (scenarios.path("replay-clean") / "run" / "metrics.jsonl").read_text()
    assert '"replay"' not in records
    four = scenarios.path("replay-flip-4")
    refusals = [json.loads((four / f"refused.rank{r}.json").read_text()) for r in range(4)]
    assert {r["code"] for r in refusals} == {3} and len({r["message"] for r in refusals}) == 1
    message = refusals[0]["message"]
    assert "at step 2" in message and "computing wrong: data-parallel rank 3 (global rank 3, host " in message
    assert "rank 0 (" not in message
    (named,) = [
        json.loads(line) for line in (four / "run" / "metrics.jsonl").read_text().splitlines() if "replay" in line
    ]
    assert named["step"] == 2 and named["replay"]["ranks"] == [3]
    assert named["replay"]["hosts"] == [socket.gethostname()]  # what scripts/slurm.sbatch leaves out
    two = json.loads((scenarios.path("replay-flip-2") / "refused.rank0.json").read_text())["message"]
    assert "no third" in two and "data-parallel rank 0 (" in two and "data-parallel rank 1 (" in two


def test_replay_in_elastic_groups_excludes_the_group_holding_the_node(scenarios: ScenarioResults, tmp_path):
    """The group holding the node stops (its ranks with status 3) and the other retries step 2
    alone, saving the bits of a clean run. torchrun itself exits with 1 whatever its ranks' status;
    its report gives theirs. (recovery.wrong_computation stop: tests/train/test_elastic_deterministic.py.)"""
    out = scenarios.path(REPLAY_GROUPS)
    exits = json.loads((out / "exits.json").read_text())
    assert exits == {"group0": 0, "group1": 1}, exits
    log = (out / "group1.0.log").read_text()
    assert "(exitcode: 3)" in log, log[-3000:]
    # the first rank out says it (torchrun then ends the other, which may not get to)
    excluded = next(line for line in log.splitlines() if re.match(r"hlat train( \(rank \d\))?: replay", line))
    assert "at step 2" in excluded and "computing wrong: data-parallel rank 0 (" in excluded, excluded
    assert "data-parallel rank 1 (" in excluded and "this group leaves the run" in excluded, excluded
    (named,) = [r for r in map(json.loads, (out / "group1/metrics.jsonl").read_text().splitlines()) if "replay" in r]
    assert named["step"] == 2 and named["replay"]["ranks"] == [0, 1]
    reference = digests(scenarios, "det-dp2-fsdp-first", tmp_path, step=MIDDLE)
    found = digests(scenarios, REPLAY_GROUPS, tmp_path, step=MIDDLE, run="group0")
    assert found.keys() == reference.keys() and [k for k in reference if found[k] != reference[k]] == []
    records = [json.loads(line) for line in (out / "group0/metrics.jsonl").read_text().splitlines()]
    assert [r["loss"] for r in records if "loss" in r] == losses(scenarios, "det-dp1")[:MIDDLE]


def test_a_named_rank_exits_with_its_own_status():
    assert _report("hlat train", WrongComputation("replay: ..."), debug=False) == 3
