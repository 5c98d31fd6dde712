"""Tokenizers: a thin wrapper over Hugging Face ``tokenizers``, and a cached byte-level BPE trainer.

``Tokenizer`` (tokenizer.json) and ``SentencePieceTokenizer`` (``.model``, in spm.py) have the same
members (``vocab_size``, ``eos_id``, ``bos_id``, ``encode_batch``, ``decode``, ``fingerprint``,
``save``);
``load_tokenizer`` picks one by the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from hlat.atomic_files import atomic_path
from hlat.data.sources import BadDocument, DocumentSource, open_regular
from hlat.data.spm import SentencePieceTokenizer
from hlat.digests import short_sha256
from hlat.errors import DataError

EOS_CANDIDATES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>")  # LLaMA-1/2, GPT-2/NeoX, LLaMA-3, Gemma
# Not Llama 3's "<|eot_id|>": it ends a chat turn, "<|end_of_text|>" ends a pre-training document.
BOS_CANDIDATES = ("<s>", "<|begin_of_text|>", "<bos>")  # LLaMA-1/2 and Mistral, LLaMA-3, Gemma
BPE_EOS = "<|endoftext|>"
# Bump when the BPE recipe below changes, so cached tokenizers trained the old way are not reused.
_BPE_RECIPE = "bytelevel-bpe-v1"
MAX_TOKENIZER_CONFIG_BYTES = 1 << 20  # real ones are a few KB (Llama 3's, with its chat template, 50 KB)


def find_special(tk: tokenizers.Tokenizer, candidates: Sequence[str]) -> str | None:
    """The first candidate that is one of the tokenizer's special tokens, else the first it has as
    an ordinary token (a tokenizer.json that does not mark its specials), else None. Specials come
    first so that a merged ordinary token spelled like an earlier candidate is never picked."""
    special = {t.content for t in tk.get_added_tokens_decoder().values() if t.special}
    return next((c for c in candidates if c in special), None) or next(
        (c for c in candidates if tk.token_to_id(c) is not None), None
    )


class Tokenizer:
    """A text <-> token-id mapping with a known EOS id, and a BOS id when the vocabulary has one of
    BOS_CANDIDATES (else None). Encoding never adds BOS or any other special token, even when the
    tokenizer.json's post-processor would (Llama 3's), and special-token text inside documents (a
    literal "<|endoftext|>") is encoded as ordinary text, so only the packer ever emits EOS/BOS."""

    FILE_NAME = "tokenizer.json"  # its name in a run, shard or model directory

    def __init__(self, tk: tokenizers.Tokenizer, eos_token: str, origin: str = ""):
        eos_id = tk.token_to_id(eos_token)
        if eos_id is None:
            where = f" {origin}" if origin else ""
            raise DataError(f"tokenizer{where} has no token {eos_token!r}")
        self.tk = tk
        self.eos_token = eos_token
        self.eos_id: int = eos_id
        self.origin = origin  # where it came from, for messages
        self.bos_token: str | None = find_special(tk, BOS_CANDIDATES)
        self.bos_id: int | None = None if self.bos_token is None else tk.token_to_id(self.bos_token)
        try:  # documents' text must never turn into control tokens
            tk.encode_special_tokens = True
        except AttributeError:  # tokenizers < 0.19
            pass
        vocab = tk.get_vocab(with_added_tokens=True)
        # The embedding needs max id + 1 rows (ids may have holes, so len(vocab) is not enough).
        self.vocab_size: int = max(vocab.values()) + 1 if vocab else 0
        self._fingerprint: str | None = None
        self._encode_batch = getattr(tk, "encode_batch_fast", tk.encode_batch)

    def token_id(self, token: str) -> int | None:
        """The id of a vocabulary entry (e.g. a special token), or None."""
        return self.tk.token_to_id(token)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Tokenizer:
        """Load a Hugging Face tokenizer.json; its EOS is the first of EOS_CANDIDATES that it knows
        (find_special: special tokens first)."""
        path = Path(path).expanduser()
        try:
            tk = tokenizers.Tokenizer.from_file(str(path))
        except Exception as e:  # the Rust error says what is wrong with the JSON
            raise DataError(f"cannot load tokenizer {path} as a Hugging Face tokenizer.json: {e}") from e
        eos = find_special(tk, EOS_CANDIDATES)
        if eos is not None:
            return cls(tk, eos, origin=str(path))
        raise DataError(
            f"tokenizer {path} has no end-of-document token: looked for "
            f"{', '.join(EOS_CANDIDATES)}; add one of them as a special token"
        )

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text (Rust, parallel); no BOS/EOS or other special tokens added."""
        if not texts:
            return []
        return [e.ids for e in self._encode_batch(texts, add_special_tokens=False)]

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.tk.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def fingerprint(self) -> str:
        """Identity of the mapping (vocab, merges, normalization, pre-tokenization) and EOS."""
        if self._fingerprint is None:
            self._fingerprint = short_sha256(f"{self.tk.to_str()}|eos={self.eos_id}")
        return self._fingerprint

    def save(self, path: str | os.PathLike) -> None:
        """Write tokenizer.json atomically (a temp file in the same folder, then rename)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as temporary:
            self.tk.save(str(temporary))

    def __repr__(self) -> str:
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, eos={self.eos_token!r}={self.eos_id}, "
            f"bos={self.bos_token!r}={self.bos_id}, origin={self.origin!r})"
        )


def hf_adds_bos(tok: Tokenizer | SentencePieceTokenizer, tokenizer_config: Path) -> bool:
    """Whether Hugging Face's tokenizer puts BOS in front of what it encodes (lm-eval's HF backend
    then starts every context with it): for a tokenizer.json its post-processor decides, as in
    transformers' PreTrainedTokenizerFast (Llama 3's and LLaMA-2's add BOS); for a SentencePiece
    model, ``add_bos_token`` in the model directory's tokenizer_config.json."""
    if tok.bos_id is None:
        return False
    if isinstance(tok, Tokenizer):
        return tok.tk.encode("a", add_special_tokens=True).ids[:1] == [tok.bos_id]
    return read_tokenizer_config(tokenizer_config).get("add_bos_token") is True


