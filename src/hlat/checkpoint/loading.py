"""Load a model for evaluation or export: an hlat checkpoint, an hlat run directory, or a local
Hugging Face LLaMA directory (config.json + safetensors or pytorch_model.bin + tokenizer.json).

`load_checkpoint_weights` is the only function here that reads hlat checkpoints; it goes through
hlat.checkpoint.manager.CheckpointManager like training does.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from hlat.checkpoint.errors import CheckpointError
from hlat.checkpoint.hf_import import hf_model_config, hlat_weights
from hlat.checkpoint.manager import MANIFEST, CheckpointManager
from hlat.config.data import DataConfig
from hlat.config.data_paths import find_tokenizer_file
from hlat.config.load import RUN_CONFIG, read_run_config
from hlat.config.model import ModelConfig
from hlat.data.spm import SentencePieceTokenizer
from hlat.data.tokenizer import Tokenizer, build_tokenizer, hf_adds_bos, load_tokenizer, read_tokenizer_config
from hlat.errors import DataError, UserError
from hlat.model import Llama, build_model
from hlat.model.footprint import memory_problem
from hlat.model.llama import rope_tables


@dataclass
class LoadedModel:
    model: Llama
    tokenizer: Tokenizer
    name: str  # what was loaded, for results and messages
    prefix_token: int  # conditions an empty context: BOS when the model has one, else EOS
    step: int | None = None  # hlat checkpoints: optimizer step and tokens seen
    tokens: int | None = None
    bos: bool = False  # every context begins with BOS: trained with data.bos, or an HF tokenizer adding it


def is_run_dir(path: Path) -> bool:
    return (path / RUN_CONFIG).is_file() and (path / "checkpoints").is_dir()


def run_checkpoints(run_dir: Path) -> list[Path]:
    """Saved checkpoints of a run directory, oldest first."""
    return CheckpointManager(Path(run_dir) / "checkpoints", keep_last=1).checkpoints()


def load_checkpoint_weights(checkpoint: Path, model: Llama) -> dict[str, int]:
    """Fill `model` (an hlat Llama on the CPU) from one saved checkpoint (or weights-only archive)
    after verifying it against its manifest; return its progress {"step", "tokens"}. The weights
    are sharded by torch.distributed.checkpoint and keyed by name, so any training layout loads."""
    checkpoint = Path(checkpoint)
    manager = CheckpointManager(checkpoint.parent, keep_last=None)
    manager.check(checkpoint)  # sizes, checksums, and DCP metadata checked against an allow-list
    state = {"model": model.state_dict()}  # DCP fills these tensors (the parameters) in place
    manager.load_sharded(checkpoint, state)
    return dict(manager.load_shared(checkpoint).get("progress", {}))


def load_model(
    path: str | Path, tokenizer: str | Path | None = None, dtype: torch.dtype = torch.float32
) -> LoadedModel:
    """The model at `path` (see the module docstring); a run directory loads its newest checkpoint.
    `tokenizer` (a tokenizer.json) overrides the one found next to the model."""
    path = Path(path).expanduser()
    if (path / "config.json").is_file():
        return _load_hf(path, tokenizer, dtype)
    if is_run_dir(path):
        saved = run_checkpoints(path)
        if not saved:
            raise FileNotFoundError(
                f"run directory {path} has no checkpoints under checkpoints/; "
                "train it first or pass a checkpoint directory"
            )
        return _newest_valid(path, saved, tokenizer, dtype)
    if (path / MANIFEST).is_file():
        return load_hlat_checkpoint(path, tokenizer, dtype)
    raise FileNotFoundError(
        f"{path} is neither an hlat checkpoint (step_NNNNNNNN/ with {MANIFEST}), an hlat run "
        "directory (config.toml + checkpoints/) nor a Hugging Face model directory (config.json)"
    )


def _newest_valid(run_dir: Path, saved: list[Path], tokenizer: str | Path | None, dtype: torch.dtype) -> LoadedModel:
    """A run directory's newest checkpoint that passes verification: a corrupt or partial one is
    named on stderr and skipped, as a resumed training run skips it."""
    problems = []
    for checkpoint in reversed(saved):
        try:
            return load_hlat_checkpoint(checkpoint, tokenizer, dtype)
        except CheckpointError as err:
            print(f"warning: skipping checkpoint {checkpoint}: {err}", file=sys.stderr, flush=True)
            problems.append(checkpoint.name)
    raise CheckpointError(
        f"run directory {run_dir}: no checkpoint passes verification ({', '.join(problems)}; each named above); "
        "pass a checkpoint directory of another run or train this one again"
    )


def load_hlat_checkpoint(
    checkpoint: Path,
    tokenizer: str | Path | None = None,
    dtype: torch.dtype = torch.float32,
    cached: tuple[ModelConfig, DataConfig, Tokenizer] | None = None,
) -> LoadedModel:
    """One checkpoint of a run; `cached` (configs, tokenizer) skips re-reading them in a sweep.
    A run trained with data.bos is evaluated with BOS in front of every context and as prefix."""
    run_dir = checkpoint.parent.parent
    if cached is None:
        run = read_run_config(run_dir)
        model_cfg, data_cfg = run.model, run.data
        tok = run_tokenizer(run_dir, data_cfg, model_cfg.vocab_size, tokenizer)
    else:
        model_cfg, data_cfg, tok = cached
    model = empty_model(model_cfg, dtype)
    progress = load_checkpoint_weights(checkpoint, model)
    prefix = tok.bos_id if data_cfg.bos and tok.bos_id is not None else prefix_token(run_dir, tok)
    return LoadedModel(
        model.eval(),
        tok,
        f"{run_dir.name}/{checkpoint.name}",
        prefix,
        progress.get("step"),
        progress.get("tokens"),
        bos=data_cfg.bos,
    )


def run_tokenizer(
    run_dir: Path, data: DataConfig, vocab_size: int, override: str | Path | None = None
) -> Tokenizer | SentencePieceTokenizer:
    """The tokenizer a run trained with: an explicit file, else the run directory's tokenizer.json
    or tokenizer.model, else the config's data.tokenizer, else the cached BPE that build_tokenizer
    trained on the corpus."""
    if override is not None:
        if not Path(override).expanduser().is_file():
            raise FileNotFoundError(f"--tokenizer {override}: no such file")
        return fitting_tokenizer(override, vocab_size)
    for candidate in (find_tokenizer_file(run_dir), data.tokenizer):
        if candidate and Path(candidate).expanduser().is_file():
            return fitting_tokenizer(candidate, vocab_size)
    from hlat.data.loader import open_source

    try:
        source = open_source(data)
    except Exception as err:
        raise FileNotFoundError(
            f"cannot find the tokenizer of {run_dir}: it was a BPE trained on data.source="
            f"{data.source or '(embedded corpus)'}, which cannot be opened ({err}); pass "
            "--tokenizer PATH/tokenizer.json"
        ) from err
    return build_tokenizer(data, vocab_size, source)[0]


def fitting_tokenizer(file: str | Path, vocab_size: int) -> Tokenizer | SentencePieceTokenizer:
    """The tokenizer in `file`, refused when it has ids the model has no embedding row for (they
    would index past the embedding mid-generation)."""
    tok = load_tokenizer(file)
    if tok.vocab_size > vocab_size:
        raise DataError(
            f"tokenizer {file} has {tok.vocab_size} tokens but the model's vocabulary has {vocab_size}; "
            "pass the tokenizer the model was trained with (--tokenizer PATH)"
        )
    return tok


def _load_hf(directory: Path, tokenizer: str | Path | None, dtype: torch.dtype) -> LoadedModel:
    cfg = hf_model_config(directory, dtype.itemsize)
    tok_file = Path(tokenizer) if tokenizer else find_tokenizer_file(directory)
    if tok_file is None or not tok_file.is_file():
        raise FileNotFoundError(
            f"{tokenizer or directory / 'tokenizer.json'}: no such file; pass --tokenizer PATH "
            "(a Hugging Face tokenizer.json or a SentencePiece .model)"
        )
    tok = fitting_tokenizer(tok_file, cfg.vocab_size)
    weights = hlat_weights(directory, cfg, dtype)  # names and shapes checked before any is read
    model = empty_model(cfg, dtype)
    model.load_state_dict(weights, strict=True)
    return LoadedModel(
        model.eval(),
        tok,
        directory.name,
        prefix_token(directory, tok),
        bos=hf_adds_bos(tok, directory / "tokenizer_config.json"),
    )


def prefix_token(directory: Path, tok: Tokenizer | SentencePieceTokenizer) -> int:
    """What an empty context is conditioned on, as lm-eval does: the BOS named by the directory's
    tokenizer_config.json (a Hugging Face model, or a run hlat import made from one), else EOS
    (hlat trains with EOS between documents)."""
    bos = read_tokenizer_config(directory / "tokenizer_config.json").get("bos_token")
    if isinstance(bos, dict):
        bos = bos.get("content")
    bos_id = tok.token_id(bos) if isinstance(bos, str) else None
    return tok.eos_id if bos_id is None else bos_id


def empty_model(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> Llama:
    """A model of `cfg` with uninitialised weights on the CPU, to be filled from a checkpoint: a 7B model
    is not randomly initialised only to be overwritten. A model this machine cannot hold (an
    absurd size in a config someone else wrote) is refused before anything is allocated."""
    too_big = memory_problem(cfg, dtype.itemsize)
    if too_big:
        raise UserError(f"[model] {too_big}; check n_layers, d_model, ffn_dim, vocab_size and max_seq_len")
    with torch.device("meta"):
        model = build_model(cfg)
    model = model.to_empty(device="cpu")
    model.rope_cos, model.rope_sin = rope_tables(cfg)
    return model.to(dtype)  # the model keeps its RoPE tables in fp32 through a cast
