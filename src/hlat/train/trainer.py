"""The training run: build every component from the config, then loop; everything besides the
step itself (metrics, validation, checkpoints, recovery, ...) is a callback (hlat.train.callbacks).

Where the run starts and what its checkpoints hold is hlat.train.resume; the model, its
optimizers and the step, hlat.train.train_module. The same code runs as one process or under
torchrun: the layout (hlat.parallel.mesh) says which rank does what, and only the global rank 0
writes logs.
"""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hlat.checkpoint.manager import CheckpointManager, SaveStats
from hlat.checkpoint.restore import holds_training_state
from hlat.config.data import default_cache_dir
from hlat.config.data_paths import entry_kind, source_entries
from hlat.config.run import RunConfig
from hlat.data import Validation, build_data_tokenizer, build_loader
from hlat.data.batch import Batch
from hlat.data.packing import PackedLoader
from hlat.device.record import device_record
from hlat.device.resolve import resolve_device
from hlat.device.rounding import stochastic_rounding
from hlat.device.runtime import collective_device, total_memory
from hlat.errors import ConfigError
from hlat.eval.in_training import InTrainingTasks
from hlat.float8 import check_float8, float8_line
from hlat.metrics.cost import cost_fields, node_count
from hlat.metrics.gemm_ceiling import model_shapes
from hlat.metrics.memory import MemoryMeter
from hlat.metrics.peak import Peak, resolve_peak, slow_bf16_warning
from hlat.metrics.profiling import StepProfiler
from hlat.metrics.sinks import perplexity
from hlat.model import count_params, flops_per_token
from hlat.model.attention import attention_backend_problem
from hlat.optim import lr_multiplier
from hlat.parallel.activation_checkpoint import attention_recomputed
from hlat.parallel.compile import decide_compile
from hlat.parallel.elastic_data import ElasticData
from hlat.parallel.hang import watch
from hlat.parallel.mesh import Layout, setup, world_from_env
from hlat.parallel.parallelize import ParallelModel, build_parallel_model
from hlat.parallel.slow_ranks import SlowRankReport
from hlat.planning.device_layout import device_layout
from hlat.precision import compute_dtype, state_bytes_per_param
from hlat.progress import Heartbeat
from hlat.testing.faults import fault_spec, maybe_kill, maybe_slow
from hlat.train.callbacks.base import Callback, load_callback
from hlat.train.callbacks.checkpointing import Checkpointing, WeightArchives
from hlat.train.callbacks.evaluation import Tasks, ValidationLoss
from hlat.train.callbacks.metrics import LossPlot, Metrics
from hlat.train.callbacks.profiler import Profiler
from hlat.train.callbacks.recovery import SpikeRecovery
from hlat.train.callbacks.sample import Sample
from hlat.train.callbacks.slow_ranks import SlowRanks
from hlat.train.elastic import ElasticGroup
from hlat.train.interrupt import Interrupted, Interrupts
from hlat.train.optimizers import Optimizers
from hlat.train.resume import (
    RESUME_MODES,
    Progress,
    RunState,
    check_init_from,
    check_run_dir,
    prepare_run_dir,
    record_run,
)
from hlat.train.run_lock import RunDirLock
from hlat.train.train_module import StepOutput, TrainModule
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
        self._lock = RunDirLock.acquire(cfg.run_dir) if world_from_env()[1] == 0 else None
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
        check_run_dir(cfg, resume)
        check_init_from(cfg, resume)
        user_callbacks = [load_callback(path) for path in cfg.train.callbacks] + list(callbacks or [])
        self.device = resolve_device(cfg.train.device, "--train.device", world_from_env()[2])
        cfg, layout_line = device_layout(
            cfg, world_from_env()[0], device_record(self.device.type), total_memory(self.device)
        )
        self.cfg, self.resume = cfg, resume
        self.layout: Layout = setup(cfg.parallel, self.device)
        narrow = float8_line(cfg.model.d_model, cfg.precision.float8_min_d_model) if cfg.precision.float8 else None
        float8 = cfg.precision.float8 and narrow is None
        if float8:  # before the data and the compile probe, which take minutes on large models
            check_float8(self.device, self.layout.tp)
        attention = attention_backend_problem(cfg.train.attention_backend, self.device)
        if attention:
            raise ConfigError([("train.attention_backend", attention)])
        self.out = out if self.layout.is_main else (lambda _: None)
        for line in (layout_line, narrow):
            if line:
                self.out(line)
        self.run_dir = cfg.run_dir

        torch.manual_seed(cfg.train.seed)
        self._build_data()
        # an elastic group reads whole shares of the global batch (as many as the groups present leave
        # it), each dealt over the group's data-parallel ranks (its tp ranks share their micro-batches)
        shares = cfg.elastic.max_groups * self.layout.dp if cfg.elastic.enabled else self.layout.dp
        self.accum = cfg.train.global_batch // shares // cfg.train.micro_batch
        self.tokens_per_step = cfg.train.global_batch * cfg.data.seq_len
        compiled = decide_compile(
            cfg.parallel.compile,
            cfg.model,
            self.device,
            cfg.precision.mode,
            cfg.train.micro_batch,
            cfg.data.seq_len,
            cfg.data.document_masking,
            self.layout.tp,
            cfg.parallel.activation_checkpoint,
            cfg.parallel.recompute_every_other_mm,
            attention_recomputed(cfg.parallel.recompute_attention, self.device),
            cfg.train.attention_backend,
            cfg.parallel.compile_mode,
            self.out,
        )
        self.out(compiled.line)
        with Heartbeat(f"model: building and initialising {count_params(cfg.model) / 1e6:,.1f}M parameters", self.out):
            model = build_parallel_model(
                cfg.model,
                cfg.parallel,
                self.layout,
                self.device,
                cfg.train.seed,
                self.accum,
                cfg.precision,
                compiled.enabled,
                float8,
                cfg.train.attention_backend,
            )
        tasks = (
            InTrainingTasks(
                cfg.eval, cfg.model, self.tokenizer, self.layout, self.device, cfg.precision.mode, cfg.data.bos
            )
            if cfg.eval.tasks_every
            else None
        )
        rounding = stochastic_rounding(cfg.precision.mode, device_record(self.device.type), os.environ)
        if rounding.line:
            self.out(rounding.line)
        self.module = TrainModule(
            model,
            cfg.optim,
            cfg.precision,
            cfg.parallel.dp_sharding,
            cfg.train.seed,
            cfg.recovery.max_grad_norm,
            rounding.hardware,
        )
        self.state = RunState(cfg, self.layout, self.device, self.module, self.loader)
        self.step, self.tokens, self.train_s = 0, 0, 0.0
        self.flops_per_token = flops_per_token(cfg.model, cfg.data.seq_len)
        self.peak = self._peak()
        lay = self.layout
        self.out(
            f"model: {count_params(cfg.model) / 1e6:,.1f}M parameters, {self.flops_per_token / 1e9:.3f} GFLOP/token; "
            f"{cfg.precision.mode} precision ({state_bytes_per_param(self.model.parameters()):.0f} bytes/parameter of "
            f"weights, grads and Adam state) on {lay.world} x {self.device.type} ({lay.describe}, "
            f"{cfg.parallel.dp_sharding}); {self.peak.summary}"
        )
        for warning in (self.peak.warning, slow_bf16_warning(self.device, cfg.precision.mode)):
            if warning:
                self.out(warning)
        if self.layout.is_main:  # only now: a start that fails leaves the run directory as it was
            prepare_run_dir(cfg, resume)
        self._set_progress(self.state.start(resume, self.out))
        self.elastic = (
            ElasticGroup(cfg, self.module, self.loader, self.progress, self._set_progress, self.out)
            if isinstance(self.loader, ElasticData)
            else None
        )
        if self.layout.is_main:  # the run directory is self-contained: evaluation and export read it
            record_run(cfg, self.tokenizer)
        self.recovery = SpikeRecovery(cfg.recovery, self.module.skipped_steps)
        slow_ranks = SlowRanks(
            SlowRankReport(self.layout, self.device, cfg.train.slow_rank_threshold, cfg.train.slow_rank_windows)
        )
        self.callbacks = self._builtin_callbacks(tasks, slow_ranks) + user_callbacks + self._reporting_callbacks()
        self.losses: list[float] = []  # this invocation's per-step losses, as logged
        self.window: Window  # the steps since the last logging step; from the start of fit
        self._rolled_back = False  # by a callback, in the window being judged
        self.stopping = False  # on an interrupt, after this step (hlat.train.interrupt)

    def _builtin_callbacks(self, tasks: InTrainingTasks | None, slow_ranks: SlowRanks) -> list[Callback]:
        """In the order their hooks run: a window is judged before it is logged, a step's
        evaluations come before its checkpoint, and the final save commits before the profile
        is written."""
        cfg = self.cfg
        profile_dir = Path(cfg.profile.dir) if cfg.profile.dir else self.run_dir / "profile"
        callbacks: list[Callback] = [self.recovery, slow_ranks]
        if cfg.eval.every:
            callbacks.append(ValidationLoss(self.val_batches))
        if tasks is not None:
            callbacks.append(Tasks(tasks))
        callbacks.append(Checkpointing())
        if cfg.checkpoint.archive_every_tokens > 0:
            callbacks.append(WeightArchives(cfg.checkpoint.archive_every_tokens))
        callbacks.append(Profiler(StepProfiler(cfg.profile, profile_dir, self.device, self.layout.rank, self.out)))
        return callbacks

    def _reporting_callbacks(self) -> list[Callback]:
        """After the user's: records are written once every callback has added its fields; the
        loss plot, the run's last line and the sample come last."""
        callbacks: list[Callback] = []
        if self.layout.is_main:
            callbacks += [LossPlot()] if self.cfg.train.plot else []
            callbacks.append(Metrics())
        return callbacks + ([Sample()] if self.cfg.train.sample_prompt else [])

    def _peak(self) -> Peak:
        """The MFU denominator, on the rank that logs (the others would only contend for the
        cores while it times GEMMs on a cache miss)."""
        cfg = self.cfg
        if not self.layout.is_main:
            return Peak(None, "")
        shapes = model_shapes(
            cfg.model.d_model, cfg.model.ffn_dim // self.layout.tp, cfg.train.micro_batch * cfg.data.seq_len
        )
        return resolve_peak(
            self.device,
            compute_dtype(cfg.precision.mode, self.device),
            cfg.train.peak_tflops,
            shapes,
            default_cache_dir(),
        )

    def _build_data(self) -> None:
        cfg, lay = self.cfg, self.layout
        if lay.world > 1 and not lay.is_main:
            dist.barrier()  # rank 0 trains or loads the tokenizer first; the others read its cache
        what = (
            "loading data.tokenizer"
            if cfg.data.tokenizer
            else "loading the token shards' tokenizer"
            if entry_kind(source_entries(cfg.data.source)[0]) == "shards"
            else "loading or training a byte-level BPE"
        )
        with Heartbeat(f"tokenizer: {what}", self.out):
            self.tokenizer, tokenizer_line = build_data_tokenizer(cfg.data, cfg.model.vocab_size)
        if lay.world > 1 and lay.is_main:
            dist.barrier()
        self.out(tokenizer_line)
        self.loader: PackedLoader | ElasticData
        with Heartbeat("data: opening data.source (Parquet and JSONL are converted to Arrow once)", self.out):
            if cfg.elastic.enabled:
                shares, log = cfg.elastic.max_groups, self.out

                def share_loader(share: int) -> PackedLoader:
                    nonlocal log
                    loader = build_loader(
                        cfg.data, self.tokenizer, cfg.train.seed, cfg.train.micro_batch, share, shares, log_fn=log
                    )
                    log = None  # the data line once
                    return loader

                per_share = cfg.train.global_batch // shares // cfg.train.micro_batch
                record = cfg.run_dir / f"tokens.{cfg.elastic.group}.jsonl"
                self.loader = ElasticData(
                    share_loader, shares, per_share, record, lay.dp_rank, lay.dp, records=lay.rank == 0
                )
            else:
                self.loader = build_loader(
                    cfg.data,
                    self.tokenizer,
                    seed=cfg.train.seed,
                    batch_size=cfg.train.micro_batch,
                    dp_rank=lay.dp_rank,
                    dp_size=lay.dp,
                    log_fn=self.out,
                )
        # Built once: every evaluation sees the same held-out tokens.
        self.val_batches = (
            []
            if cfg.eval.every == 0
            else [
                b.to(self.device)
                for b in Validation(
                    cfg.data, self.tokenizer, cfg.train.micro_batch, cfg.eval.batches, lay.dp_rank, lay.dp
                ).batches()
            ]
        )

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
        for _ in range((now - self.step) * self.accum):
            self.loader.next_batch()
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
            f"({self.accum} micro-batches of {cfg.train.micro_batch} per "
            f"{'data share and rank' if cfg.elastic.enabled else 'data-parallel rank'}) into {self.run_dir}"
        )
        final_loss, self._first_step = None, self.step
        interrupts = Interrupts(cfg.train.interrupt_save_s, self.layout)
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
                        interrupts.disarm()
                        raise Interrupted(
                            f"interrupted ({interrupts.name}): saved step {self.step}; "
                            f"run the same command to resume from step {self.step}",
                            interrupts.signum,
                        )
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
            self.loader.close()
            if self.elastic is not None:
                self.elastic.close()
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
        """One optimizer step (its LR and pre-clip grad norm on device). No host sync (but in an
        elastic run, whose groups agree on each step on the host)."""
        maybe_kill("step", self.step + 1, self.layout.rank)
        while True:
            if self.elastic is not None:
                self.elastic.join()  # a rejoining group takes a peer's step and state here
            waited = time.perf_counter()
            read = self.elastic.batches() if self.elastic else [self.loader.next_batch() for _ in range(self.accum)]
            batches = [self._to_device(b) for b in read]
            window.data_s += time.perf_counter() - waited
            maybe_kill("compute", self.step + 1, self.layout.rank)
            lr = self.cfg.optim.lr * lr_multiplier(self.cfg.schedule, self.step)
            computing = time.thread_time()  # grows with this rank's work, not while it waits for the others
            with watch(self.layout, "training step (forward, backward, gradient reduction, optimizer)", self.step + 1):
                maybe_slow(self.step + 1, self.layout.rank)
                output = self.module.step(batches, lr, self.elastic.replicas if self.elastic else None)
            window.compute_s += time.thread_time() - computing
            if self.elastic is None or self.elastic.finish(self.step + 1):
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
            param_norm, source_tokens = self.module.param_norm().item(), self._source_tokens()
        achieved = tokens_per_s * self.flops_per_token
        steps_here = self.step - self._first_step  # this launch's: a resume's rate, not the first run's
        per_step = (time.perf_counter() - self._fit_started) / max(steps_here, 1)
        self.emit(
            "on_log",
            {
                "step": self.step,
                "loss": mean,
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

    def _source_tokens(self) -> dict[str, int]:
        """Tokens consumed from each data source so far, over all data-parallel ranks (collective)."""
        # host counts on the host where gloo carries them: not every device has float64
        counts = torch.tensor(self.loader.tokens_emitted, dtype=torch.float64, device=collective_device(self.device))
        if self.layout.dp > 1 and not isinstance(self.loader, ElasticData):  # an elastic group counts every share
            dist.all_reduce(counts, group=self.layout.group("dp"))
        return {docs.name: int(n) for docs, n in zip(self.loader.docs, counts.tolist())}
