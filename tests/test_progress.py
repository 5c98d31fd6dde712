"""hlat.progress: the one helper every long wait reports through (start line and heartbeat of a
phase; a counting display that prints plain lines at a bounded rate when not on a terminal)."""

from __future__ import annotations

import io
import re
import threading
import time

from hlat.progress import Heartbeat, LineProgress, duration, heartbeat_s, progress


def test_a_phase_says_what_it_does_and_beats_while_it_runs():
    # The block runs until the third beat instead of for a fixed time, so a loaded host that wakes
    # the heartbeat late changes when the beats come, never how many the test sees.
    lines: list[str] = []
    third_beat = threading.Event()

    def out(line: str) -> None:
        lines.append(line)
        if len(lines) == 4:
            third_beat.set()

    started = time.perf_counter()
    with Heartbeat("compile: probing one block", out, interval_s=0.1):
        assert third_beat.wait(timeout=60)
        beaten_after = time.perf_counter() - started
    assert lines[0] == "compile: probing one block ..."
    assert beaten_after >= 0.3  # a beat per interval, never sooner
    assert all(re.fullmatch(r"compile: probing one block: still running after \d+:\d\d", b) for b in lines[1:])
    done = len(lines)
    time.sleep(0.25)
    assert len(lines) == done  # the heartbeat stops with the phase


def test_progress_off_a_terminal_is_a_line_per_interval(monkeypatch):
    log = io.StringIO()  # not a terminal
    monkeypatch.setenv("HLAT_HEARTBEAT_S", "3600")
    bar = progress(1000, "prepare", "doc", file=log)
    assert isinstance(bar, LineProgress)
    for _ in range(1000):
        bar.update(1)
    bar.set_postfix(tokens="12,345")
    bar.close()
    (line,) = log.getvalue().splitlines()  # one interval never passed: only the closing line
    assert line.startswith("prepare: 1,000/1,000 doc (100%), ") and line.endswith("eta 0:00, tokens 12,345")
    assert "\r" not in log.getvalue()
    monkeypatch.setenv("HLAT_HEARTBEAT_S", "nonsense")
    assert heartbeat_s() == 30.0
    assert duration(59.6) == "1:00" and duration(3725) == "1:02:05"
