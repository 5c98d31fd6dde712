"""Scenario of test_document_masking_pp.py: a few training steps of a model whose rows hold several
documents (EOS = 0), with document masking, on one process and on 2 pipeline stages. Each run
writes its per-step losses and final validation loss to <out>/<schedule>.json (rank 0)."""

import json

import torch

from hlat.config.layout import Degrees
from hlat.config.model import ModelConfig
from hlat.config.optim import OptimConfig
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.data.batch import make_batch
from hlat.optim import build_adamw
from hlat.parallel.mesh import Layout, make_layout
from hlat.parallel.parallelize import build_parallel_model
from hlat.train.optimizers import Optimizers
from hlat.train.step import train_step

MODEL = ModelConfig(vocab_size=128, d_model=64, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=32)
EOS, GLOBAL_BATCH, SEQ, MICRO, STEPS = 0, 8, 32, 2, 2


def losses(ctx, schedules: list[str]) -> None:  # type: ignore[no-untyped-def]
    """Scenario: train under each pipeline schedule (world 1: the single-process reference)."""
    for schedule in schedules:
        pp = ctx.world
        layout = Layout(1, 0, Degrees(), None) if pp == 1 else make_layout(Degrees(pp=pp), torch.device("cpu"))
        par = ParallelConfig(pp=pp, pp_schedule=schedule, pp_stages_per_rank=2 if schedule == "interleaved-1f1b" else 1)
        model = build_parallel_model(
            MODEL,
            parallel=par,
            layout=layout,
            device=torch.device("cpu"),
            seed=7,
            n_microbatches=GLOBAL_BATCH // MICRO,
            precision=PrecisionConfig(mode="fp32"),
        )
        optimizers = Optimizers(model.parts, lambda part: build_adamw(part, OptimConfig(lr=1e-3)))
        gen = torch.Generator().manual_seed(1)
        steps = []
        for _ in range(STEPS):
            tokens = torch.randint(1, MODEL.vocab_size, (GLOBAL_BATCH, SEQ), generator=gen)
            tokens[torch.rand(GLOBAL_BATCH, SEQ, generator=gen) < 0.08] = EOS  # ~2.5 documents per row
            batches = [make_batch(tokens[i : i + MICRO], EOS, True, True) for i in range(0, GLOBAL_BATCH, MICRO)]
            rank_loss, _ = train_step(model, optimizers, batches, grad_clip=1.0)
            steps.append(model.reduce_loss(rank_loss).item())
        val = model.validation_loss(batches)
        if ctx.rank == 0:
            (ctx.out / f"{schedule}.json").write_text(json.dumps({"losses": steps, "val": val}))
