"""The composition root of a training run: every component built from the config, in the order
their dependencies need, into one record (`Run`) the trainer loops over.

Each rule about what may be combined is checked where the component it concerns is built (the
config's own checks ran when it loaded); this module only wires, and makes two of those refusals
early, before the slow steps (build_run). An elastic run (elastic.enabled) differs here and
nowhere in the loop: its train module and step data wrap the core ones (hlat.train.elastic).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist

from hlat.config.data import default_cache_dir
from hlat.config.data_paths import entry_kind, source_entries
from hlat.config.run import RunConfig
from hlat.data import Validation, build_data_tokenizer, build_loader, check_shard_sources
from hlat.data.batch import Batch
from hlat.data.packing import PackedLoader
from hlat.data.tokenizer import Tokenizer
from hlat.device.record import device_record
from hlat.device.resolve import resolve_device
from hlat.device.rounding import stochastic_rounding
from hlat.device.runtime import accelerator, total_memory
from hlat.errors import DataError
from hlat.eval.in_training import InTrainingTasks
from hlat.float8 import check_float8, float8_line
from hlat.metrics.gemm_ceiling import model_shapes
from hlat.metrics.peak import Peak, resolve_peak, slow_bf16_warning
from hlat.metrics.profiling import StepProfiler
from hlat.model import count_params, flops_per_token
from hlat.model.attention import check_attention_backend
from hlat.optim.update_probe import decide_update_compile
from hlat.parallel.compile import decide_compile
from hlat.parallel.mesh import Layout, setup
from hlat.parallel.parallelize import ParallelModel, build_parallel_model
from hlat.parallel.slow_ranks import SlowRankReport
from hlat.parallel.world import world_from_env
from hlat.planning.device_layout import device_layout
from hlat.planning.forecast import run_estimate
from hlat.precision import compute_dtype, state_bytes_per_param
from hlat.progress import Heartbeat
from hlat.train.callbacks.base import Callback, load_callback
from hlat.train.callbacks.checkpointing import Checkpointing, WeightArchives
from hlat.train.callbacks.evaluation import Tasks, ValidationLoss
from hlat.train.callbacks.heartbeat import StepHeartbeat
from hlat.train.callbacks.metrics import LossPlot, Metrics
from hlat.train.callbacks.profiler import Profiler
from hlat.train.callbacks.recovery import SpikeRecovery
from hlat.train.callbacks.sample import Sample
from hlat.train.callbacks.slow_ranks import SlowRanks
from hlat.train.deterministic import DeterministicTrainModule, fix_numerics
from hlat.train.elastic.deterministic import ElasticDeterministicTrainModule
from hlat.train.elastic.group import ElasticGroup
from hlat.train.elastic.module import ElasticTrainModule
from hlat.train.elastic.secret import run_key
from hlat.train.elastic.shares import ElasticData
from hlat.train.global_batch import GlobalBatch
from hlat.train.replay import Replay
from hlat.train.resume import (
    Progress,
    RunState,
    check_init_from,
    check_run_dir,
    prepare_run_dir,
    record_run,
    resolve_shard_count,
)
from hlat.train.step_data import Accumulation, StepData
from hlat.train.train_module import TrainModule

Out = Callable[[str], None]


@dataclass
class Run:
    """What a training run is made of. `start`: the counters it starts from (a resume's)."""

    cfg: RunConfig
    device: torch.device
    layout: Layout
    out: Out  # the global rank 0's log; a no-op elsewhere
    tokenizer: Tokenizer
    data: StepData
    val_batches: list[Batch]  # built once: every evaluation sees the same held-out tokens
    module: TrainModule
    state: RunState
    accum: int  # micro-batches per step and data-parallel rank (or data share)
    flops_per_token: float
    peak: Peak
    recovery: SpikeRecovery
    callbacks: list[Callback]
    start: Progress


def build_run(
    cfg: RunConfig,
    *,
    resume: str,
    out: Out,
    callbacks: list[Callback],
    progress: Callable[[], Progress],
    set_progress: Callable[[Progress], None],
    guard: Callable[[], None] | None = None,
) -> Run:
    """`callbacks`: the caller's, run after the train.callbacks named in the config.
    `progress`/`set_progress`: the trainer's counters (an elastic group sends and heals them).
    `guard`: rank 0's check before each checkpoint writes (the run directory's lock)."""
    check_run_dir(cfg, resume)
    check_init_from(cfg, resume)
    key = run_key(cfg.elastic) if cfg.elastic.enabled else b""  # now: a bad secret fails before the slow steps
    user_callbacks = [load_callback(path) for path in cfg.train.callbacks] + callbacks
    cfg, device, layout, float8, out = _placement(cfg, out)
    # an elastic group reads whole shares of the global batch (as many as the groups present leave
    # it), each dealt over the group's data-parallel ranks (its tp ranks share their micro-batches)
    # train.deterministic: every micro-batch of the global batch a share of its own (hlat.train.global_batch)
    shares = (
        cfg.train.global_batch // cfg.train.micro_batch
        if cfg.train.deterministic
        else cfg.elastic.max_groups * layout.dp
        if cfg.elastic.enabled
        else layout.dp
    )
    readers = "data shares" if cfg.elastic.enabled or cfg.train.deterministic else "data-parallel ranks"
    cfg, shards_line = resolve_shard_count(cfg, resume, shares, readers)
    if shards_line:
        out(shards_line)
    torch.manual_seed(cfg.train.seed)
    tokenizer = _tokenizer(cfg, layout, out)
    loader = _loader(cfg, tokenizer, layout, device, out)
    val_batches = _validation(cfg, tokenizer, layout, device)
    accum = cfg.train.global_batch // (layout.dp if cfg.train.deterministic else shares) // cfg.train.micro_batch
    model = _model(cfg, layout, device, accum, float8, out)
    tasks = (
        InTrainingTasks(cfg.eval, cfg.model, tokenizer, layout, device, cfg.precision.mode, cfg.data.bos)
        if cfg.eval.tasks_every
        else None
    )
    module = _train_module(cfg, model, device, out)
    state = RunState(cfg, layout, device, module, loader, guard)
    peak = _peak(cfg, layout, device)
    _model_lines(cfg, layout, device, model, peak, out)
    if layout.is_main:  # only now: a start that fails leaves the run directory as it was
        prepare_run_dir(cfg, resume)
    start = state.start(resume, out)
    estimate = _estimate(cfg, layout, device, peak, cfg.train.steps - start.step)
    if estimate:
        out(estimate)
    data: StepData = (
        ElasticGroup(cfg, module, loader, progress, set_progress, out, key=key)
        if isinstance(module, ElasticTrainModule) and isinstance(loader, ElasticData)
        else loader
        if isinstance(loader, GlobalBatch)
        else Accumulation(loader, accum, layout, device)
    )
    if layout.is_main:  # the run directory is self-contained: evaluation and export read it
        record_run(cfg, tokenizer)
    recovery = SpikeRecovery(cfg.recovery, module.skipped_steps)
    all_callbacks = (
        _builtin_callbacks(cfg, layout, device, recovery, val_batches, tasks, out)
        + user_callbacks
        + _reporting_callbacks(cfg, layout, out)
    )
    return Run(
        cfg, device, layout, out, tokenizer, data, val_batches, module, state, accum,
        flops_per_token(cfg.model, cfg.data.seq_len), peak, recovery, all_callbacks, start,
    )  # fmt: skip


def _placement(cfg: RunConfig, out: Out) -> tuple[RunConfig, torch.device, Layout, bool, Out]:
    """The device, the layout on it (device_layout may choose it: the config as resolved), whether
    the blocks run float8, and the log of this rank (the global rank 0's; a no-op elsewhere)."""
    device = resolve_device(cfg.train.device, "--train.device", world_from_env()[2])
    cfg, layout_line = device_layout(cfg, world_from_env()[0], device_record(device.type), total_memory(device))
    layout = setup(cfg.parallel, device)
    narrow = float8_line(cfg.model.d_model, cfg.precision.float8_min_d_model) if cfg.precision.float8 else None
    float8 = cfg.precision.float8 and narrow is None
    # build_parallel_model refuses these too, for its direct callers; here they fail before the data
    # and the compile probe, which take minutes on large models (and the probe, restricted to an SDPA
    # backend the device lacks, would fail as if the compiler had)
    if float8:
        check_float8(device, layout.tp, cfg.model.n_kv_heads)
    check_attention_backend(cfg.train.attention_backend, device)
    out = out if layout.is_main else (lambda _: None)
    if cfg.train.deterministic:  # before any kernel runs (the compile probe, the initialisation)
        out(fix_numerics(device))
    for line in (layout_line, narrow):
        if line:
            out(line)
    return cfg, device, layout, float8, out


def _train_module(cfg: RunConfig, model: ParallelModel, device: torch.device, out: Out) -> TrainModule:
    """The core train module, or the elastic one that wraps its step (elastic.enabled)."""
    rounding = stochastic_rounding(cfg.precision.mode, device_record(device.type), os.environ)
    if rounding.line:
        out(rounding.line)
    update = decide_update_compile(precision=cfg.precision, optim=cfg.optim, device=device, out=out)
    if update.line:
        out(update.line)
    common = dict(
        optim=cfg.optim,
        precision=replace(cfg.precision, compile_optimizer=update.compiled),
        dp_sharding=cfg.parallel.dp_sharding,
        seed=cfg.train.seed,
        max_grad_norm=cfg.recovery.max_grad_norm,
        hardware_rounding=rounding.hardware,
    )
    if not cfg.train.deterministic:
        return (ElasticTrainModule if cfg.elastic.enabled else TrainModule)(model, **common)
    layout = model.layout
    replay = (
        Replay(
            cfg.train.replay_every,
            layout.group("dp"),
            layout.dp_rank,
            layout.dp,
            device,
            cfg.run_dir / "metrics.jsonl",
        )
        if cfg.train.replay_every and layout.dp > 1
        else None
    )
    if cfg.elastic.enabled:
        wrong = cfg.recovery.wrong_computation
        return ElasticDeterministicTrainModule(model, replay=replay, wrong_computation=wrong, **common)
    return DeterministicTrainModule(model, replay=replay, **common)


def _tokenizer(cfg: RunConfig, layout: Layout, out: Out) -> Tokenizer:
    """Rank 0 trains or loads the tokenizer first; the others then read its cache."""
    if layout.world > 1 and not layout.is_main:
        dist.barrier()
    what = (
        "loading data.tokenizer"
        if cfg.data.tokenizer
        else "loading the token shards' tokenizer"
        if entry_kind(source_entries(cfg.data.source)[0]) == "shards"
        else "loading or training a byte-level BPE"
    )
    with Heartbeat(f"tokenizer: {what}", out):
        tokenizer, line = build_data_tokenizer(cfg.data, cfg.model.vocab_size)
    if layout.world > 1 and layout.is_main:
        dist.barrier()
    out(line)
    return tokenizer


def _verify_shards(cfg: RunConfig, tokenizer: Tokenizer, layout: Layout, out: Out) -> None:
    """Token shards are checked before any rank reads them (hlat.data.shard_check): the ranks of a
    node split the files, their verdicts then serve all of them, and every rank stops on the first
    bad file together."""
    entries = [e for e in source_entries(cfg.data.source) if entry_kind(e) == "shards"]
    if not entries:
        return
    share, shares = world_from_env()[2], int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    full = cfg.data.verify_shards == "full"
    with Heartbeat(f"data: verifying the token shards ({'every file' if full else 'files not verified before'})", out):
        problem = check_shard_sources(entries, tokenizer.vocab_size, full, default_cache_dir(), share, shares)
    problems = [problem]
    if layout.world > 1:
        problems = [None] * layout.world
        dist.all_gather_object(problems, problem)
    first = next((p for p in problems if p), None)
    if first:
        raise DataError(f"data.source: {first}")


def _loader(
    cfg: RunConfig, tokenizer: Tokenizer, layout: Layout, device: torch.device, out: Out
) -> PackedLoader | ElasticData | GlobalBatch:
    """This rank's loader; an elastic group's holds every data share's position, and a
    deterministic run's this rank's shares of the global batch."""
    _verify_shards(cfg, tokenizer, layout, out)
    with Heartbeat("data: opening data.source (Parquet and JSONL are converted to Arrow once)", out):

        def rank_loader(rank: int, ranks: int, log: Out | None, reader: str = "data share") -> PackedLoader:
            return build_loader(
                cfg.data, tokenizer, seed=cfg.train.seed, batch_size=cfg.train.micro_batch,
                dp_rank=rank, dp_size=ranks, step_rows=cfg.train.global_batch // ranks, log_fn=log, reader=reader,
            )  # fmt: skip

        if cfg.train.deterministic and not cfg.elastic.enabled:
            shares = cfg.train.global_batch // cfg.train.micro_batch
            return GlobalBatch(
                lambda j: rank_loader(j, shares, out if j == layout.dp_rank else None), shares, layout, device
            )
        if not cfg.elastic.enabled:
            return rank_loader(layout.dp_rank, layout.dp, out, "rank")
        # train.deterministic: one share per micro-batch of the global batch, as GlobalBatch reads them
        deterministic = cfg.train.deterministic
        shares = cfg.train.global_batch // cfg.train.micro_batch if deterministic else cfg.elastic.max_groups
        logged = False

        def share_loader(share: int) -> PackedLoader:
            nonlocal logged
            loader = rank_loader(share, shares, None if logged else out)
            logged = True  # the data line once
            return loader

        per_share = cfg.train.global_batch // shares // cfg.train.micro_batch
        record = cfg.run_dir / f"tokens.{cfg.elastic.group}.jsonl"
        return ElasticData(
            share_loader,
            shares,
            per_share,
            record,
            layout.dp_rank,
            layout.dp,
            records=layout.rank == 0,
            tree=deterministic,
        )


def _validation(cfg: RunConfig, tokenizer: Tokenizer, layout: Layout, device: torch.device) -> list[Batch]:
    if cfg.eval.every == 0:
        return []
    held_out = Validation(
        cfg.data,
        tokenizer,
        batch_size=cfg.train.micro_batch,
        num_batches=cfg.eval.batches,
        dp_rank=layout.dp_rank,
        dp_size=layout.dp,
    )
    return [b.to(device) for b in held_out.batches()]


def _model(cfg: RunConfig, layout: Layout, device: torch.device, accum: int, float8: bool, out: Out) -> ParallelModel:
    compiled = decide_compile(
        model=cfg.model,
        parallel=cfg.parallel,
        precision=cfg.precision,
        train=cfg.train,
        data=cfg.data,
        device=device,
        out=out,
    )
    out(compiled.line)
    with Heartbeat(f"model: building and initialising {count_params(cfg.model) / 1e6:,.1f}M parameters", out):
        return build_parallel_model(
            cfg.model,
            parallel=cfg.parallel,
            layout=layout,
            device=device,
            seed=cfg.train.seed,
            # train.deterministic takes a pipeline's micro-batches one schedule step each (backward_each)
            n_microbatches=1 if cfg.train.deterministic else accum,
            precision=cfg.precision,
            compiled=compiled.enabled,
            float8=float8,
            attention=cfg.train.attention_backend,
            deterministic=cfg.train.deterministic,
        )


def _peak(cfg: RunConfig, layout: Layout, device: torch.device) -> Peak:
    """The MFU denominator, on the rank that logs (the others would only contend for the cores
    while it times GEMMs on a cache miss)."""
    if not layout.is_main:
        return Peak(None, "")
    shapes = model_shapes(cfg.model.d_model, cfg.model.ffn_dim // layout.tp, cfg.train.micro_batch * cfg.data.seq_len)
    dtype = compute_dtype(cfg.precision.mode, device)
    return resolve_peak(device, dtype, cfg.train.peak_tflops, shapes, default_cache_dir())


def _estimate(cfg: RunConfig, layout: Layout, device: torch.device, peak: Peak, steps: int) -> str | None:
    """The planner's step and run time here (rank 0's: the others have no peak), before step 1."""
    found = accelerator(device) if device.type != "cpu" else None
    name = "cpu" if device.type == "cpu" else found[1].name if found and found[1] else None
    if peak.tflops is None or name is None or steps <= 0:
        return None
    return run_estimate(cfg, layout.world, name, peak.tflops, steps)


def _model_lines(
    cfg: RunConfig, layout: Layout, device: torch.device, model: ParallelModel, peak: Peak, out: Out
) -> None:
    out(
        f"model: {count_params(cfg.model) / 1e6:,.1f}M parameters, "
        f"{flops_per_token(cfg.model, cfg.data.seq_len) / 1e9:.3f} GFLOP/token; "
        f"{cfg.precision.mode} precision ({state_bytes_per_param(model.parameters()):.0f} bytes/parameter of "
        f"weights, grads and Adam state) on {layout.world} x {device.type} ({layout.summary}, "
        f"{cfg.parallel.dp_sharding}); {peak.summary}"
    )
    for warning in (peak.warning, slow_bf16_warning(device, cfg.precision.mode)):
        if warning:
            out(warning)


def _builtin_callbacks(
    cfg: RunConfig,
    layout: Layout,
    device: torch.device,
    recovery: SpikeRecovery,
    val_batches: list[Batch],
    tasks: InTrainingTasks | None,
    out: Out,
) -> list[Callback]:
    """In the order their hooks run: a window is judged before it is logged, a step's
    evaluations come before its checkpoint, and the final save commits before the profile
    is written."""
    slow_ranks = SlowRankReport(layout, device, cfg.train.slow_rank_threshold, cfg.train.slow_rank_windows)
    callbacks: list[Callback] = [recovery, SlowRanks(slow_ranks)]
    if cfg.eval.every:
        callbacks.append(ValidationLoss(val_batches))
    if tasks is not None:
        callbacks.append(Tasks(tasks))
    callbacks.append(Checkpointing())
    if cfg.checkpoint.archive_every_tokens > 0:
        callbacks.append(WeightArchives(cfg.checkpoint.archive_every_tokens))
    profile_dir = Path(cfg.profile.dir) if cfg.profile.dir else cfg.run_dir / "profile"
    return callbacks + [Profiler(StepProfiler(cfg.profile, profile_dir, device, layout.rank, out))]


def _reporting_callbacks(cfg: RunConfig, layout: Layout, out: Out) -> list[Callback]:
    """After the user's: records are written once every callback has added its fields; the
    loss plot, the run's last line and the sample come last."""
    callbacks: list[Callback] = []
    if layout.is_main:
        callbacks += [LossPlot()] if cfg.train.plot else []
        callbacks += [Metrics(), StepHeartbeat(out)]
    return callbacks + ([Sample()] if cfg.train.sample_prompt else [])
