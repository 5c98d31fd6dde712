"""The model families (single device: LLaMA, Qwen3), their specs, sizing and Hugging Face mappings."""

from hlat.model.kv_cache import KVCache
from hlat.model.llama import Llama
from hlat.model.spec import ModelSpec, build_model, count_params, flops_per_token, model_spec

__all__ = ["KVCache", "Llama", "ModelSpec", "build_model", "count_params", "flops_per_token", "model_spec"]
