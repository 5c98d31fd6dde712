"""`hlat doctor`: pre-flight checks as one process and under torchrun; failures name the fix."""

from types import SimpleNamespace

import pytest

from hlat.cli import main
from hlat.commands import preflight
from hlat.config.load import load_config
from hlat.model import count_params
from runs import Scenario, ScenarioResults

# a launch of its own, started from the shared launch (tests/launch_runs.py), with the collective
# timeout _restore_timeout gives the tests here
DOCTOR = ["-m", "hlat", "doctor", "--train.run_dir", "{out}/run", "--bandwidth-mib", "4"]
SCENARIOS = [
    Scenario(
        "doctor-torchrun",
        "launch_runs.py:command",
        kwargs={"nproc": 2, "target": DOCTOR, "env": {"HLAT_COLLECTIVE_TIMEOUT_S": "60"}, "timeout": 300},
    )
]


@pytest.fixture(autouse=True)
def _restore_timeout(monkeypatch):
    monkeypatch.setenv("HLAT_COLLECTIVE_TIMEOUT_S", "60")  # the command sets it; undone after each test


def test_single_process_passes_and_prints_the_table(tmp_path, capsys):
    assert main(["doctor", "--train.run_dir", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    assert "check" in out and "figure" in out and "all checks passed" in out
    for name in ("devices", "layout", "run dir writable", "disk", "all_reduce latency"):
        assert name in out
    assert not (tmp_path / "run").exists(), "the writability probe or the directory made for it was left behind"
    (tmp_path / "kept").mkdir()  # a run directory that existed stays
    assert main(["doctor", "--train.run_dir", str(tmp_path / "kept")]) == 0
    assert (tmp_path / "kept").is_dir() and not list((tmp_path / "kept").iterdir())


def test_disk_fails_when_the_checkpoints_do_not_fit(tmp_path, capsys):
    assert main(["doctor", "--train.run_dir", str(tmp_path / "run"), "--checkpoint.keep_last", "1000000000"]) == 1
    out = capsys.readouterr().out
    assert "FAIL disk (rank 0)" in out and "lower --checkpoint.keep_last" in out, out
    assert "1 check(s) failed" in out


def test_layout_that_does_not_fit_the_world_fails(tmp_path, capsys):
    assert main(["doctor", "--train.run_dir", str(tmp_path / "run"), "--parallel.tp", "2"]) == 1
    assert "launch a multiple of 2 processes" in capsys.readouterr().out


def test_checkpoint_bytes_follow_precision_retention_and_archives():
    cfg = load_config("tiny", None, ["--precision.mode", "bf16-sr", "--checkpoint.keep_last", "3"])
    n = count_params(cfg.model)
    assert preflight.checkpoint_bytes(cfg)[0] == 4 * 6 * n  # 3 kept + 1 in flight, bf16 weights + 2 moments
    tokens = cfg.train.steps * cfg.train.global_batch * cfg.data.seq_len
    cfg.checkpoint.archive_every_tokens = tokens // 2
    cfg.precision.mode = "fp32"
    assert preflight.checkpoint_bytes(cfg)[0] == 4 * 12 * n + 2 * 4 * n


def test_torchrun_two_processes_pass_with_a_bandwidth_figure(scenarios: ScenarioResults):
    done = SimpleNamespace(**scenarios.json("doctor-torchrun", "result.json"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert "hlat doctor: tiny, 2 processes" in done.stdout and "all checks passed" in done.stdout
    assert "[rank 1] ok    devices" in done.stdout
    assert "busbw" in done.stdout and "pp 1 x dp 2 x tp 1" in done.stdout
