"""Dry-run memory plan: per-rank training memory of a layout, without allocating anything.

The model is built on the meta device once per shape, the tensor-parallel plan is applied to a copy
once per tp degree under a fake process group of the target world size, and each parameter's
local element count is read off its DTensor; a pipeline stage sums those of the parameters that
training's cut (hlat.parallel.pipeline.cut_stage) keeps, cut from a copy of the modules that
shares the weights. `hlat plan --search` re-plans many (tp, pp) pairs of one model this way
without building or copying it again. Data-parallel sharding then divides what it shards;
what gradient accumulation holds whole between micro-batches (FSDP2's unsharded gradients and,
without resharding after backward, its gathered weights; fp32 sums) is counted whole (state_memory).
Activations are counted tensor by tensor from what hlat's block keeps for backward under each
recompute policy (activation_elements_per_token; benchmarks/recompute.md measured them), per
layer and micro-batch, divided by t under sequence parallel, times the micro-batches a stage
holds at once (1F1B: pp - stage, GPipe: all of them), plus on the last stage the final norm's
tensors and the fp32 log-probabilities of one micro-batch. Under HSDP (parallel.dp_shard) what
FSDP2 shards is divided by dp_shard, the ranks of one replica, not by dp.
Context parallelism (parallel.cp): each cp rank holds seq_len/cp tokens of every activation, plus
what hlat's ring attention keeps beyond fused attention's (ring_extra_elements_per_token) and, once
per stage, the ring's buffers during a layer's backward (ring_buffer_bytes); FSDP2 shards over
dp x cp ranks (hlat.parallel.mesh.fsdp_mesh).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from hlat.accelerators import Accelerator
from hlat.config.layout import (
    Degrees,
    check_context_parallel,
    check_data_parallel,
    check_grad_accum,
    check_tensor_parallel,
    resolve_degrees,
)
from hlat.config.model import ModelConfig
from hlat.config.run import RunConfig
from hlat.dtensor import local_tensor
from hlat.model import Llama, build_model, model_spec
from hlat.optim.muon import is_hidden_matrix
from hlat.parallel.data_parallel import DTYPES
from hlat.parallel.pipeline import cut_stage, split_layers
from hlat.parallel.tensor_parallel import apply_tensor_parallel
from hlat.planning.throughput import System, local_kv_width
from hlat.precision import compute_dtype, param_dtype

GIB = 1024**3


@dataclass
class StagePlan:
    stage: int
    layers: range
    local_params: int  # after tensor parallel, before data-parallel sharding
    weights: float  # bytes at rest
    grads: float
    optimizer: float
    activations: float
    muon_params: int = 0  # of local_params, those Muon steps (one momentum instead of Adam's two moments)

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer + self.activations


def activation_elements_per_token(model: ModelConfig, policy: str, every_other_mm: bool = False) -> int:
    """Elements per token one block keeps for backward, its input included (the previous block's
    output), with fused attention (no T x T scores) and native grouped-query K/V."""
    d, f, q, kv = (
        model.d_model,
        model.ffn_dim,
        model.n_heads * model.attn_head_dim,
        model.n_kv_heads * model.attn_head_dim,
    )
    lse = model.n_heads  # fused attention's log-sum-exp (fp32; counted at the compute width)
    if policy == "none":  # residuals 2d, norms 2 x 2d, roped q/k, v, attention out, w1, w3, silu, product
        return 6 * d + 2 * q + 2 * kv + lse + 4 * f
    if policy == "selective":  # every output but attention, muls and silu: residuals, pow, q/k halves, mms
        return 6 * d + 3 * q + 4 * kv + 2 * f
    if policy == "op":  # input, the 7 matmul outputs and attention out
        if every_other_mm:  # matmuls 1, 3, 5, 7 of wq wk wv wo w1 w3 w2
            return 2 * d + 2 * q + kv + lse + f
        return 3 * d + 2 * q + 2 * kv + lse + 2 * f
    if policy == "full":
        return d
    raise ValueError(f"unknown recompute policy {policy!r}")


def ring_extra_elements_per_token(model: ModelConfig, policy: str, cp: int) -> float:
    """Elements per token of a cp rank that hlat's ring attention (hlat.model.ring_attention) keeps
    beyond fused attention's, as tests/planning/test_context_parallel_plan.py measures them. The
    ring is one operator that saves what fused attention saves (q, grouped-query K/V with their own
    heads, the output, the log-sum-exp), so only "selective" keeps more: it saves the ring's output
    and log-sum-exp rather than replaying the ring in backward, where it recomputes fused attention."""
    if cp == 1 or policy != "selective":
        return 0.0
    return model.n_heads * model.attn_head_dim + model.n_heads


def activation_bytes_per_layer(cfg: RunConfig, tp: int, cp: int = 1) -> float:
    """Bytes one block keeps per micro-batch on a rank (sequence parallel splits every tensor over
    tp; context parallel holds seq_len/cp tokens of each)."""
    model, par = cfg.model, cfg.parallel
    if tp > 1 and model.n_kv_heads % tp:  # KV heads replicated over the TP ranks: whole on each
        model = dataclasses.replace(model, n_kv_heads=model.n_kv_heads * tp)
    width = compute_dtype(cfg.precision.mode).itemsize
    per = activation_elements_per_token(
        model, par.activation_checkpoint, par.recompute_every_other_mm
    ) + ring_extra_elements_per_token(model, par.activation_checkpoint, cp)
    return cfg.data.seq_len // cp * cfg.train.micro_batch * per / tp * width


def ring_buffer_bytes(cfg: RunConfig, tp: int, cp: int) -> float:
    """The ring's working memory on a rank at its peak, one layer's backward (one layer at a time,
    so counted once): the K/V stack it attends to and the one arriving, in the compute dtype (with
    their own grouped-query heads), the fp32 gradients travelling with each, the fp32 query
    gradient, and the K/V repeated to the query heads for the kernel; local heads under tp."""
    if cp == 1:
        return 0.0
    model = cfg.model
    q, kv = model.n_heads * model.attn_head_dim / tp, local_kv_width(model, tp)
    width = compute_dtype(cfg.precision.mode).itemsize
    tokens = cfg.data.seq_len // cp * cfg.train.micro_batch
    return tokens * (2 * 2 * kv * width + 2 * 2 * kv * 4 + q * 4 + 2 * q * width)


def plan(cfg: RunConfig, world: int) -> tuple[Degrees, list[StagePlan]]:
    """(the degrees, one StagePlan per pipeline stage) for `cfg` on `world` ranks."""
    degrees = resolve_degrees(cfg.parallel, world)
    if degrees.tp > 1:
        check_tensor_parallel(cfg.model, degrees.tp)
    check_data_parallel(cfg.parallel.dp_sharding, degrees)
    check_context_parallel(degrees, cfg.parallel.dp_sharding, cfg.data.seq_len)
    check_grad_accum(cfg.precision, cfg.parallel.dp_sharding, degrees.dp_cp)
    local = _local_numels(cfg.model, degrees)
    full = _meta_model(cfg.model)
    n_stages = degrees.pp * cfg.parallel.pp_stages_per_rank
    bounds = (
        split_layers(cfg.model.n_layers, n_stages, *model_spec(cfg.model).stage_costs(cfg.model))
        if n_stages > 1
        else [range(cfg.model.n_layers)]
    )
    stages = []
    for index, layers in enumerate(bounds):
        module = _cut(full, layers, index == 0, index == n_stages - 1) if n_stages > 1 else full
        params = sum(local[name] for name, _ in module.named_parameters())
        muon = sum(local[n] for n, p in module.named_parameters() if is_hidden_matrix(n, p))
        stages.append(
            stage_memory(cfg, index, layers, params, degrees, n_stages, muon if cfg.optim.name == "muon" else 0)
        )
    return degrees, stages


# Meta models and their per-rank parameter sizes, by model shape (and tp): a search plans one
# model under many layouts.
_MODELS: dict[str, Llama] = {}
_LOCAL_NUMELS: dict[tuple[str, int], dict[str, int]] = {}


def _meta_model(model: ModelConfig) -> Llama:
    """The whole model on the meta device, built once per shape; never modified (plans copy it)."""
    key = repr(model)
    if key not in _MODELS:
        with torch.device("meta"):
            _MODELS[key] = build_model(model)
    return _MODELS[key]


def _local_numels(model: ModelConfig, degrees: Degrees) -> dict[str, int]:
    """Elements on a rank of each parameter of the whole model, tensor-parallel over the tp of
    `degrees` under a fake process group of that many ranks."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    tp = degrees.tp
    key = (repr(model), tp)
    if key in _LOCAL_NUMELS:
        return _LOCAL_NUMELS[key]
    module = _meta_model(model)
    if tp > 1:
        owns_group = not dist.is_initialized()
        if owns_group:
            dist.init_process_group("fake", rank=0, world_size=degrees.world, store=FakeStore())
        try:
            module = copy.deepcopy(module)
            apply_tensor_parallel(
                module,
                init_device_mesh(
                    "cpu", (degrees.pp, degrees.dp, degrees.cp, tp), mesh_dim_names=("pp", "dp", "cp", "tp")
                )["tp"],
            )
        finally:
            if owns_group:
                dist.destroy_process_group()
    _LOCAL_NUMELS[key] = {name: local_tensor(p).numel() for name, p in module.named_parameters()}
    return _LOCAL_NUMELS[key]


