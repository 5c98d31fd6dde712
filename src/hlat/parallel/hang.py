"""Name the stuck rank when a collective times out, instead of the backend's opaque error.

A collective that times out only tells each waiting rank that *it* waited. Around each
collective phase, `watch` turns that error into a report the ranks assemble together in the
rendezvous store (which outlives the broken process group): every rank that timed out writes
what it was doing, waits a grace period for the others, and the ranks that never wrote a line
are the ones that never arrived.

Applies wherever the backend raises into Python: gloo always; NCCL when its watchdog does not
abort the process first (TORCH_NCCL_BLOCKING_WAIT=1), otherwise the watchdog's own log names
the timed-out collective and this rank.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import torch.distributed as dist

from hlat.parallel.mesh import Layout, collective_timeout

GRACE_S = 60.0  # the longest the survivors wait for each other's reports (capped by the timeout)


class CollectiveTimeout(RuntimeError):
    """A collective timed out; the message names the ranks that never arrived."""


def is_timeout(err: BaseException) -> bool:
    """An error a process group raises when a peer does not show up within the timeout."""
    if isinstance(err, dist.DistBackendError):
        return True
    text = str(err).lower()
    return isinstance(err, RuntimeError) and ("timed out" in text or "timeout" in text)


@contextlib.contextmanager
def watch(layout: Layout, what: str, step: int) -> Iterator[None]:
    """Run a collective phase; a timeout in it becomes a CollectiveTimeout naming the missing ranks."""
    try:
        yield
    except CollectiveTimeout:
        raise
    except Exception as err:
        if layout.mesh is None or not is_timeout(err):
            raise
        raise CollectiveTimeout(report(layout.rank, layout.world, f"step {step}, {what}", err)) from err


def report(rank: int, world: int, doing: str, err: BaseException) -> str:
    """Publish what this rank was doing, gather the others' lines, and say who is missing."""
    timeout_s = collective_timeout().total_seconds()
    backend_line = (str(err).strip() or type(err).__name__).splitlines()[0]
    try:
        store = dist.PrefixStore("hlat/hang/", dist.distributed_c10d._get_default_store())
        store.set(str(rank), doing)
        everyone = list(range(world))
        deadline = time.monotonic() + min(GRACE_S, timeout_s)
        while time.monotonic() < deadline and not store.check([str(r) for r in everyone]):
            time.sleep(0.2)
        missing = _missing(store, everyone)
        arrived = [r for r in everyone if r not in missing]
        lines = dict(zip(arrived, (v.decode() for v in store.multi_get([str(r) for r in arrived]))))
    except Exception as store_err:  # without torchrun's agent store the store lives in rank 0's process
        return (
            f"{doing}: timed out after {timeout_s:g} s waiting for other ranks, and the rendezvous store could not be "
            f"reached to learn which ({store_err}). Check every rank's log; backend error: {backend_line}"
        )
    others: dict[str, list[int]] = {}
    for r, line in lines.items():
        if line != doing:
            others.setdefault(line, []).append(r)
    elsewhere = "".join(f"; {_ranks(rs)} timed out in {line} instead" for line, rs in others.items())
    if not missing:
        return (
            f"{doing}: every rank timed out after {timeout_s:g} s{elsewhere}. No rank is stuck: suspect the network "
            f"between nodes (or a too-short HLAT_COLLECTIVE_TIMEOUT_S); backend error: {backend_line}"
        )
    return (
        f"{doing}: {_ranks(missing)} never arrived within {timeout_s:g} s; {_ranks(arrived)} waited{elsewhere}. "
        f"Check rank {missing[0]}'s log and node (a crash, a hung device or data read, a lost network link); "
        f"the launcher restarts the group from the newest checkpoint. Backend error: {backend_line}"
    )


def _missing(store: dist.Store, ranks: list[int]) -> list[int]:
    """Ranks without a report: bisection costs O(missing x log world) store requests, not O(world)."""
    if store.check([str(r) for r in ranks]):
        return []
    if len(ranks) == 1:
        return ranks
    half = len(ranks) // 2
    return _missing(store, ranks[:half]) + _missing(store, ranks[half:])


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    shown = ", ".join(map(str, ranks[:8])) + (f", ... ({len(ranks)} in all)" if len(ranks) > 8 else "")
    return f"ranks [{shown}]"
