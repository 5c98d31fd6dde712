"""A rank that stops answering (alive, silent) makes the others fail with an error that names it."""

import time

import pytest

from hlat.parallel.hang import _missing, _ranks, is_timeout
from runs import tiny_args, torchrun


def test_stuck_rank_is_named_with_the_step_and_phase(small_corpus, tmp_path):
    marker = tmp_path / "fault-done"
    env = {
        "HLAT_FAULT": "hang:3:1",
        "HLAT_FAULT_MARKER": str(marker),
        "HLAT_COLLECTIVE_TIMEOUT_S": "10",
    }  # > the tokenizer barrier on a loaded machine
    start = time.monotonic()
    done = torchrun(
        2,
        # interrupt_save_s 0: the frozen rank ends at torchrun's SIGTERM, not at its SIGKILL 30 s later
        # (it sleeps in the fault, so the save deadline's timer never wakes it)
        [
            "-m",
            "hlat",
            "train",
            *tiny_args(small_corpus, tmp_path / "run", "--train.steps", "6", "--train.interrupt_save_s", "0"),
        ],
        env=env,
        timeout=180,
        check=False,
    )
    elapsed = time.monotonic() - start
    assert marker.is_file(), "the fault never fired"
    assert done.returncode != 0
    assert "CollectiveTimeout: step 3, training step" in done.stderr, done.stderr[-4000:]
    assert "rank 1 never arrived within 10 s; rank 0 waited" in done.stderr, done.stderr[-4000:]
    assert elapsed < 120


class FakeStore:
    def __init__(self, keys):
        self.keys = set(keys)
        self.requests = 0

    def check(self, keys):
        self.requests += 1
        return set(keys) <= self.keys


def test_missing_ranks_are_found_by_bisection_in_few_requests():
    store = FakeStore(str(r) for r in range(1024) if r not in (5, 700))
    assert _missing(store, list(range(1024))) == [5, 700]
    assert store.requests < 50
    assert _ranks([3]) == "rank 3" and _ranks([0, 2]) == "ranks [0, 2]"


@pytest.mark.parametrize(
    "message, expected",
    [
        ("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation to complete", True),
        ("Connection closed by peer", False),
    ],
)
def test_timeouts_are_told_from_other_errors(message, expected):
    assert is_timeout(RuntimeError(message)) is expected
