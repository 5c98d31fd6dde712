"""Qwen3 dense against transformers' Qwen3ForCausalLM (random weights built here, nothing
downloaded), its sizes, and the family lookup of model.family."""

import dataclasses

import pytest
import torch

from deps import require
from hf_reference import HF_LOGIT_TOLERANCE, perturbed_model
from hlat.config.fields import choices
from hlat.config.load import load_config
from hlat.config.model import ModelConfig
from hlat.errors import ConfigError
from hlat.model import KVCache, build_model, count_params, flops_per_token
from hlat.model.qwen3 import Qwen3, qwen3_config_dict
from hlat.model.spec import QWEN3, SPECS, hf_spec

transformers = require("transformers")

BASE = ModelConfig(
    family="qwen3",
    vocab_size=128,
    d_model=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=32,
    ffn_dim=128,
    max_seq_len=64,
    norm_eps=1e-6,
    rope_theta=1e6,
)
CONFIGS = {
    "gqa-head_dim": BASE,
    "tied": dataclasses.replace(BASE, tie_embeddings=True),
    "mha-bias": dataclasses.replace(BASE, n_kv_heads=4, head_dim=0, attention_bias=True),
}


def _transformers_model(cfg: ModelConfig) -> torch.nn.Module:
    """A Qwen3ForCausalLM of `cfg` with every weight perturbed (norms included, so a swapped or
    missing QK-norm shows)."""
    return perturbed_model(transformers.Qwen3ForCausalLM, transformers.Qwen3Config(**QWEN3.hf.config_dict(cfg)))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_transformers(name: str) -> None:
    cfg = CONFIGS[name]
    hf = _transformers_model(cfg)
    ours = build_model(cfg).eval()
    assert isinstance(ours, Qwen3)
    ours.load_state_dict(QWEN3.hf.to_hlat(hf.state_dict()), strict=True)
    ids = torch.randint(0, cfg.vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (ours(ids) - hf(ids).logits).abs().max().item() <= HF_LOGIT_TOLERANCE
    assert count_params(cfg) == sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters())
    assert QWEN3.hf.to_hf(ours.state_dict()).keys() == {
        k for k in hf.state_dict() if not (cfg.tie_embeddings and k == "lm_head.weight")
    }


def test_config_round_trips_through_transformers() -> None:
    for cfg in CONFIGS.values():
        as_dict = transformers.Qwen3Config(**QWEN3.hf.config_dict(cfg)).to_dict()
        assert hf_spec(as_dict) is QWEN3 and QWEN3.hf.model_config(as_dict) == cfg
    with pytest.raises(ValueError, match="use_sliding_window=true"):
        QWEN3.hf.model_config({**QWEN3.hf.config_dict(BASE), "use_sliding_window": True})
    with pytest.raises(ValueError, match="no MLP biases"):
        QWEN3.hf.config_dict(dataclasses.replace(BASE, mlp_bias=True))
    with pytest.raises(ValueError, match="model_type='mistral': hlat loads the model types 'llama' and 'qwen3'"):
        hf_spec({"model_type": "mistral"})


def test_cached_decoding_matches_a_full_forward() -> None:
    """QK-norm is applied before the keys are cached: step-by-step logits equal one forward's."""
    model = build_model(BASE).eval()
    ids = torch.randint(0, BASE.vocab_size, (1, 12), generator=torch.Generator().manual_seed(2))
    cache = KVCache(ids.shape[1])
    steps = []
    with torch.no_grad():
        full = model(ids)
        for t in range(ids.shape[1]):
            mask = torch.ones(1, 1, 1, t + 1, dtype=torch.bool)
            steps.append(model(ids[:, t : t + 1], positions=torch.tensor([[t]]), attn_mask=mask, cache=cache))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=0, atol=1e-5)


def test_preset_matches_the_model_card() -> None:
    """qwen3-0.6b against transformers' Qwen3ForCausalLM of the same shape (built on meta) and the
    model card's figures: 0.6B parameters, 0.44B without the (tied) embedding."""
    cfg = load_config("qwen3-0.6b").model
    assert (
        cfg.family,
        cfg.n_layers,
        cfg.d_model,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.attn_head_dim,
        cfg.ffn_dim,
        cfg.vocab_size,
        cfg.tie_embeddings,
        cfg.rope_theta,
        cfg.max_seq_len,
    ) == ("qwen3", 28, 1024, 16, 8, 128, 3072, 151936, True, 1e6, 40960)
    with torch.device("meta"):
        hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**QWEN3.hf.config_dict(cfg)))
        ours = build_model(cfg)
    total = sum(p.numel() for p in hf.parameters())
    assert count_params(cfg) == total == sum(p.numel() for p in ours.parameters()) == 596_049_920
    assert f"{total / 1e9:.1f}B" == "0.6B" and f"{(total - cfg.vocab_size * cfg.d_model) / 1e9:.2f}B" == "0.44B"


def test_flops_count_the_query_heads_width() -> None:
    """Qwen3-0.6B's query heads are 2048 wide over d_model 1024: the attention term uses 2048."""
    cfg = load_config("qwen3-0.6b").model
    assert flops_per_token(cfg, 4096) == 6 * (596_049_920) + 12 * 28 * 16 * 128 * 4096  # tied: the head is the matmul


def test_family_is_looked_up_and_checked() -> None:
    assert tuple(SPECS) == choices(ModelConfig, "family")
    assert (
        ModelConfig().family == "llama"
        and type(build_model(dataclasses.replace(BASE, family="llama"))).__name__ == "Llama"
    )
    assert [field for field, _ in dataclasses.replace(BASE, family="qwen2").validate()] == ["family"]


def test_export_refuses_mlp_biases_naming_the_field() -> None:
    """transformers' Qwen3 has no MLP biases: exporting such a run is a configuration error, one line."""
    with pytest.raises(ConfigError, match="model.mlp_bias: true, but Qwen3 has no MLP biases"):
        qwen3_config_dict(ModelConfig(family="qwen3", mlp_bias=True))
