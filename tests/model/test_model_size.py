import pytest
import torch

from hlat.model import Llama, ModelConfig, count_params, flops_per_token

SEVENTY_B = ModelConfig(d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28672)


@pytest.mark.parametrize("n_kv_heads", [4, 2, 1])
def test_count_params_matches_built_model(n_kv_heads: int) -> None:
    cfg = ModelConfig(vocab_size=101, d_model=32, n_layers=3, n_heads=4, n_kv_heads=n_kv_heads,
                      ffn_dim=88, max_seq_len=16)
    model = Llama(cfg)
    assert count_params(cfg) == sum(p.numel() for p in model.parameters())


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
    assert flops_per_token(ModelConfig(), 4096) == 6 * (6_738_415_616 - 32000 * 4096) \
        + 12 * 32 * 4096 * 4096
