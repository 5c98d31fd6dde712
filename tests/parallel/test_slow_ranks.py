"""The slow-rank report (hlat.parallel.slow_ranks): its scoring on made-up compute times, its
console field, and a two-rank run in which HLAT_FAULT slows rank 1 down and the report names it."""

from __future__ import annotations

import json
import re
import socket

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from hlat.config.load import load_config
from hlat.errors import ConfigError
from hlat.metrics.sinks import MetricSinks, read_metrics
from hlat.parallel.slow_ranks import SlowRankScores
from runs import Scenario, ScenarioResults

SLOW_S = 0.05  # CPU seconds rank 1 burns in every step: several times the tiny model's own step
SCENARIOS = [
    Scenario(
        "slow-rank",
        "train/layout_runs.py:train",
        2,
        {
            "steps": 3,
            "extra": ["--train.slow_rank_windows", "2", "--train.tensorboard", "true"],
            "env": {"HLAT_FAULT": f"slow:1:1:{SLOW_S}"},
        },
    )
]


def test_a_rank_that_stays_slow_is_reported_once_and_a_spike_is_not():
    scores = SlowRankScores(threshold=0.1, windows=3)
    normal, slow_3 = [1.0, 1.0, 1.02, 0.98], [1.0, 1.0, 1.0, 1.5]
    spike = scores.update([1.0, 2.0, 1.0, 1.0])  # rank 1 twice the median once: scored, not reported
    assert (spike.slowest, spike.lag_s, spike.score, spike.median_s, spike.became_slow) == (1, 1.0, 1.0, 1.0, [])
    verdicts = [scores.update(normal) for _ in range(3)] + [scores.update(slow_3) for _ in range(4)]
    assert [v.became_slow for v in verdicts] == [[], [], [], [], [], [3], []]  # the third window in a row above 10%
    assert verdicts[-1].slowest == 3 and verdicts[-1].lag_s == pytest.approx(0.5)
    assert 0.1 < verdicts[-1].score <= 0.5  # a rolling average of the relative lags (0, then 0.5 each window)
    recovered = [scores.update(normal) for _ in range(4)]
    assert [v.recovered for v in recovered].count([3]) == 1 and scores.slow == set()


def test_two_slow_ranks_among_four_are_both_named_and_equal_ranks_none():
    scores = SlowRankScores(threshold=0.1, windows=1)
    assert scores.update([1.0, 1.0, 1.0, 1.0]).became_slow == []
    assert scores.update([2.0, 1.0, 1.0, 2.0]).became_slow == [0, 3]  # median 1.5: both a third above it


def test_ranks_are_compared_within_their_pipeline_stage():
    """Stage 1 (the output head) computes twice as much as stage 0 by design: nobody is slow for
    it; rank 3, 30% above its stage's median, is."""
    scores = SlowRankScores(threshold=0.1, windows=1)
    assert scores.update([1.0, 1.0, 2.0, 2.0, 2.0], stages=[0, 0, 1, 1, 1]).became_slow == []
    verdict = scores.update([1.0, 1.0, 2.0, 2.6, 2.0], stages=[0, 0, 1, 1, 1])
    assert (verdict.became_slow, verdict.slowest, verdict.median_s) == ([3], 3, 2.0)
    assert verdict.lag_s == pytest.approx(0.6)


def test_console_line_shows_the_slowest_rank(tmp_path, capsys):
    sinks = MetricSinks(tmp_path, total_steps=2, start_step=0, tensorboard=False)
    sinks.log(
        {
            "step": 2,
            "loss": 5.0,
            "ppl": 148.4,
            "lr": 1e-3,
            "grad_norm": 1.0,
            "param_norm": 10.0,
            "tokens": 512,
            "tokens_per_s": 100.0,
            "mfu": None,
            "step_s": 0.2,
            "data_frac": 0.01,
            "mem_peak_gib": 0.5,
            "slowest_rank": 3,
            "slowest_lag_s": 0.05,
            "slowest_score": 0.35,
            "median_compute_s": 0.1,
            "time": 1.7e9,
            "elapsed_s": 0.4,
            "eta_s": 0.0,
        }
    )
    sinks.close()
    assert "| slowest rank 3 +0.050 s (score 35%)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "field, value, problem", [("slow_rank_threshold", "0", "must be > 0"), ("slow_rank_windows", "0", "must be >= 1")]
)
def test_slow_rank_settings_are_checked(field, value, problem):
    with pytest.raises(ConfigError, match=re.escape(problem)) as err:
        load_config("tiny", None, [f"--train.{field}", value])
    assert err.value.problems[0][0] == f"train.{field}"


def test_injected_slow_rank_is_named_with_its_host(scenarios: ScenarioResults):
    out = scenarios.path("slow-rank")
    messages = json.loads((out / "summary.rank0.json").read_text())["messages"]
    named = [m for m in messages if m.startswith("slow rank:")]
    assert len(named) == 1 and named[0].startswith(f"slow rank: rank 1 on host {socket.gethostname()} has computed "), (
        messages
    )
    records = [r for r in read_metrics(out / "run") if "loss" in r]
    assert [r["slowest_rank"] for r in records] == [1, 1, 1]
    for r in records:  # over the median (mean) of two ranks: about half the delay, less CPU-time noise under load
        assert r["slowest_lag_s"] > SLOW_S / 4 and r["slowest_score"] > 0.1, r
    events = EventAccumulator(str(out / "run" / "tensorboard")).Reload()
    assert [e.value for e in events.Scalars("train/slowest_rank")] == [1, 1, 1]
    assert {"train/slowest_lag_s", "train/slowest_score", "train/median_compute_s"} <= set(events.Tags()["scalars"])
