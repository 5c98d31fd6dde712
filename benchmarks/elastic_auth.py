"""What authentication costs one healing transfer: a rejoining group receiving a live group's state
(`--mb` MB of fp32 tensors) through hlat's state transport (hlat.train.elastic.transport), source
and receiver in this process over loopback, timed from the receiver's request to the loaded state.

- authenticated: the transport as a run uses it (challenge, HMAC proof, SHA-256 of the payload on
  both sides, the payload MAC checked before loading);
- without MACs: the same transport with its digests and MACs made no-ops (what the checks cost);
- torchft HTTPTransport: torchft's own transport, which authenticates nothing (for reference).

`--repeats` of each, the modes in turn (the fastest is the least disturbed by other load). With
`--out`, the section replaces its own in that record; run it after benchmarks/elastic_recovery.py
(which rewrites the record), whose seconds to rejoin it reads for the share:

    python benchmarks/elastic_auth.py --mb 100 --out benchmarks/elastic_recovery.md
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import re
import secrets
import statistics
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import torch
from run_conditions import Conditions
from torchft.checkpointing.http_transport import HTTPTransport

from hlat.train.elastic import transport
from hlat.train.elastic.transport import AuthenticatedTransport

HEADING = "## Authentication on one healing transfer"
TIMEOUT = timedelta(seconds=120)
ROWS = {
    "authenticated": "authenticated (hlat)",
    "without MACs": "hlat's, digests and MACs made no-ops",
    "torchft": "torchft HTTPTransport (no authentication)",
}


def state_of(mb: int) -> dict[str, Any]:
    """A group's state as it heals another: tensors of `mb` MB in all, counters and positions."""
    per = mb * 10**6 // 4 // 8
    module = {f"layer{i}.weight": torch.randn(per) for i in range(8)}
    return {"fingerprint": "0" * 16, "group": "0", "module": module, "progress": {"step": 5}, "data": [b"x" * 100]}


def pair(state: dict[str, Any]) -> tuple[AuthenticatedTransport, AuthenticatedTransport]:
    """A source and a receiver that share one run secret."""
    key = secrets.token_bytes(32)

    def one() -> AuthenticatedTransport:
        return AuthenticatedTransport(
            key=key, fingerprint="0" * 16, host="127.0.0.1", timeout=TIMEOUT, own_state=lambda: state,
            say=lambda line, _: print(line),
        )  # fmt: skip

    return one(), one()


def transfer(source: Any, receiver: Any, step: int, state: dict[str, Any]) -> float:
    """Seconds from the receiver's request to its loaded copy of `state`, served by `source`."""
    source.send_checkpoint([1], step, state, TIMEOUT)
    start = time.perf_counter()
    received = receiver.recv_checkpoint(0, source.metadata(), step, TIMEOUT)
    seconds = time.perf_counter() - start
    source.disallow_checkpoint()
    assert torch.equal(received["module"]["layer0.weight"], state["module"]["layer0.weight"])
    return seconds


class _NoDigest:
    def __init__(self, data: bytes = b""):
        pass

    def update(self, data: bytes) -> None:
        pass

    def hexdigest(self) -> str:
        return ""


@contextlib.contextmanager
def checks_off() -> Iterator[None]:
    """hlat's transport with its digests and MACs made no-ops (the proofs then always agree)."""
    with (
        mock.patch.object(transport, "hashlib", SimpleNamespace(sha256=_NoDigest)),
        mock.patch.object(transport, "mac", lambda *parts: bytes(transport.MAC_BYTES)),
    ):
        yield


def measure(state: dict[str, Any], repeats: int) -> dict[str, list[float]]:
    """Seconds of each of `repeats` transfers of `state` in every mode (the module's docstring)."""
    made = {
        "authenticated": pair(state),
        "without MACs": pair(state),
        "torchft": (HTTPTransport(timeout=TIMEOUT, num_chunks=0), HTTPTransport(timeout=TIMEOUT, num_chunks=0)),
    }
    times: dict[str, list[float]] = {mode: [] for mode in made}
    for step in range(1, repeats + 1):  # the modes in turn: a shared machine's load falls on each alike
        for mode, (source, receiver) in made.items():
            with checks_off() if mode == "without MACs" else contextlib.nullcontext():
                times[mode].append(transfer(source, receiver, step, state))
    for source, receiver in made.values():
        source.shutdown()
        receiver.shutdown()
    return times


def _seconds(work: Callable[[], object]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def recovery_seconds(record: Path) -> tuple[float, float] | None:
    """(time lost, seconds to rejoin) of the elastic row of benchmarks/elastic_recovery.md."""
    row = re.search(r"^\| elastic \| [\d.]+ \| [\d.]+ \| ([\d.]+) \| \d+ \| ([\d.]+) \|$", record.read_text(), re.M)
    return (float(row.group(1)), float(row.group(2))) if row else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=int, default=100, help="the state's tensors, in MB")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--out", type=Path, help="the recovery record to put the section in")
    opts = parser.parse_args()
    conditions = Conditions()
    state = state_of(opts.mb)
    times = measure(state, opts.repeats)
    payload = b"\0" * (opts.mb * 10**6)
    sha_s = min(_seconds(lambda: hashlib.sha256(payload).digest()) for _ in range(opts.repeats))
    fastest = {mode: min(t) for mode, t in times.items()}
    median = {mode: statistics.median(t) for mode, t in times.items()}
    cost, cost_median = (s["authenticated"] - s["without MACs"] for s in (fastest, median))
    lines = [
        HEADING,
        "",
        *conditions.lines(),
        f"- torchft: {importlib.metadata.version('torchft')}",
        f"- transfer: {opts.mb} MB of fp32 tensors in 8 tensors, one source and one receiver in one process over "
        f"loopback (127.0.0.1), from the receiver's request to the loaded state; {opts.repeats} of each, the modes in "
        f"turn; SHA-256 of {opts.mb} MB alone: {sha_s:.3f} s",
        "",
        "| transport | fastest s | median s |",
        "|---|---:|---:|",
        *(f"| {ROWS[mode]} | {fastest[mode]:.3f} | {median[mode]:.3f} |" for mode in ROWS),
        "",
        f"Authentication costs {cost:.3f} s a transfer of {opts.mb} MB (fastest; {cost_median:.3f} s median), "
        f"{100 * cost / fastest['without MACs']:.0f}% of the same transfer without it: the payload's SHA-256 on both "
        "sides (one pass each, as it streams and before loading), two HMACs and one challenge round trip. The rest "
        f"of the difference from torchft's transport ({fastest['without MACs'] - fastest['torchft']:.3f} s) is not "
        "authentication: hlat's reads the whole payload before loading any of it (its MAC is checked first), where "
        "torchft's loads as it reads.",
    ]
    recovery = recovery_seconds(opts.out) if opts.out else None
    if recovery:
        lost, rejoin = recovery
        lines[-1] += (
            f" Against the elastic row above ({lost:g} s lost, {rejoin:g} s to rejoin, measured on the hardware "
            f"it names): {100 * cost / rejoin:.1f}% of the seconds to rejoin, {100 * cost / lost:.1f}% of the time lost."
        )
    report = "\n".join(lines) + "\n"
    print(report)
    if opts.out:
        text = opts.out.read_text()
        kept = text.split(f"\n{HEADING}\n")[0].rstrip("\n")
        opts.out.write_text(f"{kept}\n\n{report}")


if __name__ == "__main__":
    main()
