"""Mapping between hlat and Hugging Face transformers' LlamaForCausalLM (config and weights), and
the parts other families' mappings are built from (hlat.model.qwen3).

transformers is not imported: it is only a test dependency. Both models use the rotate-half RoPE
convention (HF's `rotate_half`; hlat's `apply_rope` splits head_dim into halves the same way), so
wq/wk are copied as they are, without the q/k row permutation that Meta's interleaved-pair
checkpoints need.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from hlat.config.model import ModelConfig

T = TypeVar("T")

# hlat name -> HF name inside a layer
LAYER_NAMES: dict[str, str] = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    # attention_bias / mlp_bias
    "attention.wq.bias": "self_attn.q_proj.bias",
    "attention.wk.bias": "self_attn.k_proj.bias",
    "attention.wv.bias": "self_attn.v_proj.bias",
    "attention.wo.bias": "self_attn.o_proj.bias",
    "feed_forward.w1.bias": "mlp.gate_proj.bias",
    "feed_forward.w3.bias": "mlp.up_proj.bias",
    "feed_forward.w2.bias": "mlp.down_proj.bias",
}
_TOP_NAMES: dict[str, str] = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_HLAT_LAYER = re.compile(r"layers\.(\d+)\.(.+)")
_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_HF_IGNORED = re.compile(r"(model\.)?(layers\.\d+\.self_attn\.)?rotary_emb\.(original_)?inv_freq")


# hlat field -> key of transformers' rope_scaling (rope_parameters in transformers >= 5)
_ROPE_KEYS: dict[str, dict[str, str]] = {
    "none": {},
    "linear": {"rope_factor": "factor"},
    "llama3": {
        "rope_factor": "factor",
        "rope_low_freq_factor": "low_freq_factor",
        "rope_high_freq_factor": "high_freq_factor",
        "rope_original_max_seq_len": "original_max_position_embeddings",
    },
}


def hf_config_dict(cfg: ModelConfig) -> dict[str, Any]:
    """Keyword arguments for transformers.LlamaConfig describing the same architecture."""
    scaling = cfg.rope_scaling
    return {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.attn_head_dim,
        "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta,
        # the pre-5 form, which transformers 5 still reads (and turns into rope_parameters)
        "rope_scaling": None
        if scaling == "none"
        else {"rope_type": scaling, **{hf: getattr(cfg, ours) for ours, hf in _ROPE_KEYS[scaling].items()}},
        "max_position_embeddings": cfg.max_seq_len,
        "initializer_range": cfg.init_std,
        "hidden_act": "silu",
        "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": cfg.attention_bias,
        "mlp_bias": cfg.mlp_bias,
    }


def _rope_fields(d: dict[str, Any]) -> dict[str, Any]:
    """hlat's rope_* fields from config.json's rope_scaling (transformers < 5: "rope_type", or
    "type" in older files) or rope_parameters (transformers >= 5, which also holds rope_theta)."""
    params = d.get("rope_parameters") or {}
    key, scaling = (
        ("rope_parameters", params)
        if params.get("rope_type", "default") != "default"
        else ("rope_scaling", d.get("rope_scaling") or {})
    )
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    out: dict[str, Any] = {"rope_theta": float(params.get("rope_theta", d.get("rope_theta", 10000.0)))}
    if kind == "default":
        return out
    if kind not in _ROPE_KEYS:
        raise ValueError(
            f"{key}={scaling!r}: hlat implements the RoPE types {', '.join(t for t in _ROPE_KEYS if t != 'none')} "
            f"(not {kind!r}); use a model trained with one of them or none"
        )
    missing = [hf for hf in _ROPE_KEYS[kind].values() if hf not in scaling]
    if missing:
        raise ValueError(f"{key}={scaling!r} lacks {', '.join(missing)}, which rope_type {kind!r} needs")
    return {**out, "rope_scaling": kind, **{ours: scaling[hf] for ours, hf in _ROPE_KEYS[kind].items()}}


def model_config_from_hf(d: dict[str, Any]) -> ModelConfig:
    """ModelConfig from a LlamaConfig dict (`config.to_dict()` or a config.json). Features hlat
    does not implement raise ValueError naming the key, rather than loading a different model."""
    if d.get("model_type", "llama") != "llama":
        raise ValueError(f"model_type={d['model_type']!r}: not a LLaMA model (model_type 'llama')")
    return decoder_config_from_hf(d, "llama")


def decoder_config_from_hf(d: dict[str, Any], family: str) -> ModelConfig:
    """The fields every LLaMA-like config.json shares, as a ModelConfig of `family`."""
    if d.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act={d['hidden_act']!r} is not supported by hlat (needs 'silu': SwiGLU)")
    n_heads = d["num_attention_heads"]
    head_dim = d.get("head_dim") or d["hidden_size"] // n_heads
    rope = _rope_fields(d)
    return ModelConfig(
        vocab_size=d["vocab_size"],
        d_model=d["hidden_size"],
        n_layers=d["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=d.get("num_key_value_heads") or n_heads,
        ffn_dim=d["intermediate_size"],
        # Missing optional keys take LlamaConfig's defaults, which is what HF would use.
        norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        max_seq_len=d.get("max_position_embeddings", 2048),
        init_std=float(d.get("initializer_range", 0.02)),
        head_dim=0 if head_dim * n_heads == d["hidden_size"] else head_dim,  # 0: the LLaMA rule
        tie_embeddings=bool(d.get("tie_word_embeddings", False)),  # LlamaConfig's default
        attention_bias=bool(d.get("attention_bias", False)),
        mlp_bias=bool(d.get("mlp_bias", False)),
        family=family,
        **rope,
    )


def _rename(
    name: str, layer_re: re.Pattern[str], layer_names: dict[str, str], top_names: dict[str, str], layer_prefix: str
) -> str:
    if name in top_names:
        return top_names[name]
    m = layer_re.fullmatch(name)
    if m and m.group(2) in layer_names:
        return f"{layer_prefix}{m.group(1)}.{layer_names[m.group(2)]}"
    raise KeyError(f"unknown parameter name {name!r}")


def renamed_to_hlat(state_dict: dict[str, T], layer_names: Mapping[str, str]) -> dict[str, T]:
    """A Hugging Face state dict under hlat names, `layer_names` (hlat -> HF) inside each layer."""
    to_ours = {hf: ours for ours, hf in layer_names.items()}
    top_names = {hf: ours for ours, hf in _TOP_NAMES.items()}
    return {
        _rename(k, _HF_LAYER, to_ours, top_names, "layers."): v
        for k, v in state_dict.items()
        if not _HF_IGNORED.fullmatch(k)
    }


def renamed_to_hf(state_dict: dict[str, T], layer_names: Mapping[str, str]) -> dict[str, T]:
    """An hlat state dict under Hugging Face names, `layer_names` (hlat -> HF) inside each layer."""
    return {_rename(k, _HLAT_LAYER, layer_names, _TOP_NAMES, "model.layers."): v for k, v in state_dict.items()}


def hf_to_hlat(state_dict: dict[str, T]) -> dict[str, T]:
    """Rename a LlamaForCausalLM state dict to hlat names (tensors are not copied)."""
    return renamed_to_hlat(state_dict, LAYER_NAMES)


def hlat_to_hf(state_dict: dict[str, T]) -> dict[str, T]:
    """Rename an hlat state dict to LlamaForCausalLM names (tensors are not copied)."""
    return renamed_to_hf(state_dict, LAYER_NAMES)


@dataclass(frozen=True)
class HFMapping:
    """A family's counterpart in transformers: its model_type and class, and both directions of
    the config and weight-name mapping (tensors are renamed, never copied)."""

    model_type: str
    architecture: str  # config.json's architectures entry
    config_dict: Callable[[ModelConfig], dict[str, Any]]  # keyword arguments of its transformers config
    model_config: Callable[[dict[str, Any]], ModelConfig]  # from a config.json; ValueError naming the key
    to_hlat: Callable[[dict[str, Any]], dict[str, Any]]  # KeyError on a name hlat has no place for
    to_hf: Callable[[dict[str, Any]], dict[str, Any]]


LLAMA_HF = HFMapping("llama", "LlamaForCausalLM", hf_config_dict, model_config_from_hf, hf_to_hlat, hlat_to_hf)
