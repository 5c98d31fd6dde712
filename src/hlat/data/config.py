"""Configuration of the data pipeline: where documents come from, how they are tokenized, packed."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


def default_cache_dir() -> Path:
    """$HLAT_CACHE if set, else ~/.cache/hlat."""
    env = os.environ.get("HLAT_CACHE", "")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "hlat"


@dataclass
class DataConfig:
    # "" = the embedded corpus (the Python standard library's source); otherwise a path to a plain
    # text file or a directory of text files (one document per file).
    source: str = ""
    # "" = train a byte-level BPE on the source with the model's vocab size (cached);
    # otherwise a path to a Hugging Face tokenizer.json.
    tokenizer: str = ""
    # Every training row is exactly seq_len tokens (the HLAT reference hard-coded 4096).
    seq_len: int = 4096
    # Documents longer than this many characters are split (at newlines if possible) before
    # tokenization; they still get a single EOS at their end.
    max_doc_chars: int = 100_000
    # Cap on the characters used to train the BPE tokenizer, to keep training fast.
    tokenizer_train_chars: int = 8_000_000
    # "" = $HLAT_CACHE or ~/.cache/hlat.
    cache_dir: str = ""

    def resolved_cache_dir(self) -> Path:
        return Path(self.cache_dir).expanduser() if self.cache_dir else default_cache_dir()

    def validate(self) -> list[tuple[str, str]]:
        """Problems as (field, message naming the fix); empty when the config is usable."""
        from hlat.data.sources import check_source_path  # local: sources imports this module

        problems: list[tuple[str, str]] = []
        if self.seq_len < 2:
            problems.append(
                ("seq_len", f"seq_len={self.seq_len} is too small; use at least 2 (HLAT uses 4096)")
            )
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
                    f"tokenizer_train_chars={self.tokenizer_train_chars} must be positive "
                    "(default 8000000)",
                )
            )
        if self.source:
            problem = check_source_path(self.source)
            if problem:
                problems.append(("source", problem))
        if self.tokenizer:
            path = Path(self.tokenizer).expanduser()
            if not path.exists():
                problems.append(
                    (
                        "tokenizer",
                        f"no such file: {self.tokenizer}; give a path to a Hugging Face "
                        "tokenizer.json or leave empty to train a byte-level BPE on the source",
                    )
                )
            elif path.is_dir():
                if (path / "tokenizer.json").is_file():
                    fix = path / "tokenizer.json"
                    problems.append(("tokenizer", f"{self.tokenizer} is a directory; use {fix}"))
                else:
                    problems.append(
                        (
                            "tokenizer",
                            f"{self.tokenizer} is a directory without tokenizer.json; give the "
                            "path of a Hugging Face tokenizer.json (SentencePiece .model files "
                            "come later)",
                        )
                    )
            elif path.suffix == ".model":
                problems.append(
                    (
                        "tokenizer",
                        f"{self.tokenizer}: SentencePiece .model files are not supported yet (they "
                        "come later); convert it to a Hugging Face tokenizer.json or leave empty",
                    )
                )
        if self.cache_dir and Path(self.cache_dir).expanduser().is_file():
            problems.append(
                ("cache_dir", f"{self.cache_dir} is a file; give a directory or leave empty")
            )
        return problems
