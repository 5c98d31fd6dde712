"""The training run's loop; everything besides the step itself (metrics, validation, checkpoints,
recovery, ...) is a callback (hlat.train.callbacks).

What a run is made of is built by hlat.train.build; where it starts and what its checkpoints hold
is hlat.train.resume; the model, its optimizers and the step, hlat.train.train_module. The same
code runs as one process or under torchrun: the layout (hlat.parallel.mesh) says which rank does
what, and only the global rank 0 writes logs.
"""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hlat.checkpoint.manager import CheckpointManager, SaveStats
from hlat.checkpoint.restore import holds_training_state
from hlat.config.run import RunConfig
from hlat.data.batch import Batch
from hlat.device.record import device_record
from hlat.errors import ConfigError, UserError
from hlat.faults import fault_spec, maybe_kill, maybe_slow
from hlat.metrics.cost import cost_fields, node_count
from hlat.metrics.memory import MemoryMeter
from hlat.metrics.sinks import perplexity
from hlat.optim import lr_multiplier
from hlat.parallel.hang import watch
from hlat.parallel.parallelize import ParallelModel
from hlat.parallel.world import world_from_env
from hlat.train.build import build_run
from hlat.train.callbacks.base import Callback
from hlat.train.interrupt import Interrupted, Interrupts
from hlat.train.optimizers import Optimizers
from hlat.train.resume import RESUME_MODES, Progress
from hlat.train.run_lock import RunDirLock
from hlat.train.train_module import StepOutput
from hlat.train.window import Window


@dataclass
class TrainSummary:
    run_dir: Path
    step: int
    tokens: int
    final_loss: float | None  # mean loss of the last logging window; None if no step ran
    losses: list[float]  # the per-step losses of this invocation, in order (global mean)
    plot: Path | None = None  # the loss plot, once drawn (train.plot)


