"""Fault injection (hlat.faults) acts only under HLAT_TESTING=1, and a malformed
HLAT_FAULT there is one line, exit 2."""

import pytest
import torch

from hlat.checkpoint.errors import CheckpointError
from hlat.checkpoint.manager import CheckpointManager
from hlat.cli import USER_ERROR_EXIT, main
from hlat.faults import FaultSpecError, fault_spec


def _save(directory):
    return CheckpointManager(directory, keep_last=None).save(1, {"w": torch.zeros(2)}, {"x": 1}, None)


def test_faults_only_under_the_testing_switch(tmp_path, monkeypatch):
    monkeypatch.setenv("HLAT_FAULT", "fail-write:1:0")
    monkeypatch.setenv("HLAT_FAULT_MARKER", str(tmp_path / "marker"))
    monkeypatch.delenv("HLAT_TESTING")  # as in production: the fault is inert
    assert _save(tmp_path / "production").path.is_dir() and not (tmp_path / "marker").exists()
    monkeypatch.setenv("HLAT_TESTING", "1")
    with pytest.raises(CheckpointError, match="injected fault fail-write"):
        _save(tmp_path / "testing")


@pytest.mark.parametrize(
    "spec",
    ["bogus:1:0", "step:one:0", "step:1", "step:1:0:2", "slow:1:0", "slow:1:0:fast", "sigint:1:0:x", "hang:-1:0"],
)
def test_malformed_fault_is_one_line(spec, monkeypatch, capsys):
    monkeypatch.setenv("HLAT_FAULT", spec)
    with pytest.raises(FaultSpecError, match="expected FAULT:STEP:RANK"):
        fault_spec()
    capsys.readouterr()
    assert main(["train", "--train.steps", "1"]) == USER_ERROR_EXIT
    err = capsys.readouterr().err
    assert err.startswith(f"hlat train: HLAT_FAULT={spec!r}: expected") and len(err.strip().splitlines()) == 1, err


def test_wellformed_faults_parse(monkeypatch):
    for spec, parsed in [
        ("sigint:3:1:2", ("sigint", 3, 1, 2)),
        ("slow:1:1:0.05", ("slow", 1, 1, 0.05)),
        ("fail-hash:2:0", ("fail-hash", 2, 0, None)),
    ]:
        monkeypatch.setenv("HLAT_FAULT", spec)
        assert fault_spec() == parsed
