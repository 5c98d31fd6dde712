"""Run a few training steps under each layout given and record the results (a scenario of
test_parity.py, see tests/runs.py). Every layout trains the same model (same seed) on the same
global batches: data-parallel rank r takes its slice of each global batch, so every layout must
reproduce the single-process losses and weights.
"""

import contextlib
import dataclasses
import functools
import json
from pathlib import Path
from unittest import mock

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.flop_counter import FlopCounterMode

import hlat.parallel.parallelize as parallelize
from hlat.config.model import ModelConfig
from hlat.config.optim import OptimConfig
from hlat.config.parallel import ParallelConfig
from hlat.data.packing import Batch, labels_for
from hlat.optim import build_adamw
from hlat.parallel.compile import compile_blocks
from hlat.parallel.mesh import Layout, make_layout
from hlat.parallel.parallelize import build_parallel_model
from hlat.train.optimizers import Optimizers
from hlat.train.step import train_step

MODEL = ModelConfig(vocab_size=128, d_model=64, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=32)
VARIANTS = {"": MODEL, "tied": dataclasses.replace(MODEL, tie_embeddings=True),  # a spec's optional 8th field
            # biases, Llama 3.1's RoPE scaling (wavelengths over 16 scaled here), a head_dim that is not d_model / n_heads
            "bias": dataclasses.replace(MODEL, attention_bias=True, mlp_bias=True, rope_scaling="llama3", rope_factor=8.0,
                                        rope_original_max_seq_len=16, head_dim=32),
            "odd": dataclasses.replace(MODEL, vocab_size=127),  # a vocabulary tp 2 and 4 shard unevenly
            # Qwen3 dense: QK-norm over head_dim 32 (!= d_model / n_heads), tied embeddings, RoPE theta 1e6
            "qwen3": dataclasses.replace(MODEL, family="qwen3", head_dim=32, tie_embeddings=True, rope_theta=1e6)}
GLOBAL_BATCH, SEQ, MICRO, STEPS = 8, 32, 2, 2


def global_batches(vocab_size: int = MODEL.vocab_size) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(0, vocab_size, (GLOBAL_BATCH, SEQ), generator=gen) for _ in range(STEPS)]


def run(spec: str, layout: Layout, out: Path, compiled: bool = False) -> None:
    """spec: "pp,dp,tp,sharding,schedule,stages_per_rank,recompute[,variant]" (variant: a VARIANTS key;
    dp "RxS": HSDP, R replicas sharded over S ranks each). `compiled`: each block torch.compiled."""
    pp, dp, tp, sharding, schedule, per_rank, recompute, *variant = spec.split(",")
    model_cfg = VARIANTS[",".join(variant)]
    par = ParallelConfig(tp=int(tp), pp=int(pp), dp=layout.dp, dp_shard=layout.dp_shard if layout.dp_replicate > 1 else 0,
                         dp_sharding=sharding, pp_schedule=schedule, pp_stages_per_rank=int(per_rank), activation_checkpoint=recompute)
    per_dp = GLOBAL_BATCH // layout.dp
    micro = MICRO if per_dp // MICRO >= int(pp) else per_dp // int(pp)  # a pipeline needs >= pp micro-batches
    torch._dynamo.utils.counters.clear()
    model = build_parallel_model(model_cfg, par, layout, torch.device("cpu"), seed=7, n_microbatches=per_dp // micro, precision_mode="fp32",
                                 compiled=compiled)
    if sharding == "zero1" and layout.dp > 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer

        from hlat.optim import decay_groups

        build = lambda part: ZeroRedundancyOptimizer(decay_groups(part, OptimConfig()), optimizer_class=torch.optim.AdamW,
                                                    process_group=layout.group("dp"), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    else:
        build = lambda part: build_adamw(part, OptimConfig(lr=1e-3))
    optimizers = Optimizers(model.parts, build)
    losses, norms = [], []
    for tokens in global_batches(model_cfg.vocab_size):
        mine = tokens[layout.dp_rank * per_dp:(layout.dp_rank + 1) * per_dp]
        batches = [Batch(mine[i:i + micro], labels_for(mine[i:i + micro])) for i in range(0, per_dp, micro)]
        share, norm = train_step(model, optimizers, batches, grad_clip=1.0)
        losses.append(model.reduce_loss(share).item())
        norms.append(norm.item())
    full = {}
    for part in model.parts:
        full.update(get_model_state_dict(part, options=StateDictOptions(full_state_dict=True)))
    tag = spec.replace(",", "_")
    torch.save({k: v.detach().clone() for k, v in full.items()}, out / f"{tag}.rank{layout.rank}.pt")
    kv_flops = _kv_flops(model.parts[0], model_cfg.vocab_size) if layout.tp > model_cfg.n_kv_heads else None
    if layout.rank == 0:
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]  # > 0: the blocks did compile
        (out / f"{tag}.json").write_text(json.dumps({"losses": losses, "grad_norms": norms, "graphs": graphs, "kv_flops": kv_flops}))


def _kv_flops(part: torch.nn.Module, vocab_size: int) -> int:
    """FLOPs of the first block's wk in one forward of a 1 x SEQ batch (KV projections replicated over tp)."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        part(torch.randint(0, vocab_size, (1, SEQ), generator=torch.Generator().manual_seed(0)))
    # keyed by module path from the model's class name (FSDPLlama once FSDP wraps it)
    (wk,) = [counts for name, counts in counter.get_flop_counts().items() if name.endswith(".layers.0.attention.wk")]
    return sum(wk.values())


def layouts(ctx, specs: list[str], backend: str = "") -> None:
    """Scenario: each spec in turn over this scenario's processes (one: the reference). `backend`:
    "" eager, else every block compiled with that torch.compile backend (the suite runs eager,
    tests/conftest.py, so compilation is switched back on here)."""
    compiled = bool(backend)
    patched = (mock.patch.object(parallelize, "compile_blocks", functools.partial(compile_blocks, backend=backend))
               if compiled else contextlib.nullcontext())
    with torch._dynamo.config.patch(disable=not compiled), patched:
        for spec in specs:
            pp, dp, tp = spec.split(",")[:3]
            replicate, _, shard = dp.rpartition("x")  # "2x2": 2 replicas x 2 shards; "4": plain dp 4
            degrees = int(pp), int(replicate or 1) * int(shard), int(tp)
            layout = Layout(1, 0, 1, 1, 1, None) if ctx.world == 1 else make_layout(*degrees, torch.device("cpu"), int(shard))
            run(spec, layout, ctx.out, compiled)
