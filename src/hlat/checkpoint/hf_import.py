"""Read a local Hugging Face LLaMA or Qwen3 directory, and import it as an hlat run directory.

A Hugging Face directory holds config.json, the weights (model.safetensors, or shards listed by
model.safetensors.index.json; pytorch_model.bin[.index.json] also loads, with weights_only=True)
and a tokenizer (tokenizer.json or a SentencePiece tokenizer.model). `import_hf` writes:

  RUN_DIR/config.toml                 [model] the architecture, [data] tokenizer the file below
                                      (and bos = true when that tokenizer adds BOS, as Llama 3's
                                      does), [checkpoint] init_from this directory
  RUN_DIR/tokenizer.json|.model       the model's tokenizer, copied as it is (with
                                      tokenizer_config.json, which names the BOS evaluation uses)
  RUN_DIR/checkpoints/step_00000000/  a weights-only hlat checkpoint (fp32), as archives are

which `hlat eval`, `hlat export` and `--checkpoint.init_from` read like any trained run. config.json's
model_type picks the family (hlat.model.spec: "llama" or "qwen3", model.family); the variants map
to [model] fields (tie_word_embeddings, rope_scaling linear/llama3, head_dim, attention_bias,
mlp_bias); whatever hlat cannot represent (another RoPE type or activation, Qwen3's sliding
window) is refused, naming the config.json field: importing it anyway would give a different model.
"""

from __future__ import annotations

import json
import pickle
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from tqdm import tqdm

from hlat.atomic_files import copy_atomic, write_atomic
from hlat.checkpoint.completeness import IncompleteWeights, check_complete, drop_tied_copy, model_shapes, rename_from_hf
from hlat.checkpoint.errors import refusal
from hlat.checkpoint.hf_config import HF_CONFIG, ImportRefused, hf_model_config, read_hf_config
from hlat.checkpoint.manager import CheckpointManager
from hlat.config.data_paths import TOKENIZER_FILES, find_tokenizer_file
from hlat.config.load import RUN_CONFIG
from hlat.config.model import ModelConfig
from hlat.config.run import RunConfig
from hlat.data.spm import SentencePieceTokenizer
from hlat.data.tokenizer import Tokenizer, hf_adds_bos, load_tokenizer, read_tokenizer_config
from hlat.model import count_params

TOKENIZER_CONFIG = "tokenizer_config.json"
IMPORT_STEP = 0


@dataclass
class ImportSummary:
    run_dir: Path
    checkpoint: Path
    model: ModelConfig
    params: int
    source_dtype: str  # config.json's torch_dtype; the checkpoint holds float32
    tokenizer: Path


def _load_bin(file: Path, mmap: bool = False) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)  # never full unpickling
    except pickle.UnpicklingError as err:
        raise ImportRefused(
            f"{file}: refused, {refusal(err)}; use a trusted copy of the model, preferably safetensors"
        ) from err
    except (RuntimeError, OSError, EOFError, ValueError) as err:  # not a torch file, a truncated zip
        raise ImportRefused(f"{file}: cannot read it as a PyTorch weights file ({err}); re-download it") from err
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ImportRefused(f"{file}: not a state dict of tensors; use the model's own weights file")
    return state


def _read_bin(file: Path) -> Iterator[tuple[str, torch.Tensor]]:
    yield from _load_bin(file).items()


def _safetensors_refused(file: Path, err: Exception) -> ImportRefused:
    return ImportRefused(f"{file}: not a readable safetensors file ({err}); re-download it")


def _read_safetensors(file: Path) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():
                yield name, handle.get_tensor(name)
    except (SafetensorError, OSError) as err:
        raise _safetensors_refused(file, err) from err


def _shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """The names and shapes of a weights file's tensors, read from its header (safetensors) or
    its mapped archive (pytorch_model.bin): no tensor is read."""
    if file.suffix != ".safetensors":
        # mapped when it is a zip archive (torch.save's format since 1.6): the tensors stay on disk
        return {name: tuple(t.shape) for name, t in _load_bin(file, mmap=zipfile.is_zipfile(file)).items()}
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(file), framework="pt") as handle:
            return {name: tuple(handle.get_slice(name).get_shape()) for name in handle.keys()}
    except (SafetensorError, OSError) as err:
        raise _safetensors_refused(file, err) from err


Reader = Callable[[Path], Iterator[tuple[str, torch.Tensor]]]


