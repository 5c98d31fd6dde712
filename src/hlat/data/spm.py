"""SentencePiece ``.model`` files (LLaMA-2's tokenizer ships as one), with the members the rest of
hlat uses from ``Tokenizer``: ``vocab_size``, ``eos_id``, ``eos_token``, ``bos_id``, ``bos_token``,
``encode_batch``, ``decode``, ``fingerprint``, ``save``."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from hlat.atomic_files import atomic_path
from hlat.digests import short_sha256
from hlat.errors import DataError


class SentencePieceTokenizer:
    """Encoding adds no BOS/EOS, and control-symbol text inside a document ("</s>") stays text,
    so only the packer emits EOS. Batches are encoded by SentencePiece's own C++ threads."""

    FILE_NAME = "tokenizer.model"  # its name in a run, shard or model directory

    def __init__(self, path: str | os.PathLike):
        import sentencepiece as spm

        self.path = Path(path).expanduser()
        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(self.path))
        except (OSError, RuntimeError) as e:
            raise DataError(f"cannot load {self.path} as a SentencePiece model: {e}") from e
        self.eos_id: int = self.sp.eos_id()
        if self.eos_id < 0:
            raise DataError(
                f"SentencePiece model {self.path} has no EOS piece (eos_id=-1); "
                "train it with eos_id set (the default is 2)"
            )
        self.eos_token: str = self.sp.id_to_piece(self.eos_id)
        bos = self.sp.bos_id()  # -1 when the model has none
        self.bos_id: int | None = bos if bos >= 0 else None
        self.bos_token: str | None = self.sp.id_to_piece(bos) if bos >= 0 else None
        self.vocab_size: int = self.sp.get_piece_size()
        self.origin = str(self.path)
        self._threads = os.cpu_count() or 1
        self._fingerprint = short_sha256(self.sp.serialized_model_proto())

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        return self.sp.encode(texts, out_type=int, num_threads=self._threads)

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.sp.decode(list(ids))

    def token_id(self, token: str) -> int | None:
        """The id of a piece, or None (SentencePiece maps unknown pieces to <unk>)."""
        i = self.sp.piece_to_id(token)
        return i if self.sp.id_to_piece(i) == token else None

    def fingerprint(self) -> str:
        return self._fingerprint

    def save(self, path: str | os.PathLike) -> None:
        with atomic_path(path) as temporary:
            shutil.copyfile(self.path, temporary)

    def __repr__(self) -> str:
        return (
            f"SentencePieceTokenizer(vocab_size={self.vocab_size}, eos={self.eos_token!r}={self.eos_id}, "
            f"bos={self.bos_token!r}={self.bos_id}, origin={self.origin!r})"
        )
