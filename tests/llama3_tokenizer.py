"""A tiny tokenizer.json shaped like Llama 3's, built locally (nothing is downloaded): a byte-level
BPE with Llama 3's pre-tokenizer settings, the special tokens <|begin_of_text|>, <|end_of_text|>,
a few <|reserved_special_token_N|> and <|eot_id|> (ids after the base vocabulary, as in Llama 3),
and the TemplateProcessing post-processor that puts BOS in front of every encoding."""

from __future__ import annotations

from pathlib import Path

import tokenizers
from tokenizers import (
    AddedToken,
    decoders,
    models,
    pre_tokenizers,
    processors,
    trainers,
)

BOS, EOS, EOT = "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"
SPECIALS = [BOS, EOS, *(f"<|reserved_special_token_{i}|>" for i in range(4)), EOT]
LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Llama 3 begins every document with a BOS token and ends it with an EOS token.",
    "Packing concatenates documents into one stream cut into rows.",
]


def write_llama3_tokenizer(path: Path, vocab_size: int = 320) -> Path:
    """Train the BPE on LINES (vocab_size includes the 256 bytes; the specials come after)."""
    tk = tokenizers.Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tk.train_from_iterator(LINES * 4, trainer=trainer)
    tk.add_special_tokens([AddedToken(t, special=True) for t in SPECIALS])
    tk.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B:1", special_tokens=[(BOS, tk.token_to_id(BOS))]
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tk.save(str(path))
    return path