def read_tokenizer_config(path: Path) -> dict:
    """A Hugging Face tokenizer_config.json as a dict ({} when there is none), read as untrusted
    input: a regular file of at most MAX_TOKENIZER_CONFIG_BYTES holding a JSON object, else
    DataError naming it."""
    if not path.exists():
        return {}
    try:
        with open_regular(path) as f:
            data = f.read(MAX_TOKENIZER_CONFIG_BYTES + 1)
        if len(data) > MAX_TOKENIZER_CONFIG_BYTES:
            raise DataError(
                f"{path} is over {MAX_TOKENIZER_CONFIG_BYTES >> 20} MiB, not a tokenizer_config.json; "
                "replace it with the model's own or remove it"
            )
        config = json.loads(data)
    except (OSError, ValueError, RecursionError) as err:  # JSONDecodeError and bad UTF-8 are ValueErrors
        if isinstance(err, DataError):
            raise
        why = "nested too deeply" if isinstance(err, RecursionError) else str(err)
        raise DataError(f"cannot read {path}: {why}; replace it with the model's own or remove it") from err
    if not isinstance(config, dict):
        raise DataError(
            f"{path} holds a JSON {type(config).__name__}, not an object; replace it with the model's own or remove it"
        )
    return config


def load_tokenizer(path: str | os.PathLike) -> Tokenizer | SentencePieceTokenizer:
    """A tokenizer.json (Hugging Face) or a SentencePiece .model (told apart by content: a .model
    is a protobuf, a tokenizer.json starts with '{')."""
    path = Path(path).expanduser()
    with open(path, "rb") as f:
        head = f.read(64).lstrip()
    return Tokenizer.from_file(path) if head.startswith(b"{") else SentencePieceTokenizer(path)


def _sample_order(n: int) -> list[int]:
    """A fixed pseudo-random order of n documents (a hash, so it is the same everywhere), so the
    BPE is trained on a spread of the corpus rather than on its alphabetically first files."""
    return sorted(range(n), key=lambda i: hashlib.blake2b(str(i).encode(), digest_size=8).digest())


def _training_texts(
    source: DocumentSource, max_chars: int, stats: dict, progress: Callable[[int], object] | None
) -> Iterator[str]:
    budget = max_chars
    chars = nbytes = docs = bad = 0
    for i in _sample_order(len(source)):
        if budget <= 0:
            break
        try:
            text = source[i]
        except BadDocument:
            bad += 1  # unreadable documents do not shape the vocabulary; counted in the stats
            continue
        if not text.strip():
            continue
        text = text[:budget]
        budget -= len(text)
        chars += len(text)
        nbytes += len(text.encode("utf-8", errors="replace"))
        docs += 1
        if progress is not None:
            progress(len(text))
        yield text
    stats.update(chars=chars, bytes=nbytes, docs=docs, bad=bad)


