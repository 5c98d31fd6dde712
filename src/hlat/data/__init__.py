"""Data pipeline: document sources, tokenizers, HLAT's online packing, offline shards, mixtures."""

from hlat.data.batch import IGNORE_INDEX, make_batch
from hlat.data.catalog import open_entry
from hlat.data.documents import DocumentTokens, OnlineDocuments, split_document
from hlat.data.loader import (
    Validation,
    build_data_tokenizer,
    build_loader,
    holdout_split,
    open_documents,
    open_source,
    tokenizer_corpus,
)
from hlat.data.order import epoch_permutation
from hlat.data.packing import PackedLoader, merge_states
from hlat.data.records import RowSource
from hlat.data.shards import ShardDocuments, check_shard_sources, prepare_shards
from hlat.data.sources import BadDocument, Concat, DocumentSource, StdlibCorpus, TextFiles
from hlat.data.spm import SentencePieceTokenizer
from hlat.data.tokenizer import Tokenizer, build_tokenizer, load_tokenizer, train_bpe

__all__ = [
    "IGNORE_INDEX",
    "BadDocument",
    "Concat",
    "DocumentSource",
    "DocumentTokens",
    "OnlineDocuments",
    "PackedLoader",
    "RowSource",
    "SentencePieceTokenizer",
    "ShardDocuments",
    "StdlibCorpus",
    "TextFiles",
    "Tokenizer",
    "Validation",
    "build_data_tokenizer",
    "build_loader",
    "build_tokenizer",
    "epoch_permutation",
    "holdout_split",
    "load_tokenizer",
    "make_batch",
    "merge_states",
    "open_documents",
    "open_entry",
    "open_source",
    "check_shard_sources",
    "prepare_shards",
    "split_document",
    "tokenizer_corpus",
    "train_bpe",
]
