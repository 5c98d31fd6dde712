"""Our Llama against Hugging Face LlamaForCausalLM on the same (random, local) weights."""

import pytest
import torch

from deps import require
from hf_reference import HF_LOGIT_TOLERANCE, perturbed_model
from hlat.config.load import load_config
from hlat.config.model import ModelConfig
from hlat.model import Llama, count_params
from hlat.model.hf import hf_config_dict, hf_to_hlat, hlat_to_hf, model_config_from_hf

transformers = require("transformers")

CONFIGS = {
    "mha": ModelConfig(
        vocab_size=128, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, ffn_dim=176, max_seq_len=64, norm_eps=1e-6
    ),
    "gqa": ModelConfig(
        vocab_size=128,
        d_model=64,
        n_layers=2,
        n_heads=8,
        n_kv_heads=2,
        ffn_dim=160,
        max_seq_len=64,
        rope_theta=500000.0,
    ),
    # SmolLM2's variant: the output head is the embedding matrix
    "tied": ModelConfig(
        vocab_size=128,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        ffn_dim=160,
        max_seq_len=64,
        tie_embeddings=True,
    ),
    # Llama 3.1's RoPE at a small scale: pre-trained at 16 positions, so the 48 tested take all
    # three bands of the llama3 rule (scaled, blended, kept) across head_dim 16's frequencies
    "llama3-rope": ModelConfig(
        vocab_size=128,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        ffn_dim=160,
        max_seq_len=64,
        rope_theta=500000.0,
        rope_scaling="llama3",
        rope_factor=8.0,
        rope_original_max_seq_len=16,
    ),
    "linear-rope-head_dim-bias": ModelConfig(
        vocab_size=128,
        d_model=64,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        ffn_dim=160,
        max_seq_len=64,
        head_dim=24,
        attention_bias=True,
        mlp_bias=True,
        rope_scaling="linear",
        rope_factor=4.0,
    ),
}


def hf_model(cfg: ModelConfig) -> torch.nn.Module:
    hf_cfg = transformers.LlamaConfig(**hf_config_dict(cfg))
    hf_cfg._attn_implementation = "eager"  # compare against HF's own matmul/softmax path
    return perturbed_model(transformers.LlamaForCausalLM, hf_cfg)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_hf(name: str) -> None:
    cfg = CONFIGS[name]
    hf = hf_model(cfg)
    ours = Llama(cfg).eval()
    weights = hf_to_hlat(hf.state_dict())
    if cfg.tie_embeddings:  # transformers' state dict names the tied matrix twice, hlat's once
        assert weights.pop("output.weight").data_ptr() == weights["tok_embeddings.weight"].data_ptr()
    ours.load_state_dict(weights, strict=True)
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters()) == count_params(cfg)
    tokens = torch.randint(0, cfg.vocab_size, (2, 48), generator=torch.Generator().manual_seed(1))
    positions = torch.arange(48).expand(2, 48) + torch.tensor([[0], [7]])  # row 1 offset by 7
    with torch.no_grad():
        for pos in (None, positions):
            expected = hf(input_ids=tokens, position_ids=pos).logits
            got = ours(tokens, positions=pos)
            assert got.shape == (2, 48, cfg.vocab_size)
            assert (got - expected).abs().max().item() <= HF_LOGIT_TOLERANCE


@pytest.mark.parametrize("name", list(CONFIGS))
def test_state_dict_round_trip(name: str) -> None:
    sd = hf_model(CONFIGS[name]).state_dict()
    sd = {k: v for k, v in sd.items() if "inv_freq" not in k}
    back = hlat_to_hf(hf_to_hlat(sd))
    assert list(back) == list(sd) and all(back[k] is sd[k] for k in sd)
    ours = Llama(CONFIGS[name]).state_dict()
    assert hf_to_hlat(hlat_to_hf(ours)).keys() == ours.keys()
    assert ("output.weight" in ours) == (not CONFIGS[name].tie_embeddings)


