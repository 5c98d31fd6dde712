"""config.json of a Hugging Face model directory, read as untrusted input: the one reader of it for
`hlat import`, `--checkpoint.init_from hf:DIR` and `hlat eval --checkpoint HF_DIR`.

The file is read only when it is a small regular file; every field hlat uses is type- and range-
checked before anything is computed from it (JSON allows NaN, Infinity, nesting and any type);
the ModelConfig it maps to is validated; and the model it describes is sized against this
machine's memory before anything is allocated. Every refusal is one line naming the file and field.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hlat.config.model import ModelConfig
from hlat.data.sources import open_regular
from hlat.errors import DataError, UserError
from hlat.model.footprint import memory_problem
from hlat.model.spec import hf_spec

HF_CONFIG = "config.json"
MAX_CONFIG_BYTES = 1 << 20  # real ones are a few KB


class ImportRefused(UserError, ValueError):
    """The source cannot become an hlat model as it is; the message names the file or field."""


_POSITIVE_INT = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "max_position_embeddings", "original_max_position_embeddings")  # fmt: skip
_POSITIVE_INT_OR_NULL = ("num_key_value_heads", "head_dim")
_FINITE = ("rms_norm_eps", "initializer_range", "rope_theta", "factor", "low_freq_factor", "high_freq_factor")
_BOOL = ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window")
_TEXT = ("model_type", "hidden_act", "rope_type", "type")
_TEXT_OR_NULL = ("torch_dtype", "dtype")
_TABLE_OR_NULL = ("rope_scaling", "rope_parameters")


def _field_problem(key: str, value: Any) -> str | None:
    """Why the value cannot be config.json's `key` (as hlat reads it), or None."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if key in _POSITIVE_INT or (key in _POSITIVE_INT_OR_NULL and value is not None):
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        return None if ok else f"{key}={value!r} must be a positive integer"
    if key in _FINITE and not (number and math.isfinite(value)):
        return f"{key}={value!r} must be a finite number"
    if key in _BOOL and not isinstance(value, bool):
        return f"{key}={value!r} must be true or false"
    if key in _TEXT and not isinstance(value, str) or key in _TEXT_OR_NULL and not isinstance(value, (str, type(None))):
        return f"{key}={value!r} must be a string"
    if key in _TABLE_OR_NULL and not isinstance(value, (dict, type(None))):
        return f"{key}={value!r} must be an object or null"
    return None


def config_problems(config: dict[str, Any]) -> list[str]:
    """Every field hlat reads (and those of rope_scaling / rope_parameters) that has the wrong type
    or range; other keys are not read and not checked."""
    problems = [p for key, value in config.items() if (p := _field_problem(key, value))]
    for table in _TABLE_OR_NULL:
        if isinstance(config.get(table), dict):
            problems += [f"{table}.{p}" for key, value in config[table].items() if (p := _field_problem(key, value))]
    return problems


def read_hf_config(directory: Path) -> dict[str, Any]:
    """config.json of a Hugging Face directory as a dict, or ImportRefused naming the file."""
    file = Path(directory) / HF_CONFIG
    try:
        with open_regular(file) as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise ImportRefused(f"{file} is over {MAX_CONFIG_BYTES >> 20} MiB, not a model's config.json")
        config = json.loads(data)
    except (OSError, ValueError, RecursionError, DataError) as err:  # JSONDecodeError, not UTF-8: ValueErrors
        if isinstance(err, ImportRefused):
            raise
        why = "nested too deeply" if isinstance(err, RecursionError) else str(err)
        raise ImportRefused(f"cannot read {file}: {why}; give a Hugging Face model directory") from err
    if not isinstance(config, dict):
        raise ImportRefused(f"{file} holds a JSON {type(config).__name__}, not an object; give a model's config.json")
    return config


def hf_model_config(directory: Path, bytes_per_param: int = 4) -> ModelConfig:
    """The hlat architecture of a Hugging Face directory's config.json, checked as the module says,
    its weights at `bytes_per_param` bytes each; or ImportRefused naming the file and field."""
    file = Path(directory) / HF_CONFIG
    config = read_hf_config(directory)
    problems = config_problems(config)
    if problems:
        raise ImportRefused(f"{file}: " + "; ".join(problems))
    try:
        cfg = hf_spec(config).hf.model_config(config)
    except ValueError as err:
        raise ImportRefused(f"{file}: {err}") from err
    except KeyError as err:
        raise ImportRefused(f"{file} lacks {err.args[0]!r}, which every LlamaConfig has") from err
    problems = [m for _, m in cfg.validate()]
    if problems:
        raise ImportRefused(f"{file}: not a shape hlat supports: " + "; ".join(problems))
    too_big = memory_problem(cfg, bytes_per_param)
    if too_big:
        raise ImportRefused(
            f"{file}: {too_big}; check num_hidden_layers, hidden_size, intermediate_size, vocab_size "
            "and max_position_embeddings"
        )
    return cfg
