"""Mixtures whose proportions hold in every global batch: each source's rows within one of
weight x rows, at any data-parallel size and split into micro-batches, across a resume at another
data-parallel size; a state saved before this order keeps the older one (docs/data.md)."""

from __future__ import annotations

import pytest

from hlat.data.packing import BatchMixture, PackedLoader, merge_states
from hlat.data.sources import TextFiles

SEQ, MICRO = 32, 2
WEIGHTS = [0.7, 0.3]  # the 0.7/0.3 code/prose mixture that once trained on code alone for 25 steps


@pytest.fixture
def sources(tmp_path, corpus_factory):
    for name, n, seed in (("code", 40, 1), ("prose", 12, 2)):
        corpus_factory(tmp_path / name, n_docs=n, seed=seed, long_chars=2_000)  # long documents: many rows each
    return [TextFiles(tmp_path / name) for name in ("code", "prose")]


def _loaders(sources, tok, dp: int, global_batch: int, weights=WEIGHTS):
    return [
        PackedLoader(
            sources,
            tok,
            seq_len=SEQ,
            batch_size=MICRO,
            seed=4,
            dp_rank=r,
            dp_size=dp,
            weights=weights,
            step_rows=global_batch // dp,
            prefetch=False,
        )  # fmt: skip
        for r in range(dp)
    ]


def _step_rows(loaders, global_batch: int) -> list[int]:
    """One optimizer step on every rank: each source's rows in it (its tokens emitted, in rows)."""
    before = [sum(ld.tokens_emitted[k] for ld in loaders) for k in range(len(WEIGHTS))]
    for ld in loaders:
        for _ in range(global_batch // len(loaders) // MICRO):
            ld.next_batch()
    return [(sum(ld.tokens_emitted[k] for ld in loaders) - before[k]) // SEQ for k in range(len(WEIGHTS))]


@pytest.mark.parametrize("dp", [1, 2, 5])
def test_every_global_batch_holds_the_weights(sources, tok, dp):
    loaders = _loaders(sources, tok, dp, global_batch=20)
    for _ in range(12):
        assert _step_rows(loaders, 20) == [14, 6]  # weight x 20 rows, exactly, from the first step


def test_fractional_shares_stay_within_one_row_and_hold_over_the_run():
    mixture = BatchMixture([0.6, 0.3, 0.1], 4)  # 2.4, 1.2 and 0.4 rows a batch
    counts = [[mixture.places(s).count(k) for k in range(3)] for s in range(50)]
    assert all(abs(c - share) < 1 for batch in counts for c, share in zip(batch, (2.4, 1.2, 0.4), strict=True))
    assert [sum(batch[k] for batch in counts) for k in range(3)] == [120, 60, 20]
    assert BatchMixture([0.6, 0.3, 0.1], 4).places(37) == mixture.places(37)  # a pure function of the batch


def test_a_resume_at_another_data_parallel_size_keeps_the_proportions(sources, tok):
    before = _loaders(sources, tok, dp=2, global_batch=20)
    for _ in range(3):
        _step_rows(before, 20)
    state = merge_states([ld.state_dict() for ld in before])
    after = _loaders(sources, tok, dp=5, global_batch=20)
    for ld in after:
        ld.load_state_dict(state)
    for _ in range(4):
        assert _step_rows(after, 20) == [14, 6]


def test_a_state_from_before_keeps_its_order(sources, tok):
    (loader,) = _loaders(sources, tok, dp=1, global_batch=4)
    loader.next_batch()
    state = loader.state_dict()
    assert state["mixture"] == "rows"
    older = {k: v for k, v in state.items() if k not in ("mixture", "rows")}  # as hlat saved it before
    (resumed,) = _loaders(sources, tok, dp=1, global_batch=4)
    resumed.load_state_dict(older)
    assert resumed.mixture == "tokens" and resumed._row_source() is None
    resumed.next_batch()
    assert resumed.state_dict()["mixture"] == "tokens"  # and it saves that order on
