"""What a context-parallel run reports: its token count and MFU count each token of the global
batch once at the whole seq_len, not once per cp rank (each of which computes seq_len/cp of it)."""

import pytest

from hlat.config.load import load_config
from hlat.metrics.sinks import read_metrics
from hlat.model import flops_per_token
from runs import Scenario, ScenarioResults, tiny_args

SCENARIOS = [Scenario("cp-2-metrics", "train/layout_runs.py:train", 2, {"steps": 2, "extra": ["--parallel.cp", "2"]})]


def test_context_parallel_mfu_counts_the_model_flops_once(scenarios: ScenarioResults, small_corpus) -> None:
    run = scenarios.path("cp-2-metrics") / "run"
    cfg = load_config("tiny", None, tiny_args(small_corpus, run))  # the scenario's model and batch
    tokens_per_step = cfg.train.global_batch * cfg.data.seq_len
    records = [r for r in read_metrics(run) if "mfu" in r]
    assert [r["tokens"] for r in records] == [tokens_per_step, 2 * tokens_per_step]
    for record in records:  # tiny_args sets train.peak_tflops 1: MFU x world x 1e12 is the FLOP/s
        achieved = record["mfu"] * 2 * 1e12
        assert achieved == pytest.approx(record["tokens_per_s"] * flops_per_token(cfg.model, cfg.data.seq_len))
