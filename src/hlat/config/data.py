"""Configuration of the data pipeline: where documents come from, how they are tokenized, packed.

The dataclass only holds and checks values; what needs the filesystem (do the paths it names
exist?) is ``path_problems``, which ``DataConfig.validate`` calls.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from hlat.config.data_paths import check_source_path, find_tokenizer_file, source_entries
from hlat.config.fields import choices


def default_cache_dir() -> Path:
    """$HLAT_CACHE if set, else ~/.cache/hlat."""
    env = os.environ.get("HLAT_CACHE", "")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hlat"


@dataclass
class DataConfig:
    """`[data]`: where documents come from, how they are tokenized and packed into rows."""

    source: str = ""
    """Where the training documents come from; "" = the embedded corpus (the Python standard
    library's source). Otherwise a data file or directory (Arrow, Parquet, JSONL[.gz|.zst], text, a
    datasets.save_to_disk directory, token shards from `hlat prepare`) or hf:NAME; several,
    comma-separated, make a mixture."""
    weights: str = ""
    """Mixture weights, comma-separated, one per source entry ("" = equal weights)."""
    text_field: str = "text"
    """The column / JSON field holding each document's text: one name for every source, or a
    mixture's names, comma-separated, one per data.source entry (as data.weights)."""
    split: str = "train"
    """The split of a Hugging Face dataset (hf:NAME or a saved DatasetDict)."""
    hf_config: str = ""
    """The configuration (subset) name of an hf:NAME dataset; "" = its default."""
    bad_documents: Literal["error", "skip"] = "error"
    """What to do with a document that cannot be read (bad UTF-8, missing text field, bad JSON).
    "error" stops with its file and row; "skip" counts it, logs it, and goes on."""
    verify_shards: Literal["cached", "full"] = "cached"
    """Token shards (hlat prepare) are checked when a run opens them: each file against its SHA-256
    and every token id below the vocabulary, in one pass. "cached": once per file and node, as long
    as the file is unchanged (its size, modification time and inode); "full": every time."""
    tokenizer: str = ""
    """The tokenizer: "" = train a byte-level BPE on the source with the model's vocab size
    (cached); otherwise a Hugging Face tokenizer.json or a SentencePiece .model."""
    seq_len: int = 4096
    """Tokens per training row: every row is exactly this long (the HLAT reference hard-coded 4096)."""
    max_doc_chars: int = 100_000
    """Documents longer than this many characters are split (at newlines if possible) before
    tokenization; they still get a single EOS at their end."""
    document_masking: bool = False
    """Beyond HLAT: attention stays inside each document and positions restart at its start."""
    mask_eos_target: bool = True
    """With document_masking, do not train EOS -> first token of the next (unrelated) document."""
    bos: bool = False
    """Begin each document with the tokenizer's BOS (BOS + tokens + EOS), as Llama 3 was trained.
    Off: HLAT packed with EOS only. Needs a tokenizer with a BOS token (not the trained BPE)."""
    virtual_shards: int = 0
    """Each source's documents are dealt into this many virtual shards, owned round-robin by the
    data-parallel ranks; it bounds the data-parallel size and makes resharding exact. 0 = auto:
    512, or the smallest power of two at least the data-parallel size where that is larger,
    chosen at a run's first start and kept on every resume (the run's config.toml records it)."""
    val_source: str = ""
    """Validation data: "" = none; "holdout" = a fraction of the (first) source's documents, never
    trained on; otherwise a separate source entry."""
    val_fraction: float = 0.001
    """With val_source "holdout": the fraction of the source's documents held out."""
    tokenizer_train_chars: int = 8_000_000
    """Cap on the characters used to train the BPE tokenizer, to keep training fast."""
    cache_dir: str = ""
    """Where tokenizers and Arrow copies of Parquet/JSONL files are cached; "" = $HLAT_CACHE or
    ~/.cache/hlat."""

    def resolved_cache_dir(self) -> Path:
        return Path(self.cache_dir).expanduser() if self.cache_dir else default_cache_dir()

    def shard_count(self, dp_size: int) -> int:
        """The virtual shards dealt over `dp_size` data-parallel ranks: the set count, or auto's."""
        return self.virtual_shards or auto_virtual_shards(dp_size)

    def weight_list(self) -> list[float]:
        n = len(source_entries(self.source))
        if not self.weights.strip():
            return [1.0] * n
        return [float(w) for w in self.weights.split(",")]

    def text_fields(self) -> list[str]:
        """data.text_field per data.source entry: one name serves them all."""
        n = len(source_entries(self.source))
        if "," not in self.text_field:
            return [self.text_field] * n
        return [f.strip() for f in self.text_field.split(",")]

    def for_entry(self, index: int) -> DataConfig:
        """This config as data.source entry `index` reads it (its own text field)."""
        return replace(self, text_field=self.text_fields()[index])

    def validate(self) -> list[tuple[str, str]]:
        """Problems as (field, message naming the fix); empty when the config is usable."""
        problems: list[tuple[str, str]] = []
        if self.seq_len < 2:
            problems.append(("seq_len", f"seq_len={self.seq_len} is too small; use at least 2 (HLAT uses 4096)"))
        if self.max_doc_chars < 1:
            problems.append(
                (
                    "max_doc_chars",
                    f"max_doc_chars={self.max_doc_chars} must be positive (default 100000)",
                )
            )
        if self.tokenizer_train_chars < 1:
            problems.append(
                (
                    "tokenizer_train_chars",
                    f"tokenizer_train_chars={self.tokenizer_train_chars} must be positive (default 8000000)",
                )
            )
        if self.bad_documents not in choices(DataConfig, "bad_documents"):
            problems.append(
                ("bad_documents", f"{self.bad_documents!r}: use {' or '.join(choices(DataConfig, 'bad_documents'))}")
            )
        if self.verify_shards not in choices(DataConfig, "verify_shards"):
            problems.append(
                ("verify_shards", f"{self.verify_shards!r}: use {' or '.join(choices(DataConfig, 'verify_shards'))}")
            )
        if self.virtual_shards < 0:
            problems.append(("virtual_shards", f"{self.virtual_shards} must be positive, or 0 for auto (the default)"))
        if not 0 < self.val_fraction < 1:
            problems.append(("val_fraction", f"{self.val_fraction} must be in (0, 1) (default 0.001)"))
        entries = source_entries(self.source)
        try:
            weights = self.weight_list()
            if len(weights) != len(entries) or any(not w > 0 for w in weights):
                raise ValueError
        except ValueError:
            problems.append(
                (
                    "weights",
                    f"{self.weights!r}: give {len(entries)} positive numbers, "
                    "comma-separated, one per data.source entry",
                )
            )
        fields = self.text_fields()
        if len(fields) != len(entries) or not all(fields):
            problems.append(
                (
                    "text_field",
                    f"{self.text_field!r} names {len(fields)} fields for {len(entries)} data.source entries; give one "
                    f"name for every source, or {len(entries)} comma-separated, one per entry",
                )
            )
        return problems + path_problems(self)