def _cut(full: Llama, layers: range, first: bool, last: bool) -> nn.Module:
    """Training's cut of stage `layers` from a shallow copy of `full`: only the top module and its
    ModuleDict of blocks are new, so cut_stage's removals leave `full` whole; the blocks, ends and
    tensors are shared, nothing is copied per weight."""
    shared: dict[int, object] = {id(m): m for m in full.modules() if m is not full and m is not full.layers}
    shared.update({id(t): t for t in [*full.parameters(), *full.buffers()]})
    return cut_stage(copy.deepcopy(full, shared), layers, first, last)


def state_memory(cfg: RunConfig, local: int, degrees: Degrees, muon_params: int = 0) -> tuple[float, float, float]:
    """(weights, gradients, optimizer state) bytes on a rank holding `local` parameters, `muon_params`
    of them stepped by Muon, at the step's peak: the last micro-batch's backward (docs/parallelism.md,
    docs/precision.md)."""
    prec, sharding = cfg.precision, cfg.parallel.dp_sharding
    elem = param_dtype(prec.mode).itemsize
    pp, dp = degrees.pp, degrees.dp
    micro = cfg.train.global_batch // dp // cfg.train.micro_batch
    # train.deterministic reduces every micro-batch (FSDP2 holds no unsharded sum between them) and
    # keeps its slots' sums as a binary counter: up to log2(micro) + 1 more gradients
    deterministic = cfg.train.deterministic
    accumulating = micro > 1 and not deterministic
    partial_sums = math.ceil(math.log2(micro)) + 1 if deterministic and micro > 1 else 0
    # HSDP shards within a replica; zero1 and plain FSDP over all of dp, and cp's ranks beside it
    shards = degrees.dp_shard * degrees.cp
    # Adam: two moments; Muon: one momentum
    optimizer = (2 * local - muon_params) * elem / (shards if sharding != "ddp" else 1)
    if sharding in ("zero2", "fsdp") and degrees.dp_cp > 1:
        gathered_elem = 2 if prec.mode == "mixed" else elem  # MixedPrecisionPolicy gathers mixed's weights in bf16
        # zero2 keeps the gathered weights from forward through backward; fsdp between
        # micro-batches only without resharding after backward (always under a pipeline schedule).
        keeps = sharding == "zero2" or (accumulating and (not cfg.parallel.reshard_after_backward or pp > 1))
        weights = local * elem / shards + (local * gathered_elem if keeps else 0)
        # Skipping the reduce-scatter on non-final micro-batches holds every unsharded gradient,
        # in the reduce dtype when it differs from the parameters', until the last one.
        if prec.mode == "mixed":
            accum_elem = DTYPES[prec.reduce_dtype].itemsize
        else:
            accum_elem = 4 if prec.fp32_grad_accum else elem
        grads = local * elem / shards * (1 + partial_sums + _group_exchange(cfg))
        return weights, grads + (local * accum_elem if accumulating else 0), optimizer
    # mixed: the bf16 copy of each weight (hlat.precision.Bf16Weights) is saved for backward.
    weights = local * elem + (2 * local if prec.mode == "mixed" else 0)
    grads = local * elem + (4 * local if prec.fp32_grad_accum else 0)  # hlat.parallel.grad_accum's fp32 sums
    if deterministic and dp > 1:  # the ordered all-reduce's flat input, all-to-all and gathered buffers
        grads += 3 * local * elem
    return weights, grads + local * elem * (partial_sums + _group_exchange(cfg)), optimizer


