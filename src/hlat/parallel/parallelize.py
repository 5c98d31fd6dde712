"""Build this rank's share of the model for a layout, in one fixed order:
pipeline split -> float8 conversion -> tensor/sequence parallel -> activation checkpointing -> compile
-> data parallel.

`ParallelModel` then runs one step's forward and backward over its micro-batches, whatever the
layout, and computes the true global gradient norm across every shard and stage.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor.parallel import loss_parallel

from hlat.config.layout import check_context_parallel, check_data_parallel, check_grad_accum, check_tensor_parallel
from hlat.config.model import ModelConfig
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.data.batch import IGNORE_INDEX, Batch
from hlat.device.record import device_record
from hlat.dtensor import full_tensor, local_tensor, settled_grad
from hlat.errors import ConfigError
from hlat.float8 import check_float8, convert_to_float8
from hlat.model import Llama, build_model, model_spec
from hlat.model.attention import attention_backend, check_attention_backend
from hlat.model.ring_attention import RingContext
from hlat.parallel.activation_checkpoint import apply_activation_checkpoint, attention_recomputed
from hlat.parallel.compile import compile_blocks
from hlat.parallel.context_parallel import shard_batch
from hlat.parallel.data_parallel import apply_data_parallel, no_gradient_sync
from hlat.parallel.grad_accum import Fp32GradAccumulator
from hlat.parallel.grad_norm import total_norm
from hlat.parallel.init import init_parameters
from hlat.parallel.loss import token_loss_sum
from hlat.parallel.mesh import Layout
from hlat.parallel.ordered_sum import GradientTap
from hlat.parallel.pipeline import build_schedule, cut_stage, split_layers, stage_indices
from hlat.parallel.tensor_parallel import apply_tensor_parallel
from hlat.parallel.tied_embeddings import TiedEmbeddings, tie_across_stages
from hlat.precision import autocast, cast_parameters


@dataclass
class ParallelModel:
    parts: list[nn.Module]  # what this rank runs: one module, or its pipeline stages
    raw_parts: list[Llama]  # the same modules without the DDP wrapper (state dicts, RoPE)
    layout: Layout
    precision_mode: str
    schedule: Any = None  # a torch.distributed.pipelining schedule when pp > 1
    is_first_stage: bool = True
    is_last_stage: bool = True
    reshard_after_backward: bool = True  # FSDP2 between micro-batches (ParallelConfig)
    attention_backend: str = "auto"  # the SDPA kernel forward and backward run (train.attention_backend)
    # mixed's bf16 weight copies, kept for one step's micro-batches (precision.bf16_weight_cache); None: cast per use
    bf16_cache: dict[nn.Parameter, torch.Tensor] | None = None
    grad_accumulator: Fp32GradAccumulator | None = None  # bf16 storage with fp32_grad_accum, without FSDP2
    tied: TiedEmbeddings | None = None  # tied embeddings under pp > 1: this rank's copy on the first or last stage
    pipeline_microbatches: int = 1  # the micro-batches of one schedule step (pp > 1)
    gradient_tap: GradientTap | None = None  # train.deterministic: what FSDP2 reduces goes through it
    _loss_scale: list[torch.Tensor] = field(default_factory=list)

    def parameters(self) -> list[nn.Parameter]:
        return [p for part in self.parts for p in part.parameters()]

    def train(self, mode: bool = True) -> None:
        for part in self.parts:
            part.train(mode)

    def _context(self, device: torch.device) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        if self.layout.tp > 1:
            stack.enter_context(loss_parallel())  # vocab-sharded cross-entropy, forward and backward
        stack.enter_context(autocast(self.precision_mode, device, self.bf16_cache))
        stack.enter_context(attention_backend(self.attention_backend))
        return stack

    def forward_backward(self, batches: Sequence[Batch], n_targets: torch.Tensor) -> torch.Tensor:
        """Accumulate the gradients of the global-batch mean loss; return this rank's part of it, its rank loss.

        `n_targets` is the global target count; DDP/FSDP average gradients over dp, so each loss
        is scaled by dp / n_targets. Summing the rank losses over dp and pp ranks gives the loss.
        """
        device = batches[0].tokens.device
        try:
            self._fill_bf16_cache()
            rank_loss = self._forward_backward(batches, n_targets, device)
        finally:
            self._clear_bf16_cache()
        if self.grad_accumulator is not None:
            self.grad_accumulator.finish()
        if self.tied is not None:
            self.tied.sum_gradients()
        return rank_loss

    @torch.no_grad()
    def _fill_bf16_cache(self) -> None:
        """Cast every fp32 weight once, before any forward: inside a block the casts would differ
        between a micro-batch's forward and its recompute, which must run the same ops."""
        if self.bf16_cache is not None:
            for param in self.parameters():
                if param.dtype == torch.float32:
                    self.bf16_cache[param] = param.detach().to(torch.bfloat16)

    def _clear_bf16_cache(self) -> None:
        """Drop the step's bf16 weight copies: the optimizer is about to change the weights."""
        if self.bf16_cache is not None:
            self.bf16_cache.clear()

    def _forward_backward(
        self, batches: Sequence[Batch], n_targets: torch.Tensor, device: torch.device
    ) -> torch.Tensor:
        scale = self.layout.degrees.dp_cp / n_targets
        if self.schedule is not None:
            rank_loss = self._pipeline_step(batches, scale, device)
        else:
            model, total = self.parts[0], torch.zeros((), device=device)
            for i, batch in enumerate(batches):
                with no_gradient_sync(model, i < len(batches) - 1, self.reshard_after_backward):
                    total += self._backward(model, batch, scale, device)
            rank_loss = total / n_targets
        return rank_loss

    def _backward(self, model: nn.Module, batch: Batch, scale: torch.Tensor, device: torch.device) -> torch.Tensor:
        """One micro-batch's forward and backward of its summed loss times `scale`; that loss, whole."""
        with self._context(device):
            logits, labels = self._forward(model, batch)
            loss = token_loss_sum(logits, labels)
            (loss * scale).backward()
        return full_tensor(loss.detach())

    def backward_each(self, batches: Sequence[Batch], n_targets: torch.Tensor) -> Iterator[torch.Tensor]:
        """train.deterministic's accumulation (hlat.train.deterministic): each micro-batch's forward and
        backward on its own, `.grad` holding that micro-batch's gradient alone (as FSDP2 reduced it,
        or this rank's under replication; a cp rank's part; this stage's, the tied copies summed) when
        its loss / n_targets is yielded (under a pipeline, 0 on all but the last stage). A pipeline
        runs one schedule step per micro-batch (built for one: build_run)."""
        device = batches[0].tokens.device
        model, params = self.parts[0], self.parameters()
        try:
            self._fill_bf16_cache()
            for batch in batches:
                for param in params:
                    param.grad = None
                if self.schedule is None:
                    yield self._backward(model, batch, 1.0 / n_targets, device) / n_targets
                    continue
                self._loss_scale[:] = [1.0 / n_targets]
                losses: list[torch.Tensor] = []
                args, kwargs = self._schedule_io([batch], losses)
                with self._context(device):
                    self.schedule.step(*args, **kwargs)
                if self.tied is not None:
                    self.tied.sum_gradients()
                yield full_tensor(losses[0].detach()) if losses else torch.zeros((), device=device)
        finally:
            self._clear_bf16_cache()

    def _forward(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits and the labels they are scored against: with context parallelism, of this cp
        rank's chunks of the batch, attention running as ring attention over the cp ranks."""
        if self.layout.cp == 1:
            return model(batch.tokens, positions=batch.positions, attn_mask=batch.attn_mask), batch.labels
        mine = shard_batch(batch, self.layout.cp_rank, self.layout.cp)
        return model(mine.tokens, positions=mine.positions, attn_mask=self._ring(batch.doc_ids)), mine.labels

    def _ring(self, doc_ids: torch.Tensor | None) -> RingContext:
        return RingContext(self.layout.group("cp"), self.layout.cp_rank, self.layout.cp, doc_ids)

    def _pipeline_step(self, batches: Sequence[Batch], scale: torch.Tensor, device: torch.device) -> torch.Tensor:
        self._loss_scale[:] = [scale]
        losses: list[torch.Tensor] = []
        n = self.pipeline_microbatches  # an elastic group holding several data shares: one schedule per share
        for start in range(0, len(batches), n):
            step_losses: list[torch.Tensor] = []  # each step replaces its list's contents
            args, kwargs = self._schedule_io(batches[start : start + n], step_losses)
            with self._context(device):
                self.schedule.step(*args, **kwargs)  # gradients accumulate over the calls
            losses += step_losses
        if not losses:
            return torch.zeros((), device=device)
        return torch.stack([full_tensor(x.detach()) for x in losses]).sum() / self.layout.degrees.dp_cp

    @torch.no_grad()
    def validation_loss(self, batches: Sequence[Batch]) -> float:
        """Mean loss per target token over `batches` (each dp rank passes its own), forward only.

        Collective over the whole world; one host sync.
        """
        device = batches[0].tokens.device
        self.train(False)
        try:
            self._fill_bf16_cache()
            if self.schedule is not None:
                self._loss_scale[:] = [torch.ones((), device=device)]
                losses: list[torch.Tensor] = []
                args, kwargs = self._schedule_io(batches, losses)
                with self._context(device):
                    self.schedule.eval(*args, **kwargs)
                total = (
                    torch.stack([full_tensor(x) for x in losses]).sum() if losses else torch.zeros((), device=device)
                )
            else:
                total = torch.zeros((), device=device)
                for batch in batches:
                    with self._context(device):
                        logits, labels = self._forward(self.parts[0], batch)
                        total += full_tensor(token_loss_sum(logits, labels))
        finally:
            self.train(True)
            self._clear_bf16_cache()
        count = global_target_count(batches, self.layout)
        return (self.reduce_loss(total) / count).item()

    def _schedule_io(self, batches: Sequence[Batch], losses: list[torch.Tensor]) -> tuple[tuple, dict]:
        """A schedule's inputs on this rank: tokens to the first stage, targets to the last, and
        with document masking positions and document ids to every stage (each builds its mask).
        With context parallelism this cp rank's chunks of tokens, targets and positions, and to
        every stage the ring (replicated over micro-batches) with the whole rows' document ids,
        which the stage puts into its micro-batch's ring (hlat.model.llama)."""
        documents, ring = batches[0].doc_ids is not None, self.layout.cp > 1
        if ring:
            batches = [
                dataclasses.replace(shard_batch(b, self.layout.cp_rank, self.layout.cp), doc_ids=b.doc_ids)
                for b in batches
            ]
        args = (torch.cat([b.tokens for b in batches]),) if self.is_first_stage else ()
        kwargs: dict[str, Any] = {}
        if documents or ring:
            kwargs.update(positions=torch.cat([b.positions for b in batches]))
        if documents:
            kwargs.update(doc_ids=torch.cat([b.doc_ids for b in batches]))
        if ring:
            kwargs.update(attn_mask=self._ring(None))
        if self.is_last_stage:
            kwargs.update(target=torch.cat([b.labels for b in batches]), losses=losses)
        return args, kwargs

    def _pipeline_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return token_loss_sum(logits, labels) * self._loss_scale[0]

    def counted_in_norms(self, params: list[nn.Parameter]) -> list[nn.Parameter]:
        """`params` less the last stage's copy of tied embeddings (norms count the first stage's)."""
        if self.tied is None or self.tied.counted:
            return params
        return [p for p in params if p is not self.tied.weight]

    def _global_norm(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """L2 norm over all shards (hlat.parallel.grad_norm) and pipeline stages (all-reduce over pp)."""
        norm = total_norm(tensors)
        if self.layout.pp > 1:
            squared = norm.pow(2)
            dist.all_reduce(squared, group=self.layout.group("pp"))
            norm = squared.sqrt()
        return norm

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm: float, norm: torch.Tensor | None = None) -> torch.Tensor:
        """Clip every gradient by the true global norm (`norm`, if computed otherwise); return that
        norm (before clipping)."""
        params = [p for p in self.parameters() if p.grad is not None]
        grads = {p: settled_grad(p) for p in params}
        if norm is None:
            norm = self._global_norm([grads[p] for p in self.counted_in_norms(params)])
        if grads:  # torch's clip_grads_with_norm_ on each shard (a scalar times each: no DTensor plan)
            coef = torch.clamp((max_norm if max_norm > 0 else float("inf")) / (norm + 1e-6), max=1.0)
            torch._foreach_mul_([local_tensor(g) for g in grads.values()], coef)
        return norm

    @torch.no_grad()
    def param_norm(self) -> torch.Tensor:
        return self._global_norm([p.detach() for p in self.counted_in_norms(self.parameters())])

    def reduce_loss(self, rank_loss: torch.Tensor) -> torch.Tensor:
        """Sum the rank losses over dp, cp and pp (tp ranks hold copies): one collective."""
        if self.layout.world == 1:
            return rank_loss
        total = rank_loss.clone()
        dist.all_reduce(total)
        return total / self.layout.tp


def global_target_count(batches: Sequence[Batch], layout: Layout) -> torch.Tensor:
    """Targets in the global batch: each dp rank's whole batches (its cp ranks share them), summed over dp."""
    count = sum((b.labels != IGNORE_INDEX).sum() for b in batches).float()
    if layout.dp > 1:
        dist.all_reduce(count, group=layout.group("dp"))
    return count.clamp_min(1.0)


def check_layout(model_cfg: ModelConfig, par: ParallelConfig, layout: Layout) -> None:
    if layout.tp > 1:
        check_tensor_parallel(model_cfg, layout.tp)
    check_data_parallel(par.dp_sharding, layout.degrees)
    check_context_parallel(layout.degrees, par.dp_sharding)


def build_parallel_model(
    model_cfg: ModelConfig,
    *,
    parallel: ParallelConfig,
    layout: Layout,
    device: torch.device,
    seed: int,
    n_microbatches: int,
    precision: PrecisionConfig,
    compiled: bool = False,
    float8: bool = False,
    attention: str = "auto",
    deterministic: bool = False,
) -> ParallelModel:
    """`compiled`: torch.compile each block (the run's decision: hlat.parallel.compile.decide_compile).
    `float8`: the blocks' linears as torchao float8 matmuls (precision.float8; refused where unsupported).
    `attention`: the SDPA backend (train.attention_backend), refused where the device lacks it.
    `deterministic`: train.deterministic's data parallelism (hlat.parallel.data_parallel)."""
    check_layout(model_cfg, parallel, layout)
    check_grad_accum(precision, parallel.dp_sharding, layout.degrees.dp_cp)
    if float8:
        check_float8(device, layout.tp, model_cfg.n_kv_heads)
    check_attention_backend(attention, device)
    recompute_attention = attention_recomputed(parallel.recompute_attention, device)
    if layout.cp > 1 and not device_record(device.type).ring_attention:
        raise ConfigError(
            [
                (
                    "parallel.cp",
                    f"cp={layout.cp}: ring attention has no kernel on {device.type} "
                    "(it runs on cpu and cuda); use --parallel.cp 1",
                )
            ]
        )
    with torch.device("meta"):
        full = cast_parameters(build_model(model_cfg), precision.mode)  # bf16 modes store bf16 weights
    init_std_of = full.init_std_of
    if layout.pp > 1:
        n_stages = layout.pp * parallel.pp_stages_per_rank
        bounds = split_layers(model_cfg.n_layers, n_stages, *model_spec(model_cfg).stage_costs(model_cfg))
        indices = stage_indices(layout.pp_rank, layout.pp, parallel.pp_stages_per_rank)
        raw = [cut_stage(copy.deepcopy(full), bounds[i], i == 0, i == n_stages - 1) for i in indices]
    else:
        n_stages, indices, raw = 1, [0], [full]
    sharded = parallel.dp_sharding in ("zero2", "fsdp")
    tap = GradientTap() if deterministic else None
    parts = []
    for module in raw:
        if float8:  # before TP, whose plan picks torchao's float8 styles for Float8Linears
            convert_to_float8(module, layout.tp)
        if layout.tp > 1:
            apply_tensor_parallel(module, layout.mesh["tp"])
        apply_activation_checkpoint(
            module, parallel.activation_checkpoint, parallel.recompute_every_other_mm, compiled, recompute_attention
        )
        if compiled:
            compile_blocks(module, device.type, mode=parallel.compile_mode)
        if sharded:  # FSDP2 shards on meta, so only this rank's shard is ever allocated
            apply_data_parallel(module, layout, parallel.dp_sharding, precision, tap)
        module.to_empty(device=device)
        init_parameters(module, init_std_of, seed, on_host=device_record(device.type).init_on_host)
        module.reset_rope()
        parts.append(module if sharded else apply_data_parallel(module, layout, parallel.dp_sharding, precision, tap))
    fsdp = sharded and layout.degrees.dp_cp > 1  # FSDP2 accumulates in its reduce dtype (mixed_precision_policy)
    accumulator = (
        Fp32GradAccumulator(p for m in raw for p in m.parameters()) if precision.fp32_grad_accum and not fsdp else None
    )
    pm = ParallelModel(
        parts,
        raw,
        layout,
        precision.mode,
        is_first_stage=0 in indices,
        is_last_stage=n_stages - 1 in indices,
        reshard_after_backward=parallel.reshard_after_backward,
        attention_backend=attention,
        bf16_cache={} if precision.bf16_weight_cache else None,
        grad_accumulator=accumulator,
        gradient_tap=tap,
    )
    if layout.pp > 1:
        pm.tied, pm.pipeline_microbatches = tie_across_stages(raw, indices, n_stages, layout), n_microbatches
        pm.schedule = build_schedule(
            parts,
            indices,
            n_stages,
            device,
            layout.group("pp"),
            parallel.pp_schedule,
            n_microbatches,
            pm._pipeline_loss,
        )
    return pm
