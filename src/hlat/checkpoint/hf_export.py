"""Write a Hugging Face directory (LLaMA or Qwen3: the run's model.family) from any hlat checkpoint:
safetensors shards (with an index when there are several), config.json and the run's tokenizer files.

The weights are read through the checkpoint loader (hlat.checkpoint.loading), which reassembles full
tensors from a checkpoint of any training layout; only the names change (hlat.model.hf).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from hlat.atomic_files import atomic_path, copy_atomic, write_atomic
from hlat.checkpoint.loading import load_model
from hlat.config.data_paths import find_tokenizer_file
from hlat.config.load import RUN_CONFIG
from hlat.errors import UserError
from hlat.model import model_spec
from hlat.output_dir import clear_own_files, is_empty

# what an export writes: all that --overwrite removes
EXPORT_FILES = (
    "model.safetensors", "model-*-of-*.safetensors", "model.safetensors.index.json", "config.json",
    "tokenizer.json", "tokenizer.model", "tokenizer_config.json",
)  # fmt: skip
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Exported:
    out: Path
    architecture: str  # the transformers class written (e.g. LlamaForCausalLM)
    checkpoint: str  # what was read: <run>/step_N
    step: int | None  # its optimizer step (None for a checkpoint that records none)


def export_hf(
    source: Path, out: Path, max_shard_bytes: int = 5 * 2**30, dtype: str = "float32", overwrite: bool = False
) -> Exported:
    """`source`: an hlat checkpoint (step_N/), archive, or run directory (its newest checkpoint).
    `out` must be missing or empty; with `overwrite`, an earlier export there is removed first
    (hlat.output_dir)."""
    from safetensors.torch import save_file

    if dtype not in DTYPES:
        raise UserError(f"--dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    loaded = load_model(source)
    mapping = model_spec(loaded.model.cfg).hf
    hf_config = mapping.config_dict(loaded.model.cfg)  # refuses what the family's transformers class cannot hold
    run_dir = Path(source) if (Path(source) / RUN_CONFIG).is_file() else Path(source).parent.parent
    if not is_empty(out):  # stale shards of an earlier export would be read with the new config
        if not overwrite:
            raise UserError(
                f"{out} is not empty: export into a new or empty directory, or give --overwrite to replace "
                "an earlier export there"
            )
        clear_own_files(out, EXPORT_FILES, "hlat export")
    weights = {k: v.to(DTYPES[dtype]).contiguous() for k, v in mapping.to_hf(loaded.model.state_dict()).items()}
    out.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in weights.items():  # greedy, in layer order, as transformers does
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    if len(shards) == 1:
        _save_shard(save_file, shards[0], out / "model.safetensors")
    else:
        weight_map = {}
        for i, shard in enumerate(shards, 1):
            file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            _save_shard(save_file, shard, out / file)
            weight_map.update(dict.fromkeys(shard, file))
        total = sum(t.numel() * t.element_size() for t in weights.values())
        write_atomic(
            out / "model.safetensors.index.json",
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1),
        )
    tok = loaded.tokenizer
    config = {
        **hf_config,
        "architectures": [mapping.architecture],
        "model_type": mapping.model_type,
        "torch_dtype": dtype,
        "eos_token_id": tok.eos_id,
        "bos_token_id": tok.bos_id if loaded.bos else None,
    }
    write_atomic(out / "config.json", json.dumps(config, indent=1))
    tok_file = find_tokenizer_file(run_dir)
    if tok_file is not None:
        copy_atomic(tok_file, out / tok_file.name)
    # Documents end with EOS, and begin with BOS only when the run trained with data.bos: say so,
    # or a LLaMA tokenizer class would add a BOS (and lm-eval conditions empty contexts on its BOS).
    bos = {"bos_token": tok.bos_token} if loaded.bos else {}
    write_atomic(
        out / "tokenizer_config.json",
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": tok.eos_token,
                **bos,
                "add_bos_token": loaded.bos,
                "model_max_length": loaded.model.cfg.max_seq_len,
            },
            indent=1,
        ),
    )
    return Exported(out, mapping.architecture, loaded.name, loaded.step)


def _save_shard(save_file: Callable[..., None], tensors: dict[str, torch.Tensor], path: Path) -> None:
    with atomic_path(path) as temporary:
        mode = stat.S_IMODE(temporary.stat().st_mode)  # a plain open's, as every other file written
        save_file(tensors, str(temporary), metadata={"format": "pt"})  # replaces it with an owner-only file
        os.chmod(temporary, mode)
