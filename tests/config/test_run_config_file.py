"""A run directory's config.toml has one writer (RunConfig.to_toml) and one reader
(hlat.config.load.read_run_config); files written before either change still load."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hlat.checkpoint.hf_import import _run_config_toml
from hlat.config.load import load_config, read_run_config
from hlat.config.model import ModelConfig
from hlat.config.run import RunConfig
from hlat.errors import ConfigError, UserError

MODEL = ModelConfig(
    vocab_size=512,
    d_model=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    ffn_dim=128,
    max_seq_len=256,
    tie_embeddings=True,
    family="qwen3",
    head_dim=32,
)
# what `hlat import` wrote for MODEL before it built a RunConfig (its own TOML text)
IMPORTED_BEFORE = """# Imported from the Hugging Face model /m/hf by `hlat import`. Sections not given
# here take the preset's (--preset) or the defaults' values.
name = "imported-continued"

[model]
vocab_size = 512
d_model = 64
n_layers = 2
n_heads = 4
n_kv_heads = 2
ffn_dim = 128
norm_eps = 1e-05
rope_theta = 10000.0
max_seq_len = 256
init_std = 0.021
head_dim = 32
tie_embeddings = true
attention_bias = false
mlp_bias = false
rope_scaling = "none"
rope_factor = 1.0
rope_low_freq_factor = 1.0
rope_high_freq_factor = 4.0
rope_original_max_seq_len = 8192
family = "qwen3"

[data]
tokenizer = "RUN/tokenizer.json"
bos = true
seq_len = 256
val_source = "holdout"

[optim]
lr = 0.0001

[schedule]
name = "cosine"
warmup_steps = 10
decay_steps = 1000

[train]
steps = 1000
global_batch = 64

[checkpoint]
init_from = "RUN"

[eval]
every = 100
"""


@pytest.mark.parametrize("preset", [None, "small"])
def test_an_import_writes_the_configuration_it_wrote_before(tmp_path: Path, preset: str | None) -> None:
    run = tmp_path / "imported"
    run.mkdir()
    (run / "tokenizer.json").touch()  # validation asks that it exists
    before, after = tmp_path / "before.toml", tmp_path / "after.toml"
    before.write_text(IMPORTED_BEFORE.replace("RUN", str(run)))
    after.write_text(_run_config_toml(Path("/m/hf"), run, MODEL, run / "tokenizer.json", True))
    old, new = load_config(preset, before), load_config(preset, after)
    assert new == old and new.user_set == old.user_set  # the same fields set, the rest the preset's
    assert read_run_config(after) == read_run_config(before)


def test_a_run_config_round_trips_through_the_one_writer(tmp_path: Path) -> None:
    cfg = load_config("qwen3-0.6b", overrides=["--parallel.compile", "false", "--train.callbacks", "a.b:C"])
    (tmp_path / "config.toml").write_text(cfg.to_toml())
    read = read_run_config(tmp_path)  # a run directory or its file
    assert read == cfg and read_run_config(tmp_path / "config.toml") == cfg


def test_a_config_toml_written_before_newer_fields_loads(tmp_path: Path) -> None:
    old = "".join(
        line for line in RunConfig().to_toml().splitlines(keepends=True) if not line.startswith(("family = ", "cp = "))
    )
    (tmp_path / "config.toml").write_text(old)
    cfg = read_run_config(tmp_path)
    assert cfg.model.family == "llama" and cfg.parallel.cp == 1 and cfg == RunConfig()


def test_a_bad_run_config_names_the_file_and_field(tmp_path: Path) -> None:
    (tmp_path / "config.toml").write_text(RunConfig(model=dataclasses.replace(MODEL, n_kv_heads=3)).to_toml())
    with pytest.raises(
        ConfigError, match=r"model\.n_kv_heads: n_heads=4 is not divisible by n_kv_heads=3; .* \(in .*config\.toml\)"
    ):
        read_run_config(tmp_path)
    (tmp_path / "config.toml").write_text("[model\n")
    with pytest.raises(UserError, match="cannot read the run config"):
        read_run_config(tmp_path)
