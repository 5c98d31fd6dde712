"""The HLAT presets hold every setting of the paper's two runs (HLAT.md, docs/recipe.md).

One row per line of the paper's recipe table; the parallel layout is checked separately because
the 70B preset departs from the paper's TP 32 on purpose (TP stays within an 8-GPU node).
"""

from __future__ import annotations

import pytest

from hlat.config.load import load_config
from hlat.config.run import RunConfig

SHARED = {
    "model.vocab_size": 32000,
    "model.norm_eps": 1e-5,
    "model.rope_theta": 1e4,
    "model.max_seq_len": 4096,
    "data.seq_len": 4096,
    "train.global_batch": 1024,
    "optim.beta1": 0.9,
    "optim.beta2": 0.95,
    "optim.eps": 1e-8,
    "optim.weight_decay": 0.1,
    "optim.grad_clip": 1.0,
    "optim.weight_decay_scope": "all",  # the reference scripts decayed every parameter
    "schedule.name": "hlat-cosine",
    "schedule.warmup_steps": 2000,
    "schedule.decay_steps": 500_000,
    "schedule.min_lr_ratio": 0.1,
    "train.steps": 430_000,
    "parallel.activation_checkpoint": "selective",
}
RECIPE = {
    "hlat-7b": {
        **SHARED,
        "model.n_layers": 32,
        "model.d_model": 4096,
        "model.n_heads": 32,
        "model.n_kv_heads": 32,
        "model.ffn_dim": 11008,
        "model.init_std": 0.021,
        "optim.lr": 3e-4,
        "precision.mode": "bf16-sr",
        "checkpoint.every": 1000,
        "checkpoint.keep_last": 5,
        "checkpoint.archive_every_tokens": 100_000_000_000,
        "checkpoint.async_save": False,
        "parallel.tp": 8,
        "parallel.pp": 1,
    },
    "hlat-70b": {
        **SHARED,
        "model.n_layers": 80,
        "model.d_model": 8192,
        "model.n_heads": 64,
        "model.n_kv_heads": 8,
        "model.ffn_dim": 28672,
        "model.init_std": 0.02,
        "optim.lr": 1.5e-4,
        "precision.mode": "mixed",
        "checkpoint.every": 300,
        "checkpoint.keep_last": 3,
        "checkpoint.archive_every_tokens": 0,
        "checkpoint.async_save": True,
        "parallel.pp": 8,
        "parallel.pp_schedule": "1f1b",
    },
}


def value(cfg: RunConfig, key: str) -> object:
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


@pytest.mark.parametrize("preset", sorted(RECIPE))
def test_preset_is_the_papers_recipe(preset: str) -> None:
    cfg = load_config(preset)
    wrong = {key: (value(cfg, key), want) for key, want in RECIPE[preset].items() if value(cfg, key) != want}
    assert not wrong, f"{preset} differs from HLAT.md (got, want): {wrong}"
    assert cfg.train.global_batch * cfg.data.seq_len == 4_194_304  # 4.19M tokens per step
    assert cfg.train.global_batch * cfg.data.seq_len * cfg.train.steps == pytest.approx(1.8e12, rel=0.01)


def test_a_config_file_without_a_preset_is_not_the_7b_run(tmp_path) -> None:
    """The built-in defaults give the 7B model, optimizer and schedule, but a single-device layout
    in fp32: what docs/recipe.md says a preset-less file trains."""
    path = tmp_path / "empty.toml"
    path.write_text("")
    cfg, seven = load_config(None, path), load_config("hlat-7b")
    assert cfg.model == seven.model and cfg.schedule == seven.schedule and cfg.optim.lr == seven.optim.lr
    assert (cfg.precision.mode, cfg.parallel.tp, cfg.optim.weight_decay_scope) == ("fp32", 1, "matrices")
