"""Test helpers: save a tiny hlat model as a run directory and as a Hugging Face model directory."""

from __future__ import annotations

import shutil
from pathlib import Path

from hlat.checkpoint.manager import CheckpointManager
from hlat.model import Llama
from hlat.model.hf import hf_config_dict, hlat_to_hf
from hlat.toml_value import toml_value


def save_run(run_dir: Path, model: Llama, tokenizer_file: Path, steps: list[int]) -> Path:
    """A run directory in the format hlat train writes: config.toml, checkpoints/step_*/ (weights
    only, as archives are); the tokenizer is copied to <run>/tokenizer.json."""
    cfg = model.cfg
    model_toml = "\n".join(f"{k} = {toml_value(v)}" for k, v in vars(cfg).items())
    (run_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    (run_dir / "config.toml").write_text(f'name = "tiny"\n\n[model]\n{model_toml}\n\n[data]\nseq_len = 64\n')
    shutil.copy(tokenizer_file, run_dir / "tokenizer.json")
    manager = CheckpointManager(run_dir / "checkpoints", keep_last=None)
    for step in steps:
        sd = {k: v * (1.0 + 0.01 * step) for k, v in model.state_dict().items()}
        manager.save(step, {"model": sd}, None, {"progress": {"step": step, "tokens": step * 512}})
    return run_dir


def save_hf(
    directory: Path, model: Llama, tokenizer_file: Path, eos_token: str = "<|endoftext|>", bos_token: str | None = None
) -> Path:
    import transformers

    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf_config_dict(model.cfg)))
    hf.load_state_dict(hlat_to_hf(model.state_dict()), strict=False)  # HF keeps rotary buffers
    hf.save_pretrained(directory)
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_file=str(tokenizer_file), eos_token=eos_token, bos_token=bos_token
    )
    tok.save_pretrained(directory)
    return directory
