"""Build a run the way `hlat train` does (Trainer: config, layout, parallel model) and record, for
each parameter this rank holds, the statistics of its full tensor as initialised for training
(a scenario of test_init.py, see tests/runs.py), and whether it is bit-identical to the
single-device model's (the same config and seed, initialised in this process without a layout).
Writes OUT/stats.rank<r>.json: {name: {"std", "mean", "min", "max", "numel", "dtype", "single_device"}}.
"""

import json

import torch

from hlat.config.load import load_config
from hlat.dtensor import full_tensor
from hlat.model import Llama
from hlat.parallel.init import canonical_name, init_parameters
from hlat.precision import cast_parameters
from hlat.train.trainer import Trainer
from runs import ScenarioContext, tiny_args

# Large enough tensors that a sample std is within ~1% of the true one; 4 layers, so a stage of a
# 2-stage pipeline holds 2 and the scaled init must still use the whole model's depth.
MODEL = [
    "--model.d_model", "128", "--model.n_layers", "4", "--model.n_heads", "4", "--model.n_kv_heads", "2",
    "--model.ffn_dim", "256", "--model.init_std", "0.021",
]  # fmt: skip


def measure(ctx: ScenarioContext, layout: list[str]) -> None:
    cfg = load_config("tiny", None, tiny_args(ctx.corpus, ctx.out / "run", *MODEL, *layout))
    trainer = Trainer(cfg, out=lambda _: None)
    single = cast_parameters(Llama(cfg.model), cfg.precision.mode)
    init_parameters(single, single.init_std_of, cfg.train.seed)
    reference = dict(single.named_parameters())
    stats = {}
    for part in trainer.model.parts:
        for name, param in part.named_parameters():
            name = canonical_name(name)
            full = full_tensor(param.detach())  # collective over the parameter's mesh, same order on every rank
            f32 = full.float()
            stats[name] = {
                "std": f32.std().item(),
                "mean": f32.mean().item(),
                "min": f32.min().item(),
                "max": f32.max().item(),
                "numel": full.numel(),
                "dtype": str(param.dtype),
                "single_device": torch.equal(full, reference[name]),
            }
    (ctx.out / f"stats.rank{ctx.rank}.json").write_text(json.dumps(stats))