class Trainer:
    """`callbacks` run after hlat's own, in order, and before the metrics sinks; those that
    train.callbacks names ("package.module:ClassName") come first."""

    def __init__(
        self,
        cfg: RunConfig,
        resume: str = "auto",
        out: Callable[[str], None] = print,
        callbacks: list[Callback] | None = None,
    ):
        if resume not in RESUME_MODES:
            raise ValueError(f"resume must be one of {RESUME_MODES}, got {resume!r}")
        problems = cfg.layout_problems(world_from_env()[0])  # a config loaded without the world size
        if problems:
            raise ConfigError(problems)
        fault_spec()  # a malformed HLAT_FAULT (tests only) is refused now, not at the step it names
        # one trainer per run directory, from before the first read of it to the end of fit()
        self._lock = RunDirLock.acquire(cfg.run_dir, out) if world_from_env()[1] == 0 else None
        try:
            self._build(cfg, resume, out, callbacks)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Let another trainer use the run directory (fit does it as it returns or raises)."""
        if self._lock is not None:
            self._lock.release()

    def _build(self, cfg: RunConfig, resume: str, out: Callable[[str], None], callbacks: list[Callback] | None) -> None:
        self.step, self.tokens, self.train_s = 0, 0, 0.0
        run = build_run(
            cfg, resume=resume, out=out, callbacks=list(callbacks or []),
            progress=self.progress, set_progress=self._set_progress,
            guard=self._lock.check if self._lock is not None else None,
        )  # fmt: skip
        self.cfg, self.resume, self.run_dir = run.cfg, resume, run.cfg.run_dir
        self.device, self.layout, self.out, self.tokenizer = run.device, run.layout, run.out, run.tokenizer
        self.data, self.loader, self.val_batches = run.data, run.data.loader, run.val_batches
        self.module, self.state, self.accum, self.peak = run.module, run.state, run.accum, run.peak
        self.recovery, self.callbacks, self.flops_per_token = run.recovery, run.callbacks, run.flops_per_token
        self.tokens_per_step = run.cfg.train.global_batch * run.cfg.data.seq_len
        self._set_progress(run.start)
        self.losses: list[float] = []  # this invocation's per-step losses, as logged
        self.window: Window  # the steps since the last logging step; from the start of fit
        self._rolled_back = False  # by a callback, in the window being judged
        self.stopping = False  # on an interrupt, after this step (hlat.train.interrupt)

    # --- what callbacks and tests read -------------------------------------------------------
    @property
    def model(self) -> ParallelModel:
        return self.module.model

    @property
    def optimizers(self) -> Optimizers:
        return self.module.optimizers

    @property
    def checkpoints(self) -> CheckpointManager:
        return self.state.checkpoints

    def emit(self, hook: str, *args: Any) -> None:
        """Call `hook` (a Callback method name) on every callback, in order."""
        for callback in self.callbacks:
            getattr(callback, hook)(self, *args)

    def request_stop(self, why: str) -> None:
        """Stop at the next step boundary with a checkpoint of that step, on every rank (a callback's
        clean way to end the run, e.g. when a metrics sink's disk is full)."""
        self._interrupts.request(why)

    def checkpoint_due(self) -> bool:
        """Every checkpoint.every steps, at the last, and when the run stops on an interrupt."""
        return self.stopping or self.step % self.cfg.checkpoint.every == 0 or self.step == self.cfg.train.steps

    def progress(self) -> Progress:
        return Progress(self.step, self.tokens, self.module.skipped_steps, self.train_s)

    def _set_progress(self, progress: Progress) -> None:
        self.step, self.tokens = progress.step, progress.tokens
        self.train_s = max(self.train_s, progress.train_s)  # a rollback does not refund the time spent
        self.module.skipped_steps = progress.skipped_steps

    def save(self) -> SaveStats:
        """Collective. Under checkpoint.async_save it returns once the state is staged."""
        return self.state.save(self.progress())

    def roll_back(self, path: Path) -> int:
        """Restore checkpoint `path` and skip the data read since it; return the steps undone.
        Collective; callbacks hear of it through on_rewind."""
        now = self.step
        self._set_progress(self.state.restore(path, self.out))
        self.data.skip(now - self.step)
        del self.losses[max(self.step - self._first_step, 0) :]  # those steps are redone on new data
        self._rolled_back = True
        self.emit("on_rewind", self.step)
        self.window.restart()
        return now - self.step

    # --- the loop ---------------------------------------------------------------------------
    def fit(self) -> TrainSummary:
        cfg, total = self.cfg, self.cfg.train.steps
        if self.step >= total:
            self.release()
            self.out(
                f"run already complete at step {self.step:,} in {self.run_dir}; raise --train.steps or pass --fresh"
            )
            return TrainSummary(self.run_dir, self.step, self.tokens, None, [])
        self.out(
            f"training {total - self.step:,} steps of {cfg.train.global_batch} x {cfg.data.seq_len} tokens "
            f"({self.accum} micro-batches of {cfg.train.micro_batch} per {self.data.per}) into {self.run_dir}"
        )
        final_loss, self._first_step = None, self.step
        interrupts = self._interrupts = Interrupts(cfg.train.interrupt_save_s, self.layout)
        try:
            with interrupts:
                self.emit("on_start")
                self._fit_started = time.perf_counter()
                self.window = Window(self._fit_started, MemoryMeter(self.device))
                self.module.train()
                while self.step < total:
                    self.emit("on_step_start")
                    output = self._train_step(self.window)
                    self.stopping = interrupts.stop_agreed()  # the same on every rank
                    # A checkpoint closes the window too: only steps judged good are ever saved.
                    if self.step % cfg.train.log_every == 0 or self.step == total or self.checkpoint_due():
                        losses, skipped = self._read_window()
                        if self._rolled_back:
                            continue
                        self.losses += losses
                        final_loss = self._log_window(losses, skipped, output)
                    self.emit("on_step_end")  # when stopping, Checkpointing saves this step and waits for it
                    if self.stopping and self.step < total:
                        resume = f"saved step {self.step}; run the same command to resume from step {self.step}"
                        if not interrupts.signum:  # asked for (hlat.train.interrupt.Interrupts.request)
                            raise UserError(f"stopped: {interrupts.requested}; {resume}")
                        interrupts.disarm()
                        raise Interrupted(f"interrupted ({interrupts.name}): {resume}", interrupts.signum)
                summary = TrainSummary(self.run_dir, self.step, self.tokens, final_loss, self.losses)
                self.emit("on_end", summary)
        except KeyboardInterrupt as error:
            stopped = error if isinstance(error, Interrupted) else self._unsaved(interrupts)
            self.emit("on_failure", stopped)
            raise stopped from None
        except BaseException as error:
            self.emit("on_failure", error)
            raise
        finally:
            self.data.close()
            self.release()
        return summary

    def _unsaved(self, interrupts: Interrupts) -> Interrupted:
        """A stop without a checkpoint of its own: where a resume starts (rank 0's view)."""
        newest = [path for path in self.checkpoints.checkpoints() if holds_training_state(path)]
        resume = (
            f"run the same command to resume from step {int(newest[-1].name.removeprefix('step_'))} ({newest[-1]})"
            if newest
            else "no checkpoint exists: the same command starts over"
        )
        why = f": {interrupts.aborted}" if interrupts.aborted else ""
        return Interrupted(
            f"interrupted ({interrupts.name}{why}) in step {self.step + 1}, nothing saved; {resume}",
            interrupts.signum or signal.SIGINT,
        )

    def _train_step(self, window: Window) -> StepOutput:
        """One optimizer step (its LR and pre-clip grad norm on device). No host sync, unless the step
        data or the train module needs one; a step the train module did not commit is read and run
        again (its data positions are back where they were)."""
        maybe_kill("step", self.step + 1, self.layout.rank)
        while True:
            waited = time.perf_counter()
            batches = [self._to_device(b) for b in self.data.read()]  # may set the counters (a heal)
            window.data_s += time.perf_counter() - waited
            maybe_kill("compute", self.step + 1, self.layout.rank)
            lr = self.cfg.optim.lr * lr_multiplier(self.cfg.schedule, self.step)
            computing = time.thread_time()  # grows with this rank's work, not while it waits for the others
            with watch(self.layout, "training step (forward, backward, gradient reduction, optimizer)", self.step + 1):
                maybe_slow(self.step + 1, self.layout.rank)
                output = self.module.step(batches, lr, self.step + 1)
            window.compute_s += time.thread_time() - computing
            if output.committed:
                break
        window.steps += 1
        self.step += 1
        self.tokens += self.tokens_per_step
        return output

    def _to_device(self, batch: Batch) -> Batch:
        """Where the device's record says so (CUDA, XPU), through pinned memory without waiting for
        the copy (the stream orders it before the forward); elsewhere an ordinary copy (none on the CPU)."""
        if device_record(self.device.type).pin_memory:
            return batch.pin_memory().to(self.device, non_blocking=True)
        return batch.to(self.device)

    def _read_window(self) -> tuple[list[float], int]:
        """The one host sync of a logging step; callbacks judge the losses (and may roll back)."""
        with watch(self.layout, "loss all-reduce of a logging step", self.step):
            losses, skipped = self.module.read_losses()
        self._rolled_back = False
        self.emit("on_window", losses, skipped)
        return losses, skipped

    def _log_window(self, losses: list[float], skipped: int, output: StepOutput) -> float:
        """Log the window's record (collective: norms and token counts); return its mean loss."""
        finite = [x for x in losses if math.isfinite(x)]  # a skipped step's loss may be NaN
        mean = sum(finite) / len(finite) if finite else math.nan
        elapsed = time.perf_counter() - self.window.started
        tokens_per_s = len(losses) * self.tokens_per_step / elapsed
        self.train_s += elapsed
        with watch(self.layout, "metric all-reduces (parameter norm, tokens per source)", self.step):
            param_norm, source_tokens = self.module.param_norm().item(), self.data.tokens_by_source()
        achieved = tokens_per_s * self.flops_per_token
        steps_here = self.step - self._first_step  # this launch's: a resume's rate, not the first run's
        per_step = (time.perf_counter() - self._fit_started) / max(steps_here, 1)
        self.emit(
            "on_log",
            {
                "step": self.step,
                "loss": mean,
                "step_losses": losses,  # each step's since the last record: the loss plot draws every step
                "ppl": perplexity(mean),
                "lr": output.lr,
                "grad_norm": output.grad_norm.item(),
                "param_norm": param_norm,
                "tokens": self.tokens,
                "tokens_per_s": tokens_per_s,
                "mfu": self.peak.mfu(achieved, self.layout.world),
                "mfu_of_gemm": self.peak.mfu_of_gemm(achieved, self.layout.world),
                "skipped_steps": skipped,
                "step_s": elapsed / len(losses),
                "data_s": self.window.data_s,
                "data_frac": self.window.data_s / elapsed,
                **self.window.memory.read(),
                "source_tokens": source_tokens,
                **cost_fields(
                    self.cfg.train.price_per_node_hour, node_count(self.layout.world), self.train_s, self.tokens
                ),
                "time": time.time(),  # wall clock (Unix seconds) when the record was made
                "elapsed_s": self.train_s,  # training time over the whole run, resumes included
                "eta_s": (self.cfg.train.steps - self.step) * per_step,  # to train.steps at this launch's rate
            },
        )
        self.window.restart()
        return mean
