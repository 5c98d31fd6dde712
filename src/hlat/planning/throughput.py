"""Predicted step time of a layout: compute, exposed communication and pipeline bubble.

Per rank and optimizer step (docs/parallelism.md, "Throughput and cost"):
- compute: the FLOPs the step executes (executed_flops_per_token: the model's 6N, causal
  attention at half the 12 L d s that MFU counts, since the fused kernels skip the masked half,
  and what the recompute policy runs again, and the KV projections' copies when tp exceeds
  the KV heads), over world x peak x efficiency. The efficiency is the
  one constant per calibration group that hlat.planning.calibration fits on published runs; MFU keeps
  hlat.model.flops_per_token, the convention the trainer and the published MFUs use.
- tensor parallel: with sequence parallel each block gathers and scatters its activations twice
  forward and twice backward, ring collectives of (t-1)/t of a micro-batch's b x s x d
  activations, exposed whole; recompute replays the gathers too ("op" saves the reduce-scatters'
  outputs but not the gathers', "full" replays all four).
- data parallel: ddp all-reduces the gradients; zero1 also gathers the updated weights; zero2/fsdp
  gather the weights (per micro-batch: once under zero2, forward and backward under fsdp; once per
  step when they stay gathered) and reduce-scatter the gradients once per step; HSDP does that
  within a replica and all-reduces the shards across replicas. Overlap model: the weight gathers
  of zero2/fsdp run beside the step's compute (prefetched a block ahead); the step's one gradient
  reduction (no_sync / set_requires_gradient_sync(False) before the last micro-batch) only beside
  the last micro-batch's backward; zero1's gather of the updated weights, after the optimizer
  step, beside nothing. What exceeds its window is exposed.
- pipeline: each micro-batch sends its activations forward and their gradients back across each
  stage boundary, each TP rank its sequence-parallel slice (exposed whole); 1F1B's bubble idles (pp-1)/(m*v + pp-1) of the step for m
  micro-batches and v virtual stages per rank.
- context parallel: each cp rank computes seq_len/cp tokens of each sequence (the FLOPs are the
  same: the load-balanced ring runs causal attention's half), so sequence-parallel and pipeline
  volumes are a cp rank's; the gradients are reduced over dp x cp ranks (FSDP2 shards over them).
  Ring attention passes each layer's K/V (their own grouped-query heads, local heads under tp) to
  the next cp rank cp-1 times forward, cp-1 times again in backward with their fp32 gradients
  cp times, and once more forward where full recompute replays the ring (the other policies save
  its output: it is one operator). Overlap
  model: none; hlat's ring waits for each shift before the next chunk's attention, so the ring's
  traffic is exposed whole (an implementation that overlaps a shift with the attention of the
  chunk it holds hides up to that attention's time).
Volumes use N / (tp x pp) parameters per rank. A group of ranks within one node (its span at the
mesh's order, tp innermost, fits in the node) moves data at the intra-node bandwidth, otherwise at
the chip's share of the network; an unknown intra-node bandwidth (0) counts that traffic as free.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from hlat.config.model import ModelConfig
from hlat.config.run import RunConfig
from hlat.model import count_params, flops_per_token
from hlat.parallel.data_parallel import DTYPES
from hlat.precision import compute_dtype, param_dtype


@dataclass(frozen=True)
class System:
    """What a rank runs on, as the planner sees it."""

    name: str
    peak_tflops: float  # dense, per rank, in the run's compute dtype
    memory_gib: float
    per_node: int  # ranks per node
    intra_gbs: float  # one-way bandwidth per rank within a node; 0 = not counted
    inter_gbs: float  # one-way bandwidth per rank across nodes
    calibration_group: str  # hlat.accelerators.Accelerator.calibration_group, or "cpu"
    efficiency: float  # fraction of the peak that compute reaches
    rank: str = ""  # what a rank is where it is part of a chip (hlat.accelerators.Accelerator.rank)


@dataclass(frozen=True, kw_only=True)  # by name only: five int knobs are easily swapped by position
class LayoutChoice:
    """The knobs the search turns; `dp_shard` < dp is HSDP."""

    tp: int
    pp: int
    dp: int
    sharding: str
    dp_shard: int
    micro_batch: int
    recompute: str
    cp: int = 1

    @property
    def name(self) -> str:
        dp = (
            f"hsdp {self.dp // self.dp_shard}x{self.dp_shard}"
            if self.dp_shard < self.dp
            else f"{self.sharding} {self.dp}"
        )
        cp = f" x cp {self.cp}" if self.cp > 1 else ""
        return f"tp {self.tp}{cp} x pp {self.pp} x {dp}"


@dataclass(frozen=True)
class StepTime:
    compute_s: float
    tp_s: float
    dp_s: float  # exposed: what exceeds its overlap window
    pp_s: float  # point-to-point sends
    bubble_s: float
    tokens: int  # per step
    world: int
    model_flops_per_token: float
    peak_tflops: float
    cp_s: float = 0.0  # ring attention's K/V shifts, exposed
    dp_issued_s: float = 0.0  # all data-parallel traffic, hidden or not

    @property
    def issued_comm_s(self) -> float:
        """Seconds of every collective and send the step issues, overlapped or not."""
        return self.tp_s + self.cp_s + self.pp_s + self.dp_issued_s

    @property
    def total_s(self) -> float:
        return self.compute_s + self.tp_s + self.cp_s + self.dp_s + self.pp_s + self.bubble_s

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.total_s

    @property
    def mfu(self) -> float:
        return self.tokens_per_s * self.model_flops_per_token / (self.world * self.peak_tflops * 1e12)


# Sequence-parallel collectives per block and micro-batch: 4 forward, 4 backward, and what the
# recompute replays ("op": the 2 gathers, whose outputs it does not save; "full": all 4).
_TP_PASSES = {"op": 10, "full": 12}


def layout_of(cfg: RunConfig, world: int) -> LayoutChoice:
    par = cfg.parallel
    dp = world // (par.tp * par.pp * par.cp)
    shard = par.dp_shard or dp  # below dp: HSDP
    return LayoutChoice(
        tp=par.tp,
        pp=par.pp,
        dp=dp,
        sharding=par.dp_sharding,
        dp_shard=shard,
        micro_batch=cfg.train.micro_batch,
        recompute=par.activation_checkpoint,
        cp=par.cp,
    )


def recompute_flops_per_token(model: ModelConfig, seq_len: int, policy: str, every_other_mm: bool = False) -> float:
    """Forward FLOPs per token the backward runs again: "full" the blocks' forward, "selective" core
    attention's (causal QK^T and AV), "op" with `every_other_mm` the matmuls it does not save (wk,
    wo, w3: hlat.parallel.activation_checkpoint), "op" and "none" only pointwise work (counted as 0)."""
    if policy == "full":
        blocks = (
            count_params(model) - model.vocab_size * model.d_model * (1 if model.tie_embeddings else 2) - model.d_model
        )
        return 2 * blocks + _causal_attention_forward(model, seq_len)
    if policy == "selective":
        return _causal_attention_forward(model, seq_len)
    if policy == "op" and every_other_mm:
        q, kv = model.n_heads * model.attn_head_dim, model.n_kv_heads * model.attn_head_dim
        return 2.0 * model.n_layers * model.d_model * (kv + q + model.ffn_dim)
    return 0.0


def executed_flops_per_token(
    model: ModelConfig, seq_len: int, policy: str, every_other_mm: bool = False, tp: int = 1
) -> float:
    """Training FLOPs per token the step runs: flops_per_token less the causal half of attention's
    12 L d s (flash, cuDNN and FlexAttention kernels skip the masked blocks) plus the recompute,
    plus the KV projections' copies when tp exceeds the KV heads."""
    skipped = 3 * _causal_attention_forward(model, seq_len)  # forward and backward of the masked half
    return (
        flops_per_token(model, seq_len)
        - skipped
        + recompute_flops_per_token(model, seq_len, policy, every_other_mm)
        + _replicated_kv_flops(model, tp, policy, every_other_mm)
    )


