"""Data pipeline: document sources, tokenizers, and HLAT's online packing loader."""

from hlat.data.config import DataConfig, default_cache_dir
from hlat.data.packing import IGNORE_INDEX, Batch, PackedLoader, epoch_permutation, split_document
from hlat.data.sources import (
    DocumentSource,
    StdlibCorpus,
    TextFiles,
    check_source_path,
    open_source,
)
from hlat.data.tokenizer import Tokenizer, build_tokenizer, train_bpe

__all__ = [
    "IGNORE_INDEX",
    "Batch",
    "DataConfig",
    "DocumentSource",
    "PackedLoader",
    "StdlibCorpus",
    "TextFiles",
    "Tokenizer",
    "build_tokenizer",
    "check_source_path",
    "default_cache_dir",
    "epoch_permutation",
    "open_source",
    "split_document",
    "train_bpe",
]
