"""What a run reports about itself: memory, step time and data wait in every record; no host
synchronisation between logging steps; torch.profiler traces; Weights & Biases (offline)."""

from __future__ import annotations

import json
import re
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from deps import require
from hlat.config import wandb as wandb_config
from hlat.config.load import load_config
from hlat.config.wandb import WandbConfig
from hlat.errors import ConfigError
from hlat.metrics.sinks import MetricSinks, read_metrics
from hlat.metrics.wandb_sink import WandbSink
from hlat.train.trainer import Trainer
from runs import tiny_args

# Every way a tensor's value reaches Python: on a device, each one waits for the queued work.
SYNCS = ("item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__")
LOADER_DELAY_S = 0.01  # per micro-batch: data wait the records must show


def test_records_carry_memory_time_and_data_wait_with_no_host_sync_between_logging_steps(
    small_corpus, tmp_path, monkeypatch, capsys
):
    """6 steps of 4 micro-batches, logged every 3, profiling steps 2-3. Every tensor read on the
    training thread is counted with the trainer's step and whether it happened inside a step: none
    may happen inside one, and the others only on logging steps (the loader's prefetch thread
    works on its own CPU tensors and is not counted)."""
    cfg = load_config(
        "tiny",
        None,
        tiny_args(
            small_corpus,
            tmp_path / "run",
            "--train.steps",
            "6",
            "--train.log_every",
            "3",
            "--checkpoint.every",
            "100",
            "--profile.steps",
            "2:3",
            "--train.price_per_node_hour",
            "3600",
        ),
    )
    messages: list[str] = []
    trainer = Trainer(cfg, out=messages.append)
    next_batch = trainer.loader.next_batch

    def slow_batch():
        time.sleep(LOADER_DELAY_S)
        return next_batch()

    monkeypatch.setattr(trainer.loader, "next_batch", slow_batch)
    training_thread, inside, reads = threading.get_ident(), [False], []
    for name in SYNCS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            if threading.get_ident() == training_thread:
                reads.append((_name, trainer.step, inside[0]))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    train_step = trainer._train_step

    def counted_step(window):
        inside[0] = True
        try:
            return train_step(window)
        finally:
            inside[0] = False

    monkeypatch.setattr(trainer, "_train_step", counted_step)
    trainer.fit()
    monkeypatch.undo()

    assert [r for r in reads if r[2]] == []  # nothing read back inside a training step
    assert {step for _, step, _ in reads} <= {3, 6}  # logging steps only
    assert {("tolist", 3, False), ("tolist", 6, False)} <= set(reads)  # the window's losses: the counting works
    records = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert [r["step"] for r in records] == [3, 6]
    for r in records:
        assert r["data_s"] >= 3 * trainer.accum * LOADER_DELAY_S  # every micro-batch's wait is counted
        assert r["data_frac"] == pytest.approx(r["data_s"] / (3 * r["step_s"]), rel=1e-6) and 0 < r["data_frac"] < 1
        assert r["mem_peak_gib"] >= r["mem_rss_gib"] > 0.05  # this process holds torch: tens of MiB at least
    # $3600 per node-hour is $1 per second of this one node: the cost is the training loop's seconds so far
    assert records[0]["cost"] == pytest.approx(3 * records[0]["step_s"], rel=1e-6)
    assert records[1]["cost"] == pytest.approx(3 * (records[0]["step_s"] + records[1]["step_s"]), rel=1e-6)
    assert records[1]["cost_per_mtok"] == pytest.approx(records[1]["cost"] / records[1]["tokens"] * 1e6)
    saved = trainer.checkpoints.load_shared(trainer.checkpoints.latest())["progress"]
    assert saved["train_s"] == pytest.approx(records[1]["cost"], rel=1e-6)  # a resumed run goes on from it
    out = capsys.readouterr().out
    assert re.search(r"\| \d+\.\d\d s/step \| data \d+% \| mem \d+\.\d\d GiB", out)
    assert f"| cost {records[1]['cost']:,.2f} so far, " in out
    trace = tmp_path / "run" / "profile" / "rank0_steps2-3.pt.trace.json"
    assert [m for m in messages if m.startswith("profile:")] == [
        f"profile: wrote {trace} (one set per rank; docs/training.md says how to open them)"
    ]
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") == "aten::mm" for e in events)  # the model's matmuls, on the CPU


@pytest.mark.parametrize(
    "steps, problem",
    [
        ("3:2", "write A:B with 1 <= A <= B"),
        ("0:2", "write A:B with 1 <= A <= B"),
        ("2", "write A:B with 1 <= A <= B"),
        ("2:9", "ends after the run's last step (train.steps=6); trace steps within 1:6"),
    ],
)
def test_profile_steps_are_checked(steps, problem):
    with pytest.raises(ConfigError, match=re.escape(problem)) as err:
        load_config("tiny", None, ["--train.steps", "6", "--profile.steps", steps])
    assert err.value.problems[0][0] == "profile.steps"


def test_wandb_asked_for_but_not_installed_fails_at_start_up(monkeypatch):
    monkeypatch.setattr(wandb_config, "wandb_installed", lambda: False)
    with pytest.raises(
        ConfigError, match=re.escape("wandb.enabled: the wandb package is not installed; pip install 'hlat[wandb]'")
    ):
        load_config("tiny", None, ["--wandb.enabled", "true"])