def train_bpe(
    source: DocumentSource,
    vocab_size: int,
    max_chars: int = 8_000_000,
    _stats: dict | None = None,
    progress: Callable[[int], object] | None = None,
) -> Tokenizer:
    """Train a byte-level BPE (GPT-2 style pre-tokenization without prefix space, all 256 bytes in
        the base alphabet, EOS ``<|endoftext|>``) on up to ``max_chars`` characters of the source's
        documents, taken in a fixed pseudo-random order. ``progress`` is called with each document's
    character count as it is read (a progress bar)."""
    base = len(pre_tokenizers.ByteLevel.alphabet()) + 1
    if vocab_size < base:
        raise DataError(
            f"vocab_size={vocab_size} is too small for a byte-level BPE: it needs at least {base} "
            f"(256 bytes + EOS); set --model.vocab_size {base} or more"
        )
    tk = tokenizers.Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BPE_EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    stats = _stats if _stats is not None else {}
    tk.train_from_iterator(_training_texts(source, max_chars, stats, progress), trainer=trainer)
    return Tokenizer(tk, BPE_EOS, origin=f"byte-level BPE trained on {source.name}")


def bpe_cache_path(cache_dir: str | os.PathLike, source: DocumentSource, vocab_size: int, max_chars: int) -> Path:
    """Where the BPE for (source, vocab size, training budget, tokenizers version) is cached."""
    key = f"{_BPE_RECIPE}|{source.fingerprint()}|{vocab_size}|{max_chars}|tokenizers-{tokenizers.__version__}"
    digest = short_sha256(key, 12)
    return Path(cache_dir) / "tokenizers" / f"bpe-{vocab_size}-{digest}.json"


class TokenizerSettings(Protocol):
    """The fields of a data config that name a tokenizer (hlat.data.DataConfig has them)."""

    tokenizer: str
    tokenizer_train_chars: int

    def resolved_cache_dir(self) -> Path: ...


def build_tokenizer(
    cfg: TokenizerSettings, vocab_size: int, source: DocumentSource | None
) -> tuple[Tokenizer | SentencePieceTokenizer, str]:
    """The tokenizer a DataConfig names, and one line for the start-up log.

    With ``cfg.tokenizer`` empty, a byte-level BPE of ``vocab_size`` tokens is trained on the
    source and cached under ``<cache_dir>/tokenizers/``; a later run on the same data loads it.
    Several processes may race to train it: each writes atomically, and the result is the same.
    """
    if cfg.tokenizer:
        tok = load_tokenizer(cfg.tokenizer)
        if tok.vocab_size > vocab_size:
            raise DataError(
                f"tokenizer {cfg.tokenizer} has {tok.vocab_size} tokens but the model's vocab_size "
                f"is {vocab_size}; set --model.vocab_size {tok.vocab_size} (or larger)"
            )
        bos = "" if tok.bos_id is None else f", BOS {tok.bos_token!r} = {tok.bos_id}"
        line = f"tokenizer: {cfg.tokenizer}, {tok.vocab_size} tokens, EOS {tok.eos_token!r} = {tok.eos_id}{bos}"
        return tok, line

    if source is None:
        raise DataError("no data.tokenizer and no source to train a BPE on; give data.tokenizer")
    path = bpe_cache_path(cfg.resolved_cache_dir(), source, vocab_size, cfg.tokenizer_train_chars)
    replaced = ""
    if path.is_file():
        try:
            tok = Tokenizer.from_file(path)
        except ValueError:
            tok = None  # corrupt or foreign file: train again and overwrite it
        if tok is not None and tok.vocab_size > vocab_size:
            # not one this recipe trained (the key holds vocab_size): its ids would run past the embedding
            replaced = f" (replacing a cached file of {tok.vocab_size} tokens, more than vocab_size {vocab_size})"
        elif tok is not None:
            return tok, (
                f"tokenizer: byte-level BPE, {tok.vocab_size} tokens, trained on {source.name}, "
                f"loaded from cache {path}"
            )
    t0 = time.perf_counter()
    stats: dict = {}
    tok = train_bpe(source, vocab_size, cfg.tokenizer_train_chars, _stats=stats)
    seconds = time.perf_counter() - t0
    tok.save(path)
    tok.origin = str(path)
    line = (
        f"tokenizer: byte-level BPE, {tok.vocab_size} tokens, trained on "
        f"{stats.get('bytes', 0) / 1e6:.1f} MB of {source.name} in {seconds:.1f} s, "
        f"cached at {path}{replaced}"
    )
    return tok, line
