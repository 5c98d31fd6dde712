"""data.virtual_shards = 0 (auto): a run takes 512, or the smallest power of two at least its
data-parallel size, at its first start; config.toml records the count, and every resume keeps it,
at any data-parallel size (the data position is dealt over those shards)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hlat.config.data import auto_virtual_shards
from hlat.config.load import RUN_CONFIG, load_config
from hlat.train.resume import check_run_dir, resolve_shard_count
from hlat.train.trainer import Trainer
from runs import tiny_args


@pytest.mark.parametrize(("dp", "count"), [(1, 512), (512, 512), (513, 1024), (1024, 1024), (1500, 2048)])
def test_auto_counts(dp: int, count: int) -> None:
    assert auto_virtual_shards(dp) == count


def _cfg(corpus: Path, run: Path, *overrides: str):
    return load_config("tiny", overrides=tiny_args(corpus, run, "--train.steps", "2", *overrides))


@pytest.fixture(scope="module")
def started(small_corpus, tmp_path_factory) -> Path:
    """A run that chose 1024 shards at its first start (as one of 1024 data-parallel ranks would),
    stopped at step 2 with a resumable checkpoint and its config.toml."""
    run = tmp_path_factory.mktemp("started") / "run"
    Trainer(_cfg(small_corpus, run, "--data.virtual_shards", "1024"), resume="fresh", out=lambda _: None).fit()
    return run


def test_a_first_start_chooses_for_its_ranks(small_corpus, tmp_path):
    cfg, line = resolve_shard_count(_cfg(small_corpus, tmp_path / "new"), "auto", ranks=1024)
    assert cfg.data.virtual_shards == 1024 and line == "data: 1024 virtual shards (auto for 1024 data-parallel ranks)"


def test_a_resume_keeps_the_count_at_another_data_parallel_size(small_corpus, started):
    assert "virtual_shards = 1024" in (started / RUN_CONFIG).read_text()
    check_run_dir(_cfg(small_corpus, started), "auto")  # auto is no change of data settings
    cfg, line = resolve_shard_count(_cfg(small_corpus, started), "auto", ranks=2)
    assert cfg.data.virtual_shards == 1024 and line == "data: 1024 virtual shards (kept from the run's first start)"
    fresh, _ = resolve_shard_count(_cfg(small_corpus, started), "fresh", ranks=2)  # --fresh starts over: auto again
    assert fresh.data.virtual_shards == 512


def test_a_resumed_run_trains_on_with_the_saved_count(small_corpus, started, tmp_path):
    lines: list[str] = []
    Trainer(_cfg(small_corpus, started, "--train.steps", "3"), resume="require", out=lines.append).fit()
    assert "data: 1024 virtual shards (kept from the run's first start)" in lines


def test_a_count_set_stands(small_corpus, started):
    cfg, line = resolve_shard_count(_cfg(small_corpus, started, "--data.virtual_shards", "64"), "auto", ranks=2)
    assert cfg.data.virtual_shards == 64 and line is None