def _replicated_kv_flops(model: ModelConfig, tp: int, policy: str, every_other_mm: bool) -> float:
    """With more tp ranks than KV heads each head is computed by tp / n_kv_heads ranks
    (hlat.parallel.tensor_parallel.ReplicatedKV): the copies beyond the first, forward and
    backward, and forward again where the recompute replays wk and wv ("full") or wk ("op" with
    every other matmul)."""
    copies = tp // model.n_kv_heads if tp > model.n_kv_heads else 1
    per_pass = 2.0 * model.n_layers * model.d_model * model.n_kv_heads * model.attn_head_dim  # wk or wv, forward
    passes = 6 + (2 if policy == "full" else 1 if policy == "op" and every_other_mm else 0)  # of wk and wv together
    return passes * per_pass * (copies - 1)


def _causal_attention_forward(model: ModelConfig, seq_len: int) -> float:
    """QK^T and AV forward over the causal half of the keys: 2 matmuls x 2 FLOPs x L w s / 2, a
    sixth of flops_per_token's attention term (12 L w s, w the family's attention width: d for
    LLaMA), the part of it that grows with seq_len."""
    return (flops_per_token(model, seq_len) - flops_per_token(model, 0)) / 6


def step_time(cfg: RunConfig, world: int, system: System, layout: LayoutChoice | None = None) -> StepTime:
    """The predicted step of `cfg` on `world` ranks of `system` (under `layout`, else cfg's own)."""
    lay = layout or layout_of(cfg, world)
    model, seq = cfg.model, cfg.data.seq_len
    tokens = cfg.train.global_batch * seq
    micro = cfg.train.global_batch // lay.dp // lay.micro_batch  # micro-batches per rank and step
    model_flops = flops_per_token(model, seq)
    every_other_mm = lay.recompute == "op" and cfg.parallel.recompute_every_other_mm
    executed = executed_flops_per_token(model, seq, lay.recompute, every_other_mm, lay.tp)
    compute = executed * tokens / world / (system.peak_tflops * 1e12 * system.efficiency)

    width = compute_dtype(cfg.precision.mode).itemsize
    activation = lay.micro_batch * seq // lay.cp * model.d_model * width  # one micro-batch's b x s x d on a cp rank
    tp_s = 0.0
    if lay.tp > 1:
        passes = _TP_PASSES.get(lay.recompute, 8)  # gathers + scatters per block and micro-batch
        volume = passes * (lay.tp - 1) / lay.tp * activation * model.n_layers / lay.pp * micro
        tp_s = _seconds(volume, _bandwidth(system, lay.tp))
    cp_s = micro * _ring_s(cfg, lay, system) * model.n_layers / lay.pp
    gather_s, reduce_s, after_s = _data_parallel_s(cfg, lay, system, micro, count_params(model) / (lay.tp * lay.pp))
    # Muon orthogonalises after the step's backward: nothing hides its traffic, and its FLOPs
    # neither hide the data-parallel traffic nor fill the pipeline's bubble (added at the end)
    muon_compute, muon_comm = _muon_s(cfg, lay, system) if cfg.optim.name == "muon" else (0.0, 0.0)
    after_s += muon_comm
    # the last micro-batch's backward: the forward is a third of the FLOPs before recompute
    forward = (executed - recompute_flops_per_token(model, seq, lay.recompute, every_other_mm)) / 3
    hidden = min(reduce_s, compute / micro * (1 - forward / executed))
    dp_s = reduce_s - hidden + max(0.0, gather_s - (compute - hidden)) + after_s
    pp_s = bubble = 0.0
    if lay.pp > 1:
        virtual = cfg.parallel.pp_stages_per_rank
        # each TP rank sends its sequence-parallel slice of the activations
        pp_s = _seconds(2 * micro * virtual * activation / lay.tp, _bandwidth(system, 2 * lay.dp * lay.tp))
        # train.deterministic runs each micro-batch as a schedule step of its own: a bubble each
        per_pass = 1 if cfg.train.deterministic else micro
        bubble = (compute + tp_s) * (lay.pp - 1) / (per_pass * virtual)
    return StepTime(
        compute + muon_compute, tp_s, dp_s, pp_s, bubble, tokens, world, model_flops, system.peak_tflops, cp_s,
        gather_s + reduce_s + after_s,
    )  # fmt: skip


