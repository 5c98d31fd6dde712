"""Where metrics go: metrics.jsonl, TensorBoard events, the console (a line per record and a
progress bar) and, optionally, Weights & Biases, each a Sink; and the loss plot drawn from
metrics.jsonl."""

from __future__ import annotations

import errno
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from hlat.atomic_files import append_text, atomic_path, make_dir, write_atomic
from hlat.metrics.sink import Sink
from hlat.metrics.wandb_sink import WandbSink
from hlat.progress import duration

METRICS_FILE = "metrics.jsonl"
PLOT_FILE = "loss.png"


class MetricSinks:
    """Fan one record per log step out to every sink. Each step is recorded once: a resumed run, or
    a rollback, first drops the records past the step it restarts from (see `rewind`).

    A sink that meets a full disk or quota is dropped, and `full` (the run's stop request) hears
    why, once: training goes on to its next step boundary, where it saves and stops."""

    def __init__(
        self,
        run_dir: Path,
        total_steps: int,
        start_step: int,
        tensorboard: bool,
        wandb: WandbSink | None = None,
        full: Callable[[str], None] = lambda _: None,
    ):
        self.full = full
        self.sinks: list[Sink] = [JsonlSink(run_dir / METRICS_FILE)]
        if wandb is not None:
            self.sinks.append(wandb)
        if tensorboard:
            self.sinks.append(TensorBoardSink(run_dir / "tensorboard"))
        self.sinks.append(ConsoleSink(total_steps, start_step))
        self.rewind(start_step)

    def rewind(self, step: int) -> None:
        """Forget what was logged after `step`, where the run continues from (resume or rollback)."""
        for sink in self.sinks:
            sink.rewind(step)

    def advance(self) -> None:
        for sink in self.sinks:
            sink.advance()

    def log(self, record: dict[str, Any]) -> None:
        self._each(lambda sink: sink.log(record))

    def log_validation(self, step: int, tokens: int, loss: float) -> None:
        record = {"step": step, "tokens": tokens, "val_loss": loss, "val_ppl": perplexity(loss)}
        self._each(lambda sink: sink.log_validation(record))

    def _each(self, write: Callable[[Sink], None]) -> None:
        for sink in list(self.sinks):
            try:
                write(sink)
            except OSError as err:
                if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                self.sinks.remove(sink)
                self.full(f"{sink.target}: {os.strerror(err.errno).lower()}")

    def log_tasks(self, step: int, tokens: int, scores: dict[str, float], seconds: float) -> None:
        """Downstream task scores ({"<task>/<metric>": value}) as eval/<task>/<metric>."""
        record = {
            "step": step,
            "tokens": tokens,
            **{f"eval/{name}": value for name, value in scores.items()},
            "eval_seconds": seconds,
        }
        self._each(lambda sink: sink.log_tasks(record))

    def close(self) -> None:
        for sink in reversed(self.sinks):  # the console's bar first, as it was opened last
            sink.close()


class JsonlSink(Sink):
    """metrics.jsonl: one record per line, each written whole in one write."""

    def __init__(self, path: Path):
        self.path, self.target = path, str(path)

    def rewind(self, step: int) -> None:
        broken = _truncate_after(self.path, step)
        if broken:
            tqdm.write(
                f"{self.path}: dropped {broken} line(s) that were not JSON (a record cut short "
                "when the run was killed mid-write)",
                file=sys.stdout,
            )

    def log(self, record: dict[str, Any]) -> None:
        append_text(self.path, json.dumps(record) + "\n")

    log_validation = log_tasks = log


