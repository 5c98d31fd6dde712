"""Build a run the way `hlat train` does (Trainer: config, layout, parallel model) and record, for
each parameter this rank holds, the statistics of its full tensor as initialised for training
(a scenario of test_init.py, see tests/runs.py). Writes OUT/stats.rank<r>.json:
{name: {"std", "mean", "min", "max", "numel"}}.
"""

import json

import torch

from hlat.config import load_config
from hlat.parallel.dtensor import full_tensor
from hlat.parallel.init import canonical_name
from hlat.train.trainer import Trainer

from runs import ScenarioContext, tiny_args

# Large enough tensors that a sample std is within ~1% of the true one; 4 layers, so a stage of a
# 2-stage pipeline holds 2 and the scaled init must still use the whole model's depth.
MODEL = ["--model.d_model", "128", "--model.n_layers", "4", "--model.n_heads", "4", "--model.n_kv_heads", "2",
         "--model.ffn_dim", "256", "--model.init_std", "0.021"]


def measure(ctx: ScenarioContext, layout: list[str]) -> None:
    cfg = load_config("tiny", None, tiny_args(ctx.corpus, ctx.out / "run", *MODEL, *layout))
    trainer = Trainer(cfg, out=lambda _: None)
    stats = {}
    for part in trainer.model.parts:
        for name, param in part.named_parameters():
            full = full_tensor(param.detach()).float()  # collective over the parameter's mesh, same order on every rank
            stats[canonical_name(name)] = {"std": full.std().item(), "mean": full.mean().item(), "min": full.min().item(),
                                           "max": full.max().item(), "numel": full.numel(), "dtype": str(param.dtype)}
    (ctx.out / f"stats.rank{ctx.rank}.json").write_text(json.dumps(stats))