def test_wandb_runs_hold_the_records_of_each_stretch_of_kept_steps(tmp_path, monkeypatch):
    """Steps 2 and 4 logged, then a rollback to step 2 and step 4 logged again: metrics.jsonl keeps
    the new step 4; W&B, which cannot delete, has a second run from step 2 that holds it."""
    require("wandb")
    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    sink = WandbSink(WandbConfig(enabled=True, mode="offline"), "tiny", run_dir, {"optim": {"lr": 0.003}})
    sinks = MetricSinks(run_dir, total_steps=6, start_step=0, tensorboard=False, wandb=sink)
    sinks.log(_record(2, 5.0))
    sinks.log(_record(4, 9.0))  # a spike
    sinks.log_validation(4, 1024, 4.5)
    sinks.rewind(2)
    sinks.log(_record(4, 4.0))
    sinks.close()

    assert [(r["step"], r["loss"]) for r in read_metrics(run_dir)] == [(2, 5.0), (4, 4.0)]
    runs = {}
    for path in (tmp_path / "wandb" / "wandb").glob("offline-run-*/run-*.wandb"):
        records = _complete_wandb_records(path)
        run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
        config = {item.key: json.loads(item.value_json) for item in run.config.update}
        history = [
            {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
            for r in records
            if r.WhichOneof("record_type") == "history"
        ]
        runs[run.display_name] = (run.run_group, config, history)
    assert set(runs) == {"tiny", "tiny from step 2"}
    for name, start in (("tiny", 0), ("tiny from step 2", 2)):
        group, config, _ = runs[name]
        assert group == "tiny" and config["optim"] == {"lr": 0.003} and config["start_step"] == start
    first = [(h["_step"], h.get("loss"), h.get("val_loss")) for h in runs["tiny"][2]]
    assert first == [(2, 5.0, None), (4, 9.0, 4.5)]  # a step's records share one history row
    assert [(h["_step"], h["loss"], h["mem_peak_gib"]) for h in runs["tiny from step 2"][2]] == [(4, 4.0, 1.5)]


def _record(step: int, loss: float) -> dict[str, float]:
    return {
        "step": step,
        "loss": loss,
        "ppl": 1.0,
        "lr": 1e-3,
        "grad_norm": 1.0,
        "param_norm": 10.0,
        "tokens": 512 * step,
        "tokens_per_s": 100.0,
        "mfu": 0.01,
        "step_s": 0.5,
        "data_s": 0.1,
        "data_frac": 0.1,
        "mem_peak_gib": 1.5,
        "time": 1.7e9 + step,
        "elapsed_s": 0.5 * step,
        "eta_s": 0.5 * (6 - step),
    }


def _complete_wandb_records(path: Path, timeout_s: float = 30.0) -> list:
    """The records of a finished W&B run's file. wandb's service may still be writing it when
    run.finish() returns (seen holding only its header): wait for the run's exit record."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = list(_wandb_records(path))
        kinds = [r.WhichOneof("record_type") for r in records]
        if "exit" in kinds:
            return records
        assert time.monotonic() < deadline, (
            f"{path} ({path.stat().st_size} bytes) has no exit record after {timeout_s} s: {kinds}"
        )
        time.sleep(0.1)


def _wandb_records(path: Path) -> Iterator:
    """The protobuf records of a .wandb file: a 7-byte header (":W&B", magic, version), then
    LevelDB's log format: 32 KiB blocks of chunks, each with a 7-byte header (CRC32, length, type:
    1 full, 2 first, 3 middle, 4 last); a block's tail shorter than a header is padding."""
    from wandb.proto import wandb_internal_pb2

    data, pos, pending = path.read_bytes(), 7, b""
    if data[:4] != b":W&B":  # not even the header yet
        return
    while pos + 7 <= len(data):
        room = 32768 - pos % 32768
        if room < 7:
            pos += room
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero-filled rest of a block
            pos += room
            continue
        if pos + 7 + length > len(data):  # still being written
            return
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def test_a_kill_during_the_metrics_rewrite_leaves_the_previous_file(tmp_path, monkeypatch):
    """A resume rewrites metrics.jsonl (records up to its step, torn lines dropped); the rewrite
    failing after part of its output is written leaves the old file whole, and the next resume
    rewrites it."""
    metrics = tmp_path / "metrics.jsonl"
    old = "".join(json.dumps({"step": s, "loss": 1.0 / s}) + "\n" for s in (1, 2, 3, 4)) + '{"step": 5, "lo'
    metrics.write_text(old)
    real_write = Path.write_bytes

    def torn(self, data):  # half of the new file, then the process dies
        real_write(self, data[: len(data) // 2])
        raise KeyboardInterrupt("killed mid-write")

    monkeypatch.setattr(Path, "write_bytes", torn)
    with pytest.raises(KeyboardInterrupt):
        MetricSinks(tmp_path, 10, 2, tensorboard=False)
    assert metrics.read_text() == old
    monkeypatch.undo()
    MetricSinks(tmp_path, 10, 2, tensorboard=False).close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2] and not metrics.read_text().endswith("lo")