class TensorBoardSink(Sink):
    """Training values as train/<key> (a dict value, e.g. tokens per source, as <key>/<name>),
    validation as val/loss, tasks as eval/<task>/<metric>."""

    def __init__(self, directory: Path):
        self.directory, self.target = directory, str(directory)
        self.writer: Any = None

    def rewind(self, step: int) -> None:
        from torch.utils.tensorboard import SummaryWriter  # imports tensorboard: only when wanted

        if self.writer is not None:
            self.writer.close()
        # purge_step makes TensorBoard hide the events of steps >= it written before this point.
        self.writer = SummaryWriter(str(make_dir(self.directory)), purge_step=step + 1)

    def log(self, record: dict[str, Any]) -> None:
        for key, value in record.items():
            if key not in ("step", "time") and isinstance(value, (int, float)):  # events carry their own time
                self.writer.add_scalar(f"train/{key}", value, record["step"])
            elif isinstance(value, dict):
                for name, sub in value.items():
                    self.writer.add_scalar(f"{key}/{name}", sub, record["step"])

    def log_validation(self, record: dict[str, Any]) -> None:
        self.writer.add_scalar("val/loss", record["val_loss"], record["step"])

    def log_tasks(self, record: dict[str, Any]) -> None:
        for key, value in record.items():
            if key.startswith("eval/"):
                self.writer.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class ConsoleSink(Sink):
    """One line per record on stdout; on terminals also a live progress bar (the lines carry the
    history in logs and CI)."""

    target = "stdout"

    def __init__(self, total_steps: int, start_step: int):
        self.bar = tqdm(
            total=total_steps, initial=start_step, unit="step", dynamic_ncols=True, disable=not sys.stderr.isatty()
        )

    def rewind(self, step: int) -> None:
        self.bar.n = step
        self.bar.refresh()

    def advance(self) -> None:
        self.bar.update(1)

    def log(self, record: dict[str, Any]) -> None:
        self.bar.set_postfix(
            loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}", mfu=_percent(record["mfu"])
        )
        line = (
            f"step {record['step']:>7} | loss {record['loss']:.4f} | ppl {record['ppl']:.1f} | lr {record['lr']:.2e} | "
            f"grad {record['grad_norm']:.3f} | param {record['param_norm']:.1f} | {record['tokens_per_s']:,.0f} tok/s | "
            f"mfu {_percent(record['mfu'])} | {record['tokens']:,} tokens | {record['step_s']:.2f} s/step | "
            f"data {record['data_frac']:.0%} | mem {record['mem_peak_gib']:.2f} GiB | "
            f"elapsed {duration(record['elapsed_s'])} | eta {duration(record['eta_s'])}"
        )
        if "slowest_rank" in record:  # multi-process CPU runs (hlat.parallel.slow_ranks)
            line += f" | slowest rank {record['slowest_rank']} +{record['slowest_lag_s']:.3f} s (score {record['slowest_score']:.0%})"
        if "cost" in record:  # train.price_per_node_hour given
            line += f" | cost {record['cost']:,.2f} so far, {record['cost_per_mtok']:,.4g} per M tokens"
        self.bar.write(line, file=sys.stdout)

    def log_validation(self, record: dict[str, Any]) -> None:
        self.bar.write(
            f"step {record['step']:>7} | validation loss {record['val_loss']:.4f} | ppl {record['val_ppl']:.1f}",
            file=sys.stdout,
        )

    def log_tasks(self, record: dict[str, Any]) -> None:
        shown = " | ".join(
            f"{key.removeprefix('eval/')} {value:.4f}" for key, value in record.items() if key.startswith("eval/")
        )
        self.bar.write(
            f"step {record['step']:>7} | {shown} | tasks took {record['eval_seconds']:.1f} s", file=sys.stdout
        )

    def close(self) -> None:
        self.bar.close()


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of a run's metrics.jsonl, in order; lines that are not JSON are left out."""
    return [record for _, record in _read_lines(Path(run_dir) / METRICS_FILE)[0]]


def plot_loss(run_dir: Path, title: str) -> Path | None:
    """Training loss against tokens seen, as a PNG in the run directory."""
    records = read_metrics(run_dir)
    if not records:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    val = [r for r in records if "val_loss" in r]
    ax.plot(*loss_points(records), lw=1.5, label="train")
    if val:
        ax.plot([r["tokens"] for r in val], [r["val_loss"] for r in val], "o-", lw=1.5, label="validation")
        ax.legend()
    ax.set_xlabel("tokens seen")
    ax.set_ylabel("loss (nats/token)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(run_dir) / PLOT_FILE
    with atomic_path(path) as temporary:
        fig.savefig(temporary, format="png")
    plt.close(fig)
    return path


def loss_points(records: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """(tokens seen, loss) of every step the training records cover, from step 1: each record's
    step_losses (its window's steps) at the tokens of their steps, interpolated from the record
    before it; a record without them (older runs) is its window's mean at its own tokens."""
    tokens: list[float] = []
    losses: list[float] = []
    before_step, before_tokens = 0, 0
    for record in (r for r in records if "loss" in r):
        window = record.get("step_losses") or [record["loss"]]
        per_step = (record["tokens"] - before_tokens) / max(record["step"] - before_step, 1)
        tokens += [record["tokens"] - (len(window) - 1 - i) * per_step for i in range(len(window))]
        losses += window
        before_step, before_tokens = record["step"], record["tokens"]
    return tokens, losses


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.1%}"  # None: no peak known for the device


def perplexity(loss: float) -> float:
    return math.exp(min(loss, 50.0))  # capped: a diverged run should print a number, not overflow


def _read_lines(path: Path) -> tuple[list[tuple[str, dict[str, Any]]], int]:
    """(line, record) for each record of a JSONL file, and the number of lines that are not JSON
    (a record cut short when the writing process was killed mid-write); nothing if no file."""
    if not path.is_file():
        return [], 0
    records, broken = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            records.append((line, json.loads(line)))
        except json.JSONDecodeError:
            broken += 1
    return records, broken


def _truncate_after(path: Path, step: int) -> int:
    """Keep the records of steps <= `step`, dropping lines that are not JSON (their count is
    returned). The file is replaced atomically: a kill during the rewrite leaves the old one."""
    if not path.is_file():
        return 0
    records, broken = _read_lines(path)
    write_atomic(path, "".join(line + "\n" for line, record in records if record["step"] <= step))
    return broken
