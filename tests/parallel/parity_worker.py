"""Run a few training steps under each layout given and record the results (a scenario of
test_parity.py, see tests/runs.py). Every layout trains the same model (same seed) on the same
global batches: data-parallel rank r takes its slice of each global batch, so every layout must
reproduce the single-process losses and weights.
"""

import contextlib
import dataclasses
import functools
import json
from collections.abc import Iterable
from pathlib import Path
from unittest import mock

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.flop_counter import FlopCounterMode

import hlat.parallel.parallelize as parallelize
from hlat.config.layout import Degrees
from hlat.config.model import ModelConfig
from hlat.config.optim import OptimConfig
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.data.batch import Batch, labels_for, make_batch
from hlat.parallel.compile import compile_blocks
from hlat.parallel.mesh import Layout, make_layout
from hlat.parallel.parallelize import ParallelModel, build_parallel_model
from hlat.train.train_module import TrainModule

# Two layers: every layout shards, syncs and recomputes each block alike, so a second block catches
# nothing a first misses and doubles DTensor's per-op cost. A pipelined case's model has
# PIPELINE_LAYERS, so its stages hold several layers (or, interleaved, 4 stages one each) split by
# the spec's costs (Case.layers).
MODEL = ModelConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=32)
PIPELINE_LAYERS = 4
VARIANTS = {
    "": MODEL,
    "tied": dataclasses.replace(MODEL, tie_embeddings=True),  # a Case's variant
    # biases, Llama 3.1's RoPE scaling (wavelengths over 16 scaled here), a head_dim that is not d_model / n_heads
    "bias": dataclasses.replace(
        MODEL,
        attention_bias=True,
        mlp_bias=True,
        rope_scaling="llama3",
        rope_factor=8.0,
        rope_original_max_seq_len=16,
        head_dim=32,
    ),
    "odd": dataclasses.replace(MODEL, vocab_size=127),  # a vocabulary tp 2 and 4 shard unevenly
    # Qwen3 dense: QK-norm over head_dim 32 (!= d_model / n_heads), tied embeddings, RoPE theta 1e6
    "qwen3": dataclasses.replace(MODEL, family="qwen3", head_dim=32, tie_embeddings=True, rope_theta=1e6),
    "documents": MODEL,  # trained with document masking: the rows cut into documents at DOCUMENT_ENDS
}
# EOS positions of every row under the "documents" variant: inside chunks and on chunk edges of cp 2 and 4
DOCUMENT_ENDS, EOS = [4, 7, 8, 15, 21, 22], 1
GLOBAL_BATCH, SEQ, MICRO, STEPS = 8, 32, 2, 2
LR = 1e-3
CPU = torch.device("cpu")


@dataclasses.dataclass(frozen=True)
class Case:
    """One layout to train under: its degrees (dp_replicate > 1: HSDP, dp split into that many
    replicas each sharded over dp / dp_replicate ranks; cp: context parallel), data-parallel sharding, pipeline schedule,
    virtual stages per rank, recompute policy and model variant (a VARIANTS key)."""

    pp: int = 1
    dp: int = 1
    tp: int = 1
    dp_sharding: str = "ddp"
    schedule: str = "1f1b"
    stages_per_rank: int = 1
    recompute: str = "none"
    variant: str = ""
    dp_replicate: int = 1
    cp: int = 1
    n_layers: int = 0  # 0: MODEL's, PIPELINE_LAYERS under pipeline parallelism (Case.layers)

    @property
    def layers(self) -> int:
        return self.n_layers or (PIPELINE_LAYERS if self.pp > 1 else MODEL.n_layers)

    @property
    def model(self) -> ModelConfig:
        return dataclasses.replace(VARIANTS[self.variant], n_layers=self.layers)

    @property
    def id(self) -> str:
        """Readable and unique, e.g. pp2-dp2x2-tp1-fsdp-1f1b-none-tied-4l; names its result files."""
        dp = f"{self.dp_replicate}x{self.dp // self.dp_replicate}" if self.dp_replicate > 1 else str(self.dp)
        stages = f"x{self.stages_per_rank}" if self.stages_per_rank > 1 else ""
        return "-".join(
            filter(
                None,
                (
                    f"pp{self.pp}{stages}",
                    f"dp{dp}",
                    f"cp{self.cp}" if self.cp > 1 else "",
                    f"tp{self.tp}",
                    self.dp_sharding,
                    self.schedule,
                    self.recompute,
                    self.variant,
                    f"{self.layers}l",
                ),
            )
        )

    @property
    def degrees(self) -> Degrees:
        return Degrees(
            pp=self.pp, dp_replicate=self.dp_replicate, dp_shard=self.dp // self.dp_replicate, cp=self.cp, tp=self.tp
        )


def global_batches(vocab_size: int = MODEL.vocab_size) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    return [torch.randint(0, vocab_size, (GLOBAL_BATCH, SEQ), generator=gen) for _ in range(STEPS)]