def test_config_round_trip_and_unknown_keys() -> None:
    for cfg in CONFIGS.values():
        assert model_config_from_hf(hf_config_dict(cfg)) == cfg
        # transformers >= 5 nests rope_theta under rope_parameters in to_dict()
        as_dict = transformers.LlamaConfig(**hf_config_dict(cfg)).to_dict()
        assert model_config_from_hf(as_dict) == cfg
    with pytest.raises(ValueError, match="rope_scaling=.*'yarn'"):
        model_config_from_hf({**hf_config_dict(CONFIGS["mha"]), "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(ValueError, match="lacks low_freq_factor"):
        model_config_from_hf({**hf_config_dict(CONFIGS["mha"]), "rope_scaling": {"type": "llama3", "factor": 8.0}})
    with pytest.raises(ValueError, match="hidden_act='gelu'"):
        model_config_from_hf({**hf_config_dict(CONFIGS["mha"]), "hidden_act": "gelu"})
    with pytest.raises(KeyError, match="model.layers.0.self_attn.q_norm.weight"):
        hf_to_hlat({"model.layers.0.self_attn.q_norm.weight": torch.ones(1)})
    with pytest.raises(KeyError, match="layers.0.attention.wz.weight"):
        hlat_to_hf({"layers.0.attention.wz.weight": torch.ones(1)})
    assert (
        hf_to_hlat(
            {"model.rotary_emb.inv_freq": torch.ones(1), "model.layers.3.self_attn.rotary_emb.inv_freq": torch.ones(1)}
        )
        == {}
    )


def test_tied_weight_is_one_parameter_through_conversions() -> None:
    """to_empty, dtype casts and load_state_dict(assign=True) replace Parameters module by module;
    the tie survives each, and the optimizer sees the matrix once."""
    cfg = CONFIGS["tied"]
    with torch.device("meta"):
        model = Llama(cfg)
    model.to_empty(device="cpu")
    assert model.output.weight is model.tok_embeddings.weight
    model = model.to(torch.bfloat16)
    assert model.output.weight is model.tok_embeddings.weight
    weights = {k: torch.randn(v.shape) for k, v in Llama(cfg).state_dict().items()}
    model.load_state_dict(weights, assign=True)
    assert model.output.weight is model.tok_embeddings.weight
    assert torch.equal(model.output.weight, weights["tok_embeddings.weight"])
    assert [n for n, _ in model.named_parameters()].count("output.weight") == 0


def test_variant_validation_names_field_and_fix() -> None:
    base = CONFIGS["mha"]
    cases = {
        "head_dim": dict(head_dim=15),
        "rope_scaling": dict(rope_scaling="yarn"),
        "rope_factor": dict(rope_scaling="linear", rope_factor=0.5),
        "rope_high_freq_factor": dict(rope_scaling="llama3", rope_factor=8.0, rope_high_freq_factor=1.0),
        "tie_embeddings": dict(tie_embeddings="yes"),
    }
    for field, change in cases.items():
        problems = dict(ModelConfig(**{**base.__dict__, **change}).validate())
        assert field in problems, (field, problems)
    # accepted: tied embeddings under pipeline parallelism (bf16-sr too: the two copies' rounding
    # noise is keyed by the shared name), a vocabulary tp shards unevenly
    load_config(
        "tiny",
        None,
        ["--model.tie_embeddings", "true", "--parallel.pp", "2", "--parallel.dp_sharding", "zero2"],
        world=2,
    )
    load_config(
        "tiny", None, ["--model.tie_embeddings", "true", "--parallel.pp", "2", "--precision.mode", "bf16-sr"], world=2
    )
    load_config(
        "tiny", None, ["--model.vocab_size", "4097", "--parallel.tp", "2", "--parallel.dp_sharding", "zero2"], world=2
    )
    # an explicit head_dim frees d_model from being a multiple of n_heads
    assert ModelConfig(**{**base.__dict__, "d_model": 60, "head_dim": 16}).validate() == []