def _group_exchange(cfg: RunConfig) -> int:
    """Gradients' worth of memory an elastic group's exchange holds under train.deterministic: its
    row and the table of every group's (hlat.train.elastic.deterministic)."""
    return cfg.elastic.max_groups + 1 if cfg.train.deterministic and cfg.elastic.enabled else 0


def stage_memory(
    cfg: RunConfig, index: int, layers: range, local: int, degrees: Degrees, n_stages: int, muon_params: int = 0
) -> StagePlan:
    """Stage `index`'s memory per rank for `local` parameters (the search re-prices it per layout)."""
    pp, dp, tp = degrees.pp, degrees.dp, degrees.tp
    weights, grads, optimizer = state_memory(cfg, local, degrees, muon_params)
    micro = cfg.train.global_batch // dp // cfg.train.micro_batch
    stage_of_rank = index % pp
    in_flight = micro if cfg.parallel.pp_schedule == "gpipe" or pp == 1 else min(micro, pp - stage_of_rank)
    if cfg.train.deterministic:  # one micro-batch a schedule step (hlat.parallel.parallelize.backward_each)
        in_flight = 1
    cp = degrees.cp
    acts = activation_bytes_per_layer(cfg, tp, cp) * len(layers) * (1 if pp == 1 else in_flight)
    acts += ring_buffer_bytes(cfg, tp, cp) if len(layers) else 0.0
    if index == n_stages - 1:
        tokens = cfg.train.micro_batch * cfg.data.seq_len // cp
        width = compute_dtype(cfg.precision.mode).itemsize
        acts += tokens * (3 * cfg.model.d_model * width + cfg.model.vocab_size * 4) / tp  # final norm, fp32 log-probs
    return StagePlan(index, layers, local, weights, grads, optimizer, acts, muon_params)