def _weight_files(directory: Path) -> tuple[list[Path], Reader, int | None]:
    """The weight files of a Hugging Face directory, how to read one, and the number of tensors
    when an index says it."""
    for index_name, reader in (
        ("model.safetensors.index.json", _read_safetensors),
        ("pytorch_model.bin.index.json", _read_bin),
    ):
        index = directory / index_name
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
                shards = sorted(set(weight_map.values()))
                if not all(isinstance(s, str) and s and Path(s).name == s for s in shards):
                    raise TypeError("its files must be names in the directory")
            except (ValueError, RecursionError, KeyError, AttributeError, TypeError) as err:
                raise ImportRefused(f"{index}: not a shard index with a weight_map ({err})") from err
            missing = [s for s in shards if not (directory / s).is_file()]
            if missing:
                raise ImportRefused(f"{index} lists {', '.join(missing)}, which {directory} lacks")
            return [directory / s for s in shards], reader, len(weight_map)
    for name, reader in (("model.safetensors", _read_safetensors), ("pytorch_model.bin", _read_bin)):
        if (directory / name).is_file():
            return [directory / name], reader, None
    raise FileNotFoundError(
        f"{directory} has {HF_CONFIG} but no weights (model.safetensors, "
        "pytorch_model.bin or a sharded index of either)"
    )


def hf_weights(directory: Path, dtype: torch.dtype | None = None, progress: bool = False) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face directory under its Hugging Face name, cast to `dtype` one
    at a time (so a bf16 model is never in memory twice)."""
    files, reader, total = _weight_files(Path(directory))
    out: dict[str, torch.Tensor] = {}
    with tqdm(total=total, unit="tensor", desc="reading weights", disable=not progress, dynamic_ncols=True) as bar:
        for file in files:
            bar.set_postfix_str(file.name)
            for name, tensor in reader(file):
                out[name] = tensor if dtype is None else tensor.to(dtype)
                bar.update()
    return out


def _tied_copy_tolerated(shapes: dict[str, tuple[int, ...]], cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shapes without a tied model's saved output head of the embedding's shape: whether it is
    a copy (dropped) or differs (refused) is known only once both are read (drop_tied_copy)."""
    head, embedding = shapes.get("output.weight"), shapes.get("tok_embeddings.weight")
    if cfg.tie_embeddings and head is not None and head == embedding:
        return {k: v for k, v in shapes.items() if k != "output.weight"}
    return shapes


def hlat_weights(
    directory: Path, cfg: ModelConfig, dtype: torch.dtype | None = None, progress: bool = False, source: str = ""
) -> dict[str, torch.Tensor]:
    """The weights of a Hugging Face directory under hlat's names, cast to `dtype`: exactly the
    tensors of the model of `cfg`, checked by name and shape from the files' headers before any
    tensor is read or cast (IncompleteWeights naming them, as from `source`), and again once read."""
    source = source or str(directory)
    files, _, _ = _weight_files(Path(directory))
    found: dict[str, tuple[int, ...]] = {}
    for file in files:
        found.update(_shapes(file))
    expected = model_shapes(cfg)
    shapes, unknown = rename_from_hf(found, cfg)
    check_complete(source, expected, _tied_copy_tolerated(shapes, cfg), unknown)
    weights, unknown = rename_from_hf(hf_weights(directory, dtype, progress), cfg)
    weights = drop_tied_copy(weights, cfg)
    check_complete(source, expected, {k: tuple(v.shape) for k, v in weights.items()}, unknown)
    return weights


def _import_weights(directory: Path, cfg: ModelConfig, progress: bool) -> dict[str, torch.Tensor]:
    """The weights under hlat's names in fp32 (the training weights' dtype), exactly the tensors
    of the architecture config.json describes (the completeness check --checkpoint.init_from applies)."""
    try:
        return hlat_weights(directory, cfg, torch.float32, progress)
    except IncompleteWeights as err:
        raise ImportRefused(
            f"{err} (the tensors {HF_CONFIG} describes: check its tie_word_embeddings, "
            "attention_bias, mlp_bias and head_dim)"
        ) from err


def _find_tokenizer(
    directory: Path, override: Path | None, cfg: ModelConfig
) -> tuple[Path, Tokenizer | SentencePieceTokenizer]:
    """The tokenizer file to copy, and the tokenizer hlat loaded from it."""
    file = Path(override).expanduser() if override else find_tokenizer_file(directory)
    if file is None or not file.is_file():
        where = override or " nor ".join(str(directory / n) for n in TOKENIZER_FILES)
        raise ImportRefused(
            f"{where} exists: training and evaluation need the "
            "model's tokenizer; pass --tokenizer FILE (a tokenizer.json or SentencePiece .model)"
        )
    try:
        tok = load_tokenizer(file)
    except (ValueError, OSError, RuntimeError) as err:  # e.g. no end-of-document token
        # the fix is usually the model's own tokenizer, which the source directory may lack
        raise ImportRefused(
            f"tokenizer {file}: {err}; or pass the model's own tokenizer with --tokenizer FILE"
        ) from err
    if tok.vocab_size > cfg.vocab_size:
        raise ImportRefused(
            f"tokenizer {file} has {tok.vocab_size} tokens but {HF_CONFIG} vocab_size="
            f"{cfg.vocab_size}; pass the model's own tokenizer with --tokenizer"
        )
    return file, tok


