"""The LLaMA model (single device), sizing and the Hugging Face weight mapping."""

from hlat.model.kv_cache import KVCache
from hlat.model.llama import Llama
from hlat.model.size import count_params, flops_per_token

__all__ = ["KVCache", "Llama", "count_params", "flops_per_token"]