def local_kv_width(model: ModelConfig, tp: int) -> int:
    """Elements per token of a rank's K (or V) as ring attention passes and keeps it: its own
    grouped-query heads, one per rank where tp exceeds them (hlat.parallel.tensor_parallel.ReplicatedKV)."""
    return max(model.n_kv_heads // tp, 1) * model.attn_head_dim


def _ring_s(cfg: RunConfig, lay: LayoutChoice, system: System) -> float:
    """Seconds of one layer's ring attention shifts per micro-batch on a rank (see the module docstring)."""
    if lay.cp == 1:
        return 0.0
    model = cfg.model
    width = compute_dtype(cfg.precision.mode).itemsize
    kv = 2 * lay.micro_batch * cfg.data.seq_len // lay.cp * local_kv_width(model, lay.tp)
    replays = 1 if lay.recompute == "full" else 0
    volume = (2 + replays) * (lay.cp - 1) * kv * width + lay.cp * kv * 4
    return _seconds(volume, _bandwidth(system, lay.cp * lay.tp))


def _data_parallel_s(
    cfg: RunConfig, lay: LayoutChoice, system: System, micro: int, local: float
) -> tuple[float, float, float]:
    """Seconds of data-parallel traffic per step on a rank holding `local` parameters: (weight
    gathers beside the compute, the gradient reduction, zero1's gather after the optimizer step)."""
    ranks = lay.dp * lay.cp  # cp's ranks reduce their gradients beside dp's (hlat.parallel.mesh: dp_cp)
    if ranks == 1:
        return 0.0, 0.0, 0.0
    # train.deterministic reduces each micro-batch's gradients on its own (hlat.train.deterministic)
    reductions = micro if cfg.train.deterministic else 1
    prec = cfg.precision
    stored = param_dtype(prec.mode).itemsize
    gathered = 2 if prec.mode == "mixed" else stored  # mixed gathers its bf16 weights
    reduced = DTYPES[prec.reduce_dtype].itemsize if prec.mode == "mixed" else stored
    whole = _bandwidth(system, ranks * lay.tp)
    ring = (ranks - 1) / ranks
    if lay.sharding in ("ddp", "zero1"):
        after = _seconds(ring * local * stored, whole) if lay.sharding == "zero1" else 0.0
        return 0.0, _seconds(2 * ring * local * reduced * reductions, whole), after
    shard = lay.dp_shard * lay.cp  # FSDP2 shards over dp_shard x cp (HSDP replicates the rest)
    kept = not cfg.parallel.reshard_after_backward or lay.pp > 1  # gathered once per step
    gathers = 1 if kept else micro * (1 if lay.sharding == "zero2" else 2)
    within = _bandwidth(system, shard * lay.tp)
    gather = _seconds((shard - 1) / shard * local * gathers * gathered, within)
    reduce = _seconds((shard - 1) / shard * local * reduced * reductions, within)
    replicas = lay.dp // lay.dp_shard
    across = (
        _seconds(2 * (replicas - 1) / replicas * local / shard * reduced * reductions, whole) if replicas > 1 else 0.0
    )
    return gather, reduce + across, 0.0


def muon_matrix_shapes(model: ModelConfig) -> list[tuple[int, int]]:
    """(rows, columns) of each matrix Muon orthogonalises (hlat.optim.muon): the blocks' projections."""
    d, q, kv, f = (
        model.d_model,
        model.n_heads * model.attn_head_dim,
        model.n_kv_heads * model.attn_head_dim,
        model.ffn_dim,
    )
    return [(q, d), (kv, d), (kv, d), (d, q), (f, d), (d, f), (f, d)] * model.n_layers


def _muon_s(cfg: RunConfig, lay: LayoutChoice, system: System) -> tuple[float, float]:
    """(compute, traffic) seconds per step on a rank of optim.name muon's orthogonalisations: each
    Newton-Schulz iteration of an m x n matrix (m <= n) is 4 m^2 n + 2 m^3 FLOPs; a stage's matrices
    of one shape are shared out over the ranks that hold them, so the busiest rank does
    ceil(count / ranks) of each shape. DTensor layouts move each rank's momentum shards to the
    matrix's owner and the result back (an all-to-all each way, fp32), DDP broadcasts each result."""
    shapes = muon_matrix_shapes(cfg.model)
    matrices = sum(r * c for r, c in shapes) / lay.pp  # elements on a stage, before tp and dp
    shard = lay.dp_shard * lay.cp if lay.sharding in ("zero2", "fsdp") else 1
    plain_ddp = lay.sharding == "ddp" and lay.tp == 1
    sharing = lay.dp if plain_ddp else (lay.dp * lay.cp * lay.tp if lay.sharding != "ddp" else lay.tp)
    busiest = sum(
        math.ceil(count / lay.pp / sharing) * (4 * min(shape) ** 2 * max(shape) + 2 * min(shape) ** 3)
        for shape, count in Counter(shapes).items()
    )
    compute = cfg.optim.muon_ns_steps * busiest / (system.peak_tflops * 1e12 * system.efficiency)
    if plain_ddp:
        ns_bytes = 2 if cfg.optim.muon_ns_dtype == "bfloat16" else 4
        return compute, _seconds((lay.dp - 1) / lay.dp * matrices * ns_bytes, _bandwidth(system, lay.dp))
    spread = shard * lay.tp  # the ranks among which each matrix is split
    volume = 2 * (spread - 1) / spread * matrices / spread * 4
    replicas = lay.dp // lay.dp_shard if lay.sharding in ("zero2", "fsdp") else 1
    volume += (replicas - 1) / replicas * matrices / spread * 4  # HSDP: each result gathered across replicas
    return compute, _seconds(volume, _bandwidth(system, lay.dp * lay.cp * lay.tp))


def _bandwidth(system: System, span: int) -> float:
    """GB/s for a group spanning `span` consecutive ranks; inf where it is intra-node and unknown."""
    if span <= system.per_node:
        return system.intra_gbs or math.inf
    return system.inter_gbs


def _seconds(volume: float, gbs: float) -> float:
    return volume / (gbs * 1e9)