# What `hlat train --config RUN/config.toml` continues pre-training with (the rest: the defaults):
# a short schedule that re-warms over 1% of the steps to a conservative peak and re-decays (cosine;
# docs/checkpoints.md), validation on held-out documents, rows of the model's context (up to hlat's
# default). The data source is the user's: the suggested command names it.
CONTINUED = {
    "optim.lr": 1e-4,
    "schedule.name": "cosine",
    "schedule.warmup_steps": 10,
    "schedule.decay_steps": 1000,
    "train.steps": 1000,
    "train.global_batch": 64,
    "data.val_source": "holdout",
    "eval.every": 100,
}


def continued_seq_len(cfg: ModelConfig) -> int:
    """The rows continued pre-training packs: the model's context, up to hlat's default."""
    return min(cfg.max_seq_len, RunConfig().data.seq_len)


def _run_config_toml(source: Path, run_dir: Path, cfg: ModelConfig, tokenizer: Path, bos: bool) -> str:
    """The architecture and tokenizer, init_from this run, and settings for continued pre-training
    (CONTINUED): `hlat train --config` continues pre-training from the imported weights, in a run
    directory of its own by default (training in the imported one would try to resume from a
    checkpoint that has no optimizer state). A model whose tokenizer adds BOS (Llama 3, LLaMA-2)
    was trained with it: data.bos keeps that for continued training and tells evaluation to put
    BOS in front, as lm-eval does on the original. Only these fields are written, so the rest come
    from --preset or the defaults."""
    run = RunConfig(model=cfg, name=run_dir.name + "-continued")
    run.data.tokenizer, run.data.bos = str(tokenizer), bos
    run.data.seq_len = continued_seq_len(cfg)
    run.checkpoint.init_from = str(run_dir)
    for key, value in CONTINUED.items():
        section, _, name = key.partition(".")
        setattr(getattr(run, section), name, value)
    keys = [f"model.{f.name}" for f in fields(cfg)] + ["data.tokenizer", "data.seq_len", "checkpoint.init_from"]
    keys += [*CONTINUED, *(["data.bos"] if bos else [])]
    return (
        f"# Imported from the Hugging Face model {source} by `hlat import`, with settings to continue its\n"
        "# pre-training on your data (give --data.source); sections not given here take the preset's\n"
        "# (--preset) or the defaults' values.\n" + run.to_toml(keys)
    )


def import_hf(source: Path, run_dir: Path, tokenizer: Path | None = None, progress: bool = False) -> ImportSummary:
    """Write `run_dir` (new or empty) from the Hugging Face LLaMA or Qwen3 directory `source`."""
    source, run_dir = Path(source).expanduser().resolve(), Path(run_dir).expanduser().resolve()
    if not (source / HF_CONFIG).is_file():
        raise ImportRefused(
            f"{source} has no {HF_CONFIG}: give a Hugging Face model directory (save_pretrained's output)"
        )
    if run_dir.exists() and any(run_dir.iterdir()):
        raise ImportRefused(f"{run_dir} exists and is not empty; import into a new directory (nothing is overwritten)")
    cfg = hf_model_config(source)
    tok_file, tok = _find_tokenizer(source, tokenizer, cfg)
    tok_name = tok.FILE_NAME  # named by kind, as `hlat train` stores its tokenizer
    if tokenizer is None:  # copied into the run, whose readers refuse a malformed one: refused here first
        read_tokenizer_config(source / TOKENIZER_CONFIG)
    bos = hf_adds_bos(tok, source / TOKENIZER_CONFIG if tokenizer is None else tok_file.parent / TOKENIZER_CONFIG)
    weights = _import_weights(source, cfg, progress)  # everything is checked before anything is written

    run_dir.mkdir(parents=True, exist_ok=True)
    copy_atomic(tok_file, run_dir / tok_name)
    if (source / TOKENIZER_CONFIG).is_file() and tokenizer is None:
        copy_atomic(source / TOKENIZER_CONFIG, run_dir / TOKENIZER_CONFIG)
    write_atomic(run_dir / RUN_CONFIG, _run_config_toml(source, run_dir, cfg, run_dir / tok_name, bos))
    stats = CheckpointManager(run_dir / "checkpoints", keep_last=None).save(
        IMPORT_STEP,
        {"model": weights},
        None,
        {"progress": {"step": IMPORT_STEP, "tokens": 0}, "imported_from": str(source)},
    )
    config = read_hf_config(source)
    return ImportSummary(
        run_dir,
        stats.path,
        cfg,
        count_params(cfg),
        str(config.get("torch_dtype") or config.get("dtype") or "unknown"),
        run_dir / tok_name,
    )
