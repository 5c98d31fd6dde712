import pytest
import torch

from hlat.config.load import load_config
from hlat.config.model import ModelConfig
from hlat.model import Llama, count_params, flops_per_token

SEVENTY_B = ModelConfig(d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28672)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_count_params_matches_built_model(n_kv_heads: int) -> None:
    cfg = ModelConfig(
        vocab_size=101, d_model=32, n_layers=3, n_heads=4, n_kv_heads=n_kv_heads, ffn_dim=88, max_seq_len=16
    )
    model = Llama(cfg)
    assert count_params(cfg) == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    "preset,published", [("smollm2-135m", "134.5M"), ("llama3.2-1b", "1.24B"), ("llama3.1-8b", "8.03B")]
)
def test_llama_presets_match_published_counts(preset: str, published: str) -> None:
    """Against the model cards' parameter counts (rounded as they print them)."""
    n = count_params(load_config(preset).model)
    assert (f"{n / 1e6:.1f}M" if published.endswith("M") else f"{n / 1e9:.2f}B") == published


@pytest.mark.parametrize(
    "variant", [dict(tie_embeddings=True), dict(attention_bias=True, mlp_bias=True), dict(head_dim=12, d_model=40)]
)
def test_count_params_of_variants(variant: dict) -> None:
    cfg = ModelConfig(
        **{
            **ModelConfig(
                vocab_size=101, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, ffn_dim=88, max_seq_len=16
            ).__dict__,
            **variant,
        }
    )
    assert count_params(cfg) == sum(p.numel() for p in Llama(cfg).parameters())


def test_recipe_sizes_are_exact() -> None:
    assert count_params(ModelConfig()) == 6_738_415_616
    assert count_params(SEVENTY_B) == 68_976_648_192
    with torch.device("meta"):  # the analytic count agrees with the real module tree at 7B
        assert sum(p.numel() for p in Llama(ModelConfig()).parameters()) == 6_738_415_616


def test_flops_per_token_by_hand() -> None:
    cfg = ModelConfig(vocab_size=100, d_model=16, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=32)
    # per block: wq 16*16 + wk,wv 2*16*8 + wo 16*16 + mlp 3*16*32 + norms 2*16 = 2336
    # total 2*100*16 + 2*2336 + 16 = 7888; without the input embedding 7888 - 1600 = 6288
    assert count_params(cfg) == 7888
    assert flops_per_token(cfg, seq_len=32) == 6 * 6288 + 12 * 2 * 16 * 32
    assert flops_per_token(ModelConfig(), 4096) == 6 * (6_738_415_616 - 32000 * 4096) + 12 * 32 * 4096 * 4096
