"""The initialisation a run actually trains from follows HLAT's rule for every parameter, under
sharded layouts: std init_std everywhere, init_std / sqrt(2 L) for the projections into the
residual stream (attention.wo, feed_forward.w2; L the whole model's layers), norm weights 1; the
values are hlat.parallel.init_values' approximate normal, bounded by 2 sqrt(3) std.

Each layout builds its run through the Trainer in one shared torchrun launch (init_worker.py);
every parameter's full tensor is checked by name against the rule, to 4 standard errors of a
sample std (1/sqrt(2n) relative for a normal, less for this lighter-tailed distribution: 4 x
0.3-0.8% here for the weight matrices), so a std off by a few percent fails (0.02 for 0.021;
output projections scaled by sqrt(L) instead of sqrt(2L)); and it must hold exactly the bits of
the single-device model's parameter (tensor-parallel shards under FSDP, bf16, pipeline stages).
"""

import math

import pytest
import torch

from hlat.config.model import ModelConfig
from hlat.model import Llama
from runs import Scenario

LAYOUTS = {
    "init-tp2-fsdp2-bf16sr": (
        4,
        ["--parallel.tp", "2", "--parallel.dp_sharding", "fsdp", "--precision.mode", "bf16-sr"],
    ),
    "init-pp2": (2, ["--parallel.pp", "2"]),
}
SCENARIOS = [
    Scenario(name, "model/init_worker.py:measure", world, {"layout": layout})
    for name, (world, layout) in LAYOUTS.items()
]
INIT_STD, N_LAYERS = 0.021, 4  # init_worker.MODEL: HLAT 7B's std


def hlat_std(name: str) -> float | None:
    """HLAT's rule (docs/recipe.md), written out independently of the model's own init_std_of."""
    if name.endswith("norm.weight"):
        return None
    if name.endswith(("attention.wo.weight", "feed_forward.w2.weight")):
        return INIT_STD / math.sqrt(2 * N_LAYERS)
    return INIT_STD


@pytest.mark.parametrize("layout", LAYOUTS)
def test_initialisation_follows_hlat_rule(scenarios, layout):
    world = LAYOUTS[layout][0]
    stats = {}
    for rank in range(world):
        stats.update(scenarios.json(layout, f"stats.rank{rank}.json"))  # ranks of other stages add their names
    with torch.device("meta"):
        names = {
            name
            for name, _ in Llama(
                ModelConfig(
                    vocab_size=512, d_model=128, n_layers=4, n_heads=4, n_kv_heads=2, ffn_dim=256, max_seq_len=64
                )
            ).named_parameters()
        }
    assert set(stats) == names  # every parameter of the model, none missing under any stage or shard
    for name, s in stats.items():
        assert s["single_device"], name
        std = hlat_std(name)
        if std is None:
            assert s["min"] == s["max"] == 1.0, (name, s)
            continue
        standard_error = std / math.sqrt(2 * s["numel"])
        assert abs(s["std"] - std) < 4 * standard_error, (name, s["std"], std)
        assert abs(s["mean"]) < 4 * std / math.sqrt(s["numel"]), (name, s["mean"])
        assert max(-s["min"], s["max"]) <= 2 * math.sqrt(3) * std * (1 + 2**-8), (
            name,
            s["min"],
            s["max"],
        )  # bf16 rounding
