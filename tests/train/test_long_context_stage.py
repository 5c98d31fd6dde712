"""The long-context stage: continued pre-training from a shorter-context run's weights at a longer
data.seq_len, with llama3 RoPE scaling and a new rope_theta, through checkpoint.init_from. The
stage starts from the short run's weights with a new optimizer, a fresh loader at the new length
and its own schedule from step 0; at cp 2 its losses are the single process's (fp32, 1e-5
relative). A changed architecture is refused before anything is built, naming the field."""

import json
import re
from pathlib import Path

import pytest

from hlat.config.load import load_config
from hlat.errors import ConfigError
from hlat.train.trainer import Trainer
from runs import Scenario, ScenarioResults, checkpoint_tensors, tiny_args

TRAIN = "train/layout_runs.py:train"
SHORT, LONG = 64, 256
STAGE = [
    "--data.seq_len", str(LONG), "--model.max_seq_len", str(LONG), "--model.rope_scaling", "llama3",
    "--model.rope_factor", "4", "--model.rope_original_max_seq_len", str(SHORT), "--model.rope_theta", "50000",
    "--checkpoint.init_from", "{root}/stage-short/run",
]  # fmt: skip
STEPS = 2
SCENARIOS = [
    Scenario("stage-short", TRAIN, 1, {"steps": STEPS, "extra": ["--data.seq_len", str(SHORT)]}),
    Scenario("stage-start", TRAIN, 1, {"steps": STEPS, "extra": STAGE, "save_only": True}),  # its step-0 state
    Scenario("stage-cp-1", TRAIN, 1, {"steps": STEPS, "extra": STAGE}),
    Scenario("stage-cp-2", TRAIN, 2, {"steps": STEPS, "extra": [*STAGE, "--parallel.cp", "2"]}),
]


def first_record(run: Path) -> dict:
    return json.loads((run / "metrics.jsonl").read_text().splitlines()[0])


def test_stage_starts_from_the_short_runs_weights_with_a_new_optimizer(
    scenarios: ScenarioResults, tmp_path: Path
) -> None:
    short = scenarios.path("stage-short") / "run" / "checkpoints" / f"step_{STEPS:08d}"
    start = scenarios.path("stage-start") / "run" / "checkpoints" / "step_00000000"
    saved, started = checkpoint_tensors(short, tmp_path), checkpoint_tensors(start, tmp_path)
    weights = sorted(k for k in saved if k.startswith("model."))
    assert weights and weights == sorted(k for k in started if k.startswith("model."))
    for key in weights:
        assert saved[key].equal(started[key]), key
    moments = [k for k in started if k.startswith("optim") and k.endswith("exp_avg")]
    assert moments and all(not started[k].any() for k in moments)  # a new optimizer: no moments yet


def test_stage_trains_at_the_new_length_with_its_own_schedule(scenarios: ScenarioResults) -> None:
    one = scenarios.json("stage-cp-1", "summary.rank0.json")
    assert any("initialised from weights of" in m and "stage-short" in m for m in one["messages"]), one["messages"]
    assert one["step"] == STEPS and sum(one["tokens_emitted"]) == STEPS * 8 * LONG  # a fresh loader at 256
    stage, short = (first_record(scenarios.path(name) / "run") for name in ("stage-cp-1", "stage-short"))
    assert stage["step"] == 1 and stage["lr"] == short["lr"]  # the schedule from its first warm-up step


def test_stage_at_cp_2_matches_one_process(scenarios: ScenarioResults) -> None:
    one, two = (scenarios.json(name, "summary.rank0.json")["losses"] for name in ("stage-cp-1", "stage-cp-2"))
    assert len(one) == STEPS and two == pytest.approx(one, rel=1e-5)


def test_stage_with_another_architecture_is_refused_naming_the_field(
    scenarios: ScenarioResults, small_corpus: Path, tmp_path: Path
) -> None:
    source = scenarios.path("stage-short") / "run" / "checkpoints" / f"step_{STEPS:08d}"  # a checkpoint of a run
    stage = [arg.replace("{root}/stage-short/run", str(source)) for arg in STAGE]
    cfg = load_config("tiny", None, tiny_args(small_corpus, tmp_path / "run", *stage, "--model.ffn_dim", "192"))
    with pytest.raises(ConfigError, match=re.escape("model.ffn_dim: 192, but the weights of")) as info:
        Trainer(cfg)
    assert [field for field, _ in info.value.problems] == ["model.ffn_dim"]  # the RoPE fields may change