def format_plan(cfg: RunConfig, world: int, degrees: Degrees, stages: list[StagePlan]) -> str:
    lines = [
        f"{cfg.name} on {world} ranks: {degrees.summary()}, {cfg.parallel.dp_sharding}, "
        f"{cfg.precision.mode}, recompute {cfg.parallel.activation_checkpoint}, micro-batch {cfg.train.micro_batch} x {cfg.data.seq_len}"
        + (f" ({cfg.data.seq_len // degrees.cp} tokens per cp rank)" if degrees.cp > 1 else "")
        + (", Muon on the blocks' matrices" if cfg.optim.name == "muon" else ""),
        f"{'stage':>5} {'layers':>9} {'params/rank':>14} {'weights':>9} {'grads':>9} {'optim':>9} {'activ.':>9} {'total GiB':>10}",
    ]
    for st in stages:
        span = f"{st.layers.start}-{st.layers.stop - 1}" if len(st.layers) else "-"
        lines.append(
            f"{st.stage:>5} {span:>9} {st.local_params:>14,} {st.weights / GIB:>9.2f} {st.grads / GIB:>9.2f} "
            f"{st.optimizer / GIB:>9.2f} {st.activations / GIB:>9.2f} {st.total / GIB:>10.2f}"
        )
    return "\n".join(lines)


def largest_stage_gib(stages: list[StagePlan]) -> float:
    """GiB per rank of the stage that needs the most."""
    return max(st.total for st in stages) / GIB


def format_fit(stages: list[StagePlan], device: Accelerator | System) -> str:
    """Whether the rank of the largest stage fits in `device`'s memory (the data sheet's capacity;
    allocator fragmentation and the device runtime's context, a few hundred MiB to GiB, come on
    top), after what a rank is where it is part of a chip."""
    need = largest_stage_gib(stages)
    verdict = "fits" if need <= device.memory_gib else "does NOT fit"
    rank = f"rank = {device.rank}\n" if device.rank else ""
    return (
        f"{rank}on {device.name} ({device.memory_gib:g} GiB): the largest stage needs {need:.2f} GiB per rank "
        f"({need / device.memory_gib:.0%} of the device): {verdict}"
    )