def path_problems(cfg: DataConfig) -> list[tuple[str, str]]:
    """Problems with the paths a data config names (sources, tokenizer, cache directory), found
    by looking at the filesystem without reading any data."""
    problems: list[tuple[str, str]] = []
    extra = [cfg.val_source] if cfg.val_source not in ("", "holdout") else []
    for entry in source_entries(cfg.source) + extra:
        problem = check_source_path(entry)
        if problem:
            problems.append(("val_source" if entry == cfg.val_source else "source", problem))
    if cfg.tokenizer:
        path = Path(cfg.tokenizer).expanduser()
        if not path.exists():
            problems.append(
                (
                    "tokenizer",
                    f"no such file: {cfg.tokenizer}; give a Hugging Face tokenizer.json, a "
                    "SentencePiece .model, or leave empty to train a byte-level BPE",
                )
            )
        elif path.is_dir():
            found = find_tokenizer_file(path)
            fix = f"use {found}" if found else "give a tokenizer.json or SentencePiece .model"
            problems.append(("tokenizer", f"{cfg.tokenizer} is a directory; {fix}"))
    if cfg.cache_dir and Path(cfg.cache_dir).expanduser().is_file():
        problems.append(("cache_dir", f"{cfg.cache_dir} is a file; give a directory or leave empty"))
    return problems


AUTO_VIRTUAL_SHARDS = 512  # enough for a few hundred data-parallel ranks; a power of two, as auto's others


def auto_virtual_shards(dp_size: int) -> int:
    """data.virtual_shards = 0: 512, or the smallest power of two at least `dp_size` above it (room
    to resume at any smaller data-parallel size; each shard is one rank's at a time)."""
    return max(AUTO_VIRTUAL_SHARDS, 1 << max(0, dp_size - 1).bit_length())
