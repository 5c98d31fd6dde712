"""Our Llama against Hugging Face LlamaForCausalLM on the same (random, local) weights."""

import pytest
import torch

from hlat.model import Llama, ModelConfig
from hlat.model.hf import hf_config_dict, hf_to_hlat, hlat_to_hf, model_config_from_hf

from deps import require

transformers = require("transformers")

CONFIGS = {
    "mha": ModelConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4,
                       ffn_dim=176, max_seq_len=64, norm_eps=1e-6),
    "gqa": ModelConfig(vocab_size=128, d_model=64, n_layers=2, n_heads=8, n_kv_heads=2,
                       ffn_dim=160, max_seq_len=64, rope_theta=500000.0),
}


def hf_model(cfg: ModelConfig) -> torch.nn.Module:
    torch.manual_seed(0)
    hf_cfg = transformers.LlamaConfig(**hf_config_dict(cfg))
    hf_cfg._attn_implementation = "eager"  # compare against HF's own matmul/softmax path
    model = transformers.LlamaForCausalLM(hf_cfg).float().eval()
    with torch.no_grad():  # perturb everything, norms included, so a swapped mapping shows
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_hf(name: str) -> None:
    cfg = CONFIGS[name]
    hf = hf_model(cfg)
    ours = Llama(cfg).eval()
    ours.load_state_dict(hf_to_hlat(hf.state_dict()), strict=True)
    tokens = torch.randint(0, cfg.vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(48).expand(2, 48) + torch.tensor([[0], [7]])  # row 1 offset by 7
    with torch.no_grad():
        for pos in (None, positions):
            expected = hf(input_ids=tokens, position_ids=pos).logits
            got = ours(tokens, positions=pos)
            assert got.shape == (2, 48, cfg.vocab_size)
            assert (got - expected).abs().max().item() <= 1e-4


@pytest.mark.parametrize("name", list(CONFIGS))
def test_state_dict_round_trip(name: str) -> None:
    sd = hf_model(CONFIGS[name]).state_dict()
    sd = {k: v for k, v in sd.items() if "inv_freq" not in k}
    back = hlat_to_hf(hf_to_hlat(sd))
    assert list(back) == list(sd) and all(back[k] is sd[k] for k in sd)
    ours = Llama(CONFIGS[name]).state_dict()
    assert hf_to_hlat(hlat_to_hf(ours)).keys() == ours.keys()


def test_config_round_trip_and_unknown_keys() -> None:
    for cfg in CONFIGS.values():
        assert model_config_from_hf(hf_config_dict(cfg)) == cfg
        # transformers >= 5 nests rope_theta under rope_parameters in to_dict()
        as_dict = transformers.LlamaConfig(**hf_config_dict(cfg)).to_dict()
        assert model_config_from_hf(as_dict) == cfg
    with pytest.raises(ValueError, match="tie_word_embeddings"):
        model_config_from_hf({**hf_config_dict(CONFIGS["mha"]), "tie_word_embeddings": True})
    with pytest.raises(KeyError, match="model.layers.0.self_attn.q_norm.weight"):
        hf_to_hlat({"model.layers.0.self_attn.q_norm.weight": torch.ones(1)})
    with pytest.raises(KeyError, match="layers.0.attention.wz.weight"):
        hlat_to_hf({"layers.0.attention.wz.weight": torch.ones(1)})
    assert hf_to_hlat({"model.rotary_emb.inv_freq": torch.ones(1),
                       "model.layers.3.self_attn.rotary_emb.inv_freq": torch.ones(1)}) == {}
