"""hlat lighthouse: its numbers are checked in one line, and it listens on loopback unless --host
says otherwise (an elastic run's groups exchange the whole model: nothing listens on every
interface by default). Also the elastic inputs checked before a run starts."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hlat.cli import main
from hlat.config.run import RunConfig
from hlat.errors import ConfigError, UserError
from hlat.faults import hold_groups


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--join-timeout-ms", "-1"], "--join-timeout-ms -1: give milliseconds, 1 to"),
        (["--heartbeat-timeout-ms", "0"], "--heartbeat-timeout-ms 0: give milliseconds, 1 to"),
        (["--port", "70000"], "--port 70000: give a TCP port, 0 to 65535"),
        (["--min-groups", "0"], "--min-groups 0: a quorum needs at least 1 group"),
    ],
)
def test_bad_numbers_are_one_line(flags, message, capsys):
    assert main(["lighthouse", *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def _listening(port: int) -> list[str]:
    """The local addresses (hex, as /proc/net/tcp* writes them) that listen on `port`."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.rsplit(":", 1)
            if state == "0A" and int(hex_port, 16) == port:
                found.append(address)
    return found


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads the listening sockets from /proc/net")
def test_the_lighthouse_listens_on_loopback_by_default(tmp_path):
    log = tmp_path / "lighthouse.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "hlat", "lighthouse", "--port", "0"], stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, "RUST_LOG": "warn"},
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (found := re.search(r"listening at \S+:(\d+)", log.read_text())):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        addresses = _listening(int(found.group(1)))
        assert addresses and all(a in ("0100007F", "00000000000000000000000001000000") for a in addresses), addresses
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_an_elastic_group_name_must_be_a_file_name_part():
    cfg = RunConfig()
    cfg.elastic.enabled, cfg.elastic.lighthouse, cfg.elastic.trusted_network = True, "http://localhost:29510", True
    for bad in ("a/b", "..", "x y", "g" * 65):
        cfg.elastic.group = bad
        with pytest.raises(ConfigError) as err:
            cfg.validate()
        assert [field for field, _ in err.value.problems] == ["elastic.group"], bad
    cfg.elastic.group = "node-3.a_1"
    cfg.validate()


def test_the_elastic_hold_hook_is_for_tests_only(monkeypatch):
    monkeypatch.setenv("HLAT_ELASTIC_HOLD", "1:3")
    monkeypatch.setenv("HLAT_TESTING", "0")
    assert hold_groups(1) == 0  # outside the test suite it does nothing, not even parse
    monkeypatch.setenv("HLAT_TESTING", "1")
    assert hold_groups(1) == 3 and hold_groups(2) == 0
    monkeypatch.setenv("HLAT_ELASTIC_HOLD", "one:3")
    with pytest.raises(UserError, match="HLAT_ELASTIC_HOLD='one:3': give STEP:GROUPS"):
        hold_groups(1)
