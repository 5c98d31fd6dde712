"""The training run: build every component from the config, then loop, log and checkpoint.

Where the run starts and what its checkpoints hold is hlat.train.resume; what it does about
non-finite steps and loss spikes, hlat.checkpoint.recovery. The same code runs as one process or
under torchrun: the layout (hlat.parallel.mesh) says which rank does what, and only the global
rank 0 writes logs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.optim import ZeroRedundancyOptimizer

from hlat.checkpoint import CheckpointManager
from hlat.checkpoint.faults import maybe_kill, maybe_slow
from hlat.checkpoint.manager import SaveStats
from hlat.checkpoint.recovery import Incident, Recovery
from hlat.config.data import default_cache_dir
from hlat.config.run import RunConfig
from hlat.data import Validation, build_data_tokenizer, build_loader
from hlat.data.batch import Batch
from hlat.devices import resolve_device
from hlat.eval.in_training import InTrainingTasks
from hlat.float8 import check_float8
from hlat.model import count_params, flops_per_token
from hlat.optim import adamw_class, build_adamw, decay_groups, lr_multiplier
from hlat.parallel.compile import decide_compile
from hlat.parallel.hang import watch
from hlat.parallel.mesh import Layout, setup
from hlat.parallel.parallelize import build_parallel_model
from hlat.parallel.slow_ranks import SlowRankReport
from hlat.precision import bf16_rounding, compute_dtype, state_bytes_per_param
from hlat.train.cost import cost_fields, node_count
from hlat.train.gemm_ceiling import model_shapes
from hlat.train.memory import MemoryMeter
from hlat.train.optimizers import Optimizers
from hlat.train.peak import Peak, resolve_peak, slow_bf16_warning
from hlat.train.profiling import StepProfiler
from hlat.train.resume import RESUME_MODES, Progress, RunState, prepare_run_dir, record_run
from hlat.train.sample import end_of_training_sample
from hlat.train.sinks import MetricSinks, perplexity, plot_loss
from hlat.train.step import train_step
from hlat.train.wandb_sink import WandbSink


@dataclass
class TrainSummary:
    run_dir: Path
    step: int
    tokens: int
    final_loss: float | None  # mean loss of the last logging window; None if no step ran
    losses: list[float]  # the per-step losses of this invocation, in order (global mean)


class Trainer:
    def __init__(self, cfg: RunConfig, resume: str = "auto", out: Callable[[str], None] = print):
        if resume not in RESUME_MODES:
            raise ValueError(f"resume must be one of {RESUME_MODES}, got {resume!r}")
        self.cfg, self.resume = cfg, resume
        self.device = resolve_device(cfg.train.device, "--train.device")
        self.layout: Layout = setup(cfg.parallel, self.device)
        if cfg.precision.float8:  # before the data and the compile probe, which take minutes on large models
            check_float8(self.device, self.layout.tp)
        self.out = out if self.layout.is_main else (lambda _: None)
        self.run_dir = cfg.run_dir
        if self.layout.is_main:
            prepare_run_dir(cfg, resume)

        torch.manual_seed(cfg.train.seed)
        self._build_data()
        per_rank = cfg.train.global_batch // self.layout.dp
        self.accum = per_rank // cfg.train.micro_batch
        self.tokens_per_step = cfg.train.global_batch * cfg.data.seq_len
        compiled = decide_compile(cfg.parallel.compile, cfg.model, self.device, cfg.precision.mode,
                                  cfg.train.micro_batch, cfg.data.seq_len, cfg.data.document_masking, self.layout.tp,
                                  cfg.parallel.activation_checkpoint, cfg.parallel.recompute_every_other_mm)
        self.out(compiled.line)
        self.model = build_parallel_model(cfg.model, cfg.parallel, self.layout, self.device, cfg.train.seed,
                                          self.accum, cfg.precision, compiled.enabled, cfg.precision.float8)
        self.tasks = InTrainingTasks(cfg.eval, cfg.model, self.tokenizer, self.layout, self.device,
                                     cfg.precision.mode, cfg.data.bos) if cfg.eval.tasks_every else None
        self.optimizers = Optimizers(self.model.parts, self._build_optimizer)
        self.state = RunState(cfg, self.layout, self.device, self.model, self.optimizers, self.loader)
        self.step, self.tokens, self.train_s = 0, 0, 0.0
        self.skipped = torch.zeros((), dtype=torch.int64, device=self.device)  # read on logging steps only
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
        self._set_progress(self.state.start(resume, self.out))
        if self.layout.is_main:  # the run directory is self-contained: evaluation and export read it
            record_run(cfg, self.tokenizer)
        self.recovery = Recovery(cfg.recovery, int(self.skipped.item()))
        self.slow_ranks = SlowRankReport(self.layout, self.device, cfg.train.slow_rank_threshold, cfg.train.slow_rank_windows)

    def _peak(self) -> Peak:
        """The MFU denominator, on the rank that logs (the others would only contend for the
        cores while it times GEMMs on a cache miss)."""
        cfg = self.cfg
        if not self.layout.is_main:
            return Peak(None, "")
        shapes = model_shapes(cfg.model.d_model, cfg.model.ffn_dim // self.layout.tp, cfg.train.micro_batch * cfg.data.seq_len)
        return resolve_peak(self.device, compute_dtype(cfg.precision.mode, self.device), cfg.train.peak_tflops, shapes,
                            default_cache_dir())

    def _build_data(self) -> None:
        cfg, lay = self.cfg, self.layout
        if lay.world > 1 and not lay.is_main:
            dist.barrier()  # rank 0 trains or loads the tokenizer first; the others read its cache
        self.tokenizer, tokenizer_line = build_data_tokenizer(cfg.data, cfg.model.vocab_size)
        if lay.world > 1 and lay.is_main:
            dist.barrier()
        self.out(tokenizer_line)
        if cfg.train.global_batch % (lay.dp * cfg.train.micro_batch):
            from hlat.errors import ConfigError

            raise ConfigError([("train.global_batch", f"{cfg.train.global_batch} sequences do not split into dp={lay.dp} ranks x "
                                f"micro_batch={cfg.train.micro_batch}; use a multiple of {lay.dp * cfg.train.micro_batch}")])
        self.loader = build_loader(cfg.data, self.tokenizer, seed=cfg.train.seed, batch_size=cfg.train.micro_batch,
                                   dp_rank=lay.dp_rank, dp_size=lay.dp, log_fn=self.out)
        # Built once: every evaluation sees the same held-out tokens.
        self.val_batches = [] if cfg.eval.every == 0 else [
            b.to(self.device) for b in Validation(cfg.data, self.tokenizer, cfg.train.micro_batch, cfg.eval.batches, lay.dp_rank, lay.dp).batches()]

    def _build_optimizer(self, part: torch.nn.Module) -> torch.optim.Optimizer:
        rounding, seed, compile = bf16_rounding(self.cfg.precision.mode), self.cfg.train.seed, self.cfg.precision.compile_optimizer
        if self.cfg.parallel.dp_sharding == "zero1" and self.layout.dp > 1:
            cls, kwargs = adamw_class(self.cfg.optim, rounding, seed, compile, model=part)
            return ZeroRedundancyOptimizer(decay_groups(part, self.cfg.optim), optimizer_class=cls,
                                           process_group=self.layout.group("dp"), **kwargs)
        return build_adamw(part, self.cfg.optim, rounding, seed, compile)

    # --- checkpoint state -------------------------------------------------------------------
    @property
    def checkpoints(self) -> CheckpointManager:
        return self.state.checkpoints

    def _set_progress(self, progress: Progress) -> None:
        self.step, self.tokens = progress.step, progress.tokens
        self.train_s = max(self.train_s, progress.train_s)  # a rollback does not refund the time spent
        self.skipped.fill_(progress.skipped_steps)

    def _progress(self) -> Progress:
        return Progress(self.step, self.tokens, int(self.skipped.item()), self.train_s)

    def save(self) -> SaveStats:
        """Collective. Under checkpoint.async_save it returns once the state is staged."""
        return self.state.save(self._progress())

    def _archive_due(self) -> bool:
        every = self.cfg.checkpoint.archive_every_tokens
        return every > 0 and self.tokens // every > (self.tokens - self.tokens_per_step) // every

    def _log_save(self, stats: SaveStats | None) -> None:
        """Report a save; a background one is reported once at launch and once when committed."""
        if stats is None:
            return
        if stats.write_s is None:
            self.out(f"checkpoint: writing {stats.path.name} in the background (training blocked {stats.blocking_s:.2f} s)")
        elif stats.background:
            self.out(f"checkpoint: {stats.path} committed (written in {stats.write_s:.2f} s, training blocked {stats.blocking_s:.2f} s)")
        else:
            self.out(f"checkpoint: {stats.path} ({stats.write_s:.2f} s)")

    def _source_tokens(self) -> dict[str, int]:
        """Tokens consumed from each data source so far, over all data-parallel ranks (collective)."""
        counts = torch.tensor(self.loader.tokens_emitted, dtype=torch.float64, device=self.device)
        if self.layout.dp > 1:
            dist.all_reduce(counts, group=self.layout.group("dp"))
        return {docs.name: int(n) for docs, n in zip(self.loader.docs, counts.tolist())}

    # --- the loop ---------------------------------------------------------------------------
    def fit(self) -> TrainSummary:
        cfg = self.cfg
        total = cfg.train.steps
        if self.step >= total:
            self.out(f"run already complete at step {self.step:,} in {self.run_dir}; raise --train.steps or pass --fresh")
            return TrainSummary(self.run_dir, self.step, self.tokens, None, [])
        self.out(f"training {total - self.step:,} steps of {cfg.train.global_batch} x {cfg.data.seq_len} tokens "
                 f"({self.accum} micro-batches of {cfg.train.micro_batch} per data-parallel rank) into {self.run_dir}")
        sinks = self._sinks() if self.layout.is_main else None
        profile_dir = Path(cfg.profile.dir) if cfg.profile.dir else self.run_dir / "profile"
        profiler = StepProfiler(cfg.profile, profile_dir, self.device, self.layout.rank, self.out)
        window = _Window(time.perf_counter(), MemoryMeter(self.device))
        start = self.step
        losses: list[float] = []
        final_loss = None
        self.model.train()
        try:
            while self.step < total:
                profiler.before_step(self.step + 1)
                lr, grad_norm = self._train_step(window)
                if sinks:
                    sinks.advance()
                save_due = self.step % cfg.checkpoint.every == 0 or self.step == total
                # A checkpoint closes the window too: only steps judged good are ever saved.
                if self.step % cfg.train.log_every == 0 or self.step == total or save_due:
                    window_losses, skipped = self._read_window(window)
                    if self._recover(window_losses, skipped, window, sinks):
                        del losses[max(self.step - start, 0):]  # the rolled-back steps, redone on new data
                        continue
                    losses += window_losses
                    final_loss = self._log_window(window_losses, skipped, lr, grad_norm, window, sinks)
                self._evaluate(total, window, sinks)
                if save_due:
                    with watch(self.layout, "checkpoint save", self.step):
                        self._log_save(self.checkpoints.wait())  # the previous background save, committed by now
                        self._log_save(self.save())
                if self._archive_due():
                    stats = self.state.archive_weights(self._progress())
                    self.out(f"archived weights: {stats.path} ({stats.blocking_s:.2f} s)")
            self._log_save(self.checkpoints.wait())
        finally:
            profiler.stop()
            self.loader.close()
            if sinks:
                sinks.close()
        if self.layout.is_main:
            plot = plot_loss(self.run_dir, f"{cfg.name}: {count_params(cfg.model) / 1e6:,.1f}M params") if cfg.train.plot else None
            self.out(f"done: step {self.step:,}, {self.tokens:,} tokens, final loss {final_loss:.4f} "
                     f"(ln vocab = {math.log(cfg.model.vocab_size):.3f})" + (f"; loss plot {plot}" if plot else ""))
        if cfg.train.sample_prompt:
            with watch(self.layout, "end-of-training sample (gathering the weights to rank 0)", self.step):
                sample = end_of_training_sample(self.model.parts, self.layout, cfg.model, cfg.data, self.tokenizer,
                                                self.device, cfg.precision.mode, cfg.train.sample_prompt,
                                                cfg.train.sample_tokens)
            if sample:
                self.out(sample)
        return TrainSummary(self.run_dir, self.step, self.tokens, final_loss, losses)

    def _train_step(self, window: _Window) -> tuple[float, torch.Tensor]:
        """One optimizer step; returns (its LR, its pre-clip grad norm on device). No host sync."""
        cfg = self.cfg
        maybe_kill("step", self.step + 1, self.layout.rank)
        waited = time.perf_counter()
        batches = [self._to_device(self.loader.next_batch()) for _ in range(self.accum)]
        window.data_s += time.perf_counter() - waited
        lr = cfg.optim.lr * lr_multiplier(cfg.schedule, self.step)
        self.optimizers.set_lr(lr)
        computing = time.thread_time()  # grows with this rank's work, not while it waits for the others
        with watch(self.layout, "training step (forward, backward, gradient reduction, optimizer)", self.step + 1):
            maybe_slow(self.step + 1, self.layout.rank)
            share, grad_norm = train_step(self.model, self.optimizers, batches, cfg.optim.grad_clip,
                                          self.skipped, cfg.recovery.max_grad_norm)
        window.compute_s += time.thread_time() - computing
        window.shares.append(share)
        self.step += 1
        self.tokens += self.tokens_per_step
        return lr, grad_norm

    def _to_device(self, batch: Batch) -> Batch:
        """On CUDA, through pinned memory without waiting for the copy (the stream orders it before
        the forward); elsewhere an ordinary copy (none on the CPU)."""
        if self.device.type == "cuda":
            return batch.pin_memory().to(self.device, non_blocking=True)
        return batch.to(self.device)

    def _sinks(self) -> MetricSinks:
        cfg = self.cfg
        wandb = None
        if cfg.wandb.enabled:
            config = {"name": cfg.name, **{name: asdict(section) for name, section in cfg.sections().items()}}
            wandb = WandbSink(cfg.wandb, cfg.name, self.run_dir, config)
        return MetricSinks(self.run_dir, cfg.train.steps, self.step, cfg.train.tensorboard, wandb)

    def _read_window(self, window: _Window) -> tuple[list[float], int]:
        """The one host sync of a logging step: the window's losses and the skipped-step counter."""
        with watch(self.layout, "loss all-reduce of a logging step", self.step):
            *losses, skipped = torch.cat([self.model.reduce_loss(torch.stack(window.shares)),
                                          self.skipped.reshape(1).to(torch.float32)]).tolist()
        window.shares.clear()
        return losses, int(skipped)

    def _recover(self, losses: list[float], skipped: int, window: _Window, sinks: MetricSinks | None) -> bool:
        """Act on the window's non-finite steps and loss spikes (recovery config): raise, warn, or
        roll back to the last checkpoint; True if it rolled back."""
        incident = self.recovery.judge(losses, skipped, self.step)
        if incident is None:
            return False
        if incident.action == "rollback" and self._roll_back(incident, sinks):
            window.restart()
            return True
        reason = ("recovery.spike_action=skip" if incident.action == "skip" else
                  f"no checkpoint to roll back to, or recovery.max_rollbacks={self.cfg.recovery.max_rollbacks} reached")
        self.out(f"warning: {incident.what}; continuing ({reason})")
        return False

    def _roll_back(self, incident: Incident, sinks: MetricSinks | None) -> bool:
        """Restore the newest checkpoint and skip the data read since it (the offending window);
        the records logged after it are dropped. False if there is none to restore."""
        path = self.state.latest_resumable()
        if path is None or not self.recovery.may_roll_back():
            return False
        now = self.step
        self._set_progress(self.state.restore(path, self.out))
        for _ in range((now - self.step) * self.accum):
            self.loader.next_batch()
        self.recovery.rolled_back(int(self.skipped.item()))
        if sinks:
            sinks.rewind(self.step)
        limit = self.cfg.recovery.max_rollbacks
        self.out(f"{incident.what}: rolled back to step {self.step} ({path.name}) and skipped the {now - self.step} steps of "
                 f"data read since (rollback {self.recovery.rollbacks} of at most {limit})")
        return True

    def _log_window(self, losses: list[float], skipped: int, lr: float, grad_norm: torch.Tensor, window: _Window,
                    sinks: MetricSinks | None) -> float:
        """Log the window's metrics (collective: norms and token counts); return its mean loss."""
        finite = [x for x in losses if math.isfinite(x)]  # a skipped step's loss may be NaN
        mean = sum(finite) / len(finite) if finite else math.nan
        elapsed = time.perf_counter() - window.started
        tokens_per_s = len(losses) * self.tokens_per_step / elapsed
        self.train_s += elapsed
        with watch(self.layout, "metric all-reduces (parameter norm, tokens per source, compute times)", self.step):
            param_norm, source_tokens = self.model.param_norm().item(), self._source_tokens()
            slow_fields, slow_lines = self.slow_ranks.window(window.compute_s, len(losses))
        record = {
            "step": self.step, "loss": mean, "ppl": perplexity(mean), "lr": lr,
            "grad_norm": grad_norm.item(), "param_norm": param_norm,
            "tokens": self.tokens, "tokens_per_s": tokens_per_s,
            "mfu": self.peak.mfu(tokens_per_s * self.flops_per_token, self.layout.world),
            "mfu_of_gemm": self.peak.mfu_of_gemm(tokens_per_s * self.flops_per_token, self.layout.world),
            "skipped_steps": skipped,
            "step_s": elapsed / len(losses), "data_s": window.data_s, "data_frac": window.data_s / elapsed,
            **window.memory.read(),
            **slow_fields,
            "source_tokens": source_tokens,
            **cost_fields(self.cfg.train.price_per_node_hour, node_count(self.layout.world), self.train_s, self.tokens),
        }
        if sinks:
            sinks.log(record)
        for line in slow_lines:
            self.out(line)
        window.restart()
        return mean

    def _evaluate(self, total: int, window: _Window, sinks: MetricSinks | None) -> None:
        """Validation loss and downstream tasks when due (collective)."""
        if self.cfg.eval.due(self.step) or (self.val_batches and self.step == total):
            with watch(self.layout, "validation loss", self.step):
                val_loss = self.model.validation_loss(self.val_batches)
            if sinks:
                sinks.log_validation(self.step, self.tokens, val_loss)
        if self.tasks is not None and self.tasks.due(self.step, total):
            with watch(self.layout, "downstream tasks (gathering the weights to rank 0)", self.step):
                scores, seconds = self.tasks.run(self.model.parts)  # collective; rank 0 scores
            window.started += seconds  # evaluation is not training: keep it out of tokens/s
            if sinks:
                sinks.log_tasks(self.step, self.tokens, scores, seconds)


@dataclass
class _Window:
    """The steps since the last logging step, whose device losses are read in one host sync."""
    started: float  # perf_counter at the window's start, less time spent evaluating
    memory: MemoryMeter  # peak memory since the last logging step
    shares: list[torch.Tensor] = field(default_factory=list)
    data_s: float = 0.0  # time the steps waited for the loader and the copy to the device
    compute_s: float = 0.0  # the training thread's CPU time inside the steps (hlat.parallel.slow_ranks)

    def restart(self) -> None:
        self.started, self.data_s, self.compute_s = time.perf_counter(), 0.0, 0.0
