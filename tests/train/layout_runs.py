"""Scenario functions (tests/runs.py) that run `hlat train`'s Trainer on the tiny model in this
scenario's layout: train, resume, reshard, save. Every rank writes OUT/summary.rank<r>.json."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
from pathlib import Path
from unittest import mock

import torch.distributed as dist

from hlat.config.load import load_config
from hlat.train.trainer import Trainer

sys.path.insert(0, str(Path(__file__).parents[1]))
from runs import ScenarioContext, tiny_args  # noqa: E402


def train(
    ctx: ScenarioContext,
    steps: int,
    extra: list[str] = (),
    resume: str = "auto",
    start_from: str | None = None,
    save_only: bool = False,
    env: dict[str, str] | None = None,
) -> None:
    """Train (or, with `save_only`, resume and save at once) ctx.out/run to `steps`, in a copy of
    scenario `start_from`'s run directory if given (so that one stays as it was); `env` is set
    for this scenario only (e.g. an HLAT_FAULT)."""
    with mock.patch.dict(os.environ, env or {}):
        _train(ctx, steps, extra, resume, start_from, save_only)


def _train(
    ctx: ScenarioContext, steps: int, extra: list[str], resume: str, start_from: str | None, save_only: bool
) -> None:
    run = ctx.out / "run"
    if start_from and ctx.rank == 0:
        shutil.copytree(ctx.root / start_from / "run", run)
    if ctx.world > 1:
        dist.barrier()
    extra = [arg.format(root=ctx.root) for arg in extra]  # "{root}/name": another scenario's files
    messages: list[str] = []
    trainer = Trainer(
        load_config("tiny", None, tiny_args(ctx.corpus, run, "--train.steps", str(steps), *extra)),
        resume=resume,
        out=messages.append,
    )
    console = io.StringIO()  # what the progress bar writes (e.g. the tasks' timing line)
    with contextlib.redirect_stdout(console):
        if save_only:
            trainer.save()
            trainer.checkpoints.wait()
            trainer.loader.close()
            losses: list[float] = []
        else:
            losses = trainer.fit().losses
    summary = {
        "step": trainer.step,
        "losses": losses,
        "messages": messages,
        "console": console.getvalue(),
        "tokens_emitted": trainer.loader.tokens_emitted,
    }
    (ctx.out / f"summary.rank{ctx.rank}.json").write_text(json.dumps(summary))


def mixture_sources(ctx: ScenarioContext, docs: int, chars: int) -> None:
    """Two text sources for a mixture, `docs` short documents each (consecutive lines of the
    corpus up to `chars` characters): short documents make the mixture's granularity fine."""
    files = sorted(ctx.corpus.iterdir())
    for name, half in (("a", files[: len(files) // 2]), ("b", files[len(files) // 2 :])):
        lines = [line for f in half for line in f.read_text().splitlines() if line.strip()]
        out, piece = ctx.out / name, ""
        out.mkdir()
        written = 0
        for line in lines:
            piece = f"{piece}\n{line}" if piece else line
            if len(piece) >= chars // 2:
                (out / f"{written:04d}.txt").write_text(piece[:chars])
                written, piece = written + 1, ""
                if written == docs:
                    break


def interrupted(ctx: ScenarioContext, steps: int, fault: str, extra: list[str] = ()) -> None:
    """Train with HLAT_FAULT `fault` (a signal to one rank, "sigterm:STEP:RANK"), then resume: the
    resumed run's summary as `train` writes it, and what each rank's interrupted run raised in
    OUT/interrupted.rank<r>.txt."""
    from hlat.train.interrupt import Interrupted

    env = {"HLAT_FAULT": fault, "HLAT_FAULT_MARKER": str(ctx.out / "fault-done")}
    args = tiny_args(ctx.corpus, ctx.out / "run", "--train.steps", str(steps), *extra)
    with mock.patch.dict(os.environ, env):
        try:
            Trainer(load_config("tiny", None, args), out=lambda _: None).fit()
            stopped = "not interrupted"
        except Interrupted as err:
            stopped = str(err)
    (ctx.out / f"interrupted.rank{ctx.rank}.txt").write_text(stopped)
    _train(ctx, steps, list(extra), "require", None, False)
