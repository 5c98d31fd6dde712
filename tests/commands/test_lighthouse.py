"""hlat lighthouse: its numbers are checked in one line, and it listens on loopback unless --host
says otherwise (an elastic run's groups exchange the whole model: nothing listens on every
interface by default). Also the elastic inputs checked before a run starts (a bind address among
them)."""

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
from listening import listening


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
        addresses = [address for address, port in listening(proc.pid) if port == int(found.group(1))]
        assert addresses and all(a in ("127.0.0.1", "::1") for a in addresses), addresses
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _elastic_config() -> RunConfig:
    cfg = RunConfig()
    cfg.elastic.enabled, cfg.elastic.lighthouse, cfg.elastic.trusted_network = True, "http://localhost:29510", True
    return cfg


def _refused_one_by_one(cfg: RunConfig, field: str, values: tuple[str, ...]) -> None:
    """Each of `values` in elastic.`field` is refused, naming that field alone."""
    for bad in values:
        setattr(cfg.elastic, field, bad)
        with pytest.raises(ConfigError) as err:
            cfg.validate()
        assert [name for name, _ in err.value.problems] == [f"elastic.{field}"], bad


def test_an_elastic_group_name_must_be_a_file_name_part():
    cfg = _elastic_config()
    _refused_one_by_one(cfg, "group", ("a/b", "..", "x y", "g" * 65))
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


def test_an_elastic_bind_address_is_one_address_of_this_machine():
    from hlat.train.elastic.sockets import listening_socket

    cfg = _elastic_config()
    cfg.elastic.group = "0"
    _refused_one_by_one(cfg, "bind_address", ("0.0.0.0", "::", "node-3", "10.0.0"))
    cfg.elastic.bind_address = "127.0.0.1"
    cfg.validate()
    with pytest.raises(UserError, match=r"^elastic.bind_address=198.51.100.7: cannot listen there .*this machine$"):
        listening_socket("198.51.100.7")  # a documentation address: on no machine
    with listening_socket("127.0.0.1") as sock:
        assert sock.getsockname()[0] == "127.0.0.1"