def run(case: Case, layout: Layout, out: Path, compiled: bool = False, device: torch.device = CPU) -> None:
    """Train STEPS steps under `case` on `device` and save its results as files named by case.id.
    `compiled`: each block torch.compiled."""
    model_cfg, sharding = case.model, case.dp_sharding
    par = ParallelConfig(
        tp=case.tp,
        pp=case.pp,
        cp=case.cp,
        dp=layout.dp,
        dp_shard=layout.dp_shard if layout.dp_replicate > 1 else 0,
        dp_sharding=sharding,
        pp_schedule=case.schedule,
        pp_stages_per_rank=case.stages_per_rank,
        activation_checkpoint=case.recompute,
    )
    per_dp = GLOBAL_BATCH // layout.dp
    micro = MICRO if per_dp // MICRO >= case.pp else per_dp // case.pp  # a pipeline needs >= pp micro-batches
    torch._dynamo.utils.counters.clear()
    model = build_parallel_model(
        model_cfg,
        parallel=par,
        layout=layout,
        device=device,
        seed=7,
        n_microbatches=per_dp // micro,
        precision=PrecisionConfig(mode="fp32"),
        compiled=compiled,
    )
    module = fp32_module(model, sharding)
    first = layout.dp_rank * per_dp  # this dp rank's rows of each global batch
    steps = [
        [rows(case, tokens[first + i : first + i + micro]).to(device) for i in range(0, per_dp, micro)]
        for tokens in global_batches(model_cfg.vocab_size)
    ]
    losses, norms = train_steps(module, steps, LR, case.id)
    full = {}
    for part in model.parts:
        full.update(get_model_state_dict(part, options=StateDictOptions(full_state_dict=True)))
    tag = case.id
    torch.save({k: v.detach().cpu().clone() for k, v in full.items()}, out / f"{tag}.rank{layout.rank}.pt")
    kv_flops = _kv_flops(model.parts[0], model_cfg.vocab_size) if layout.tp > model_cfg.n_kv_heads else None
    if layout.rank == 0:
        graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]  # > 0: the blocks did compile
        (out / f"{tag}.json").write_text(
            json.dumps({"losses": losses, "grad_norms": norms, "graphs": graphs, "kv_flops": kv_flops})
        )


def fp32_module(model: ParallelModel, dp_sharding: str) -> TrainModule:
    """The fp32 optimizers as the trainer builds them (ZeRO-1's sharded one included), AdamW at LR
    without clipping, stepped as it steps them (train_steps)."""
    optim, precision = OptimConfig(lr=LR), PrecisionConfig(mode="fp32")
    return TrainModule(model, optim=optim, precision=precision, dp_sharding=dp_sharding, seed=0, max_grad_norm=0.0)


def train_steps(
    module: TrainModule, steps: Iterable[list[Batch]], lr: float, what: str
) -> tuple[list[float], list[float]]:
    """One optimizer step of `module` per list of micro-batches, at `lr`: each step's loss and
    pre-clip gradient norm (a skipped step fails, naming `what`)."""
    losses, norms = [], []
    for number, batches in enumerate(steps, 1):
        norms.append(module.step(batches, lr, number).grad_norm.item())
        (loss,), skipped = module.read_losses()
        assert skipped == 0, f"{what}: a step was skipped"
        losses.append(loss)
    return losses, norms


def rows(case: Case, tokens: torch.Tensor) -> Batch:
    """A micro-batch of `tokens`; under the "documents" variant with document masking."""
    if case.variant != "documents":
        return Batch(tokens, labels_for(tokens))
    tokens = tokens.clone()
    tokens[:, DOCUMENT_ENDS] = EOS
    return make_batch(tokens, EOS, document_masking=True, mask_eos_target=True)


def _kv_flops(part: torch.nn.Module, vocab_size: int) -> int:
    """FLOPs of the first block's wk in one forward of a 1 x SEQ batch (KV projections replicated over tp)."""
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        part(torch.randint(0, vocab_size, (1, SEQ), generator=torch.Generator().manual_seed(0)))
    # keyed by module path from the model's class name (FSDPLlama once FSDP wraps it)
    (wk,) = [counts for name, counts in counter.get_flop_counts().items() if name.endswith(".layers.0.attention.wk")]
    return sum(wk.values())


def layouts(ctx, cases: list[dict], backend: str = "", device: torch.device = CPU) -> None:
    """Scenario: each case (a Case as a dict) in turn over this scenario's processes (one: the reference). `backend`:
    "" eager, else every block compiled with that torch.compile backend (the suite runs eager,
    tests/conftest.py, so compilation is switched back on here). `device`: where they train."""
    compiled = bool(backend)
    patched = (
        mock.patch.object(parallelize, "compile_blocks", functools.partial(compile_blocks, backend=backend))
        if compiled
        else contextlib.nullcontext()
    )
    with torch._dynamo.config.patch(disable=not compiled), patched:
        for case in (Case(**fields) for fields in cases):
            layout = Layout(1, 0, Degrees(), None) if ctx.world == 1 else make_layout(case.degrees, device)
            run(case, layout, ctx.out, compiled, device)
