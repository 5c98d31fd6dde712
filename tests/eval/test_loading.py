"""Loading hlat run directories, checkpoints and Hugging Face directories gives the same model."""

from __future__ import annotations

import pytest
import torch

from deps import require
from export import save_hf, save_run
from hlat.checkpoint.loading import load_model, run_checkpoints
from hlat.data.spm import SentencePieceTokenizer


def logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens)


def test_run_dir_and_checkpoint(model, tokenizer, tokenizer_file, tmp_path) -> None:
    run = save_run(tmp_path / "run", model, tokenizer_file, [10, 20])
    assert [p.name for p in run_checkpoints(run)] == ["step_00000010", "step_00000020"]
    latest = load_model(run)  # the newest checkpoint
    assert (latest.step, latest.tokens) == (20, 20 * 512) and latest.name == "run/step_00000020"
    first = load_model(run / "checkpoints" / "step_00000010")
    tokens = torch.randint(0, tokenizer.vocab_size, (2, 12))
    expected = torch.func.functional_call(model, {k: v * 1.1 for k, v in model.state_dict().items()}, (tokens,))
    assert torch.allclose(logits(first.model, tokens), expected, atol=1e-5)
    assert first.tokenizer.fingerprint() == tokenizer.fingerprint()
    assert first.prefix_token == tokenizer.eos_id


def test_hf_directory(model, tokenizer, tokenizer_file, tmp_path) -> None:
    require("transformers")
    loaded = load_model(save_hf(tmp_path / "hf", model, tokenizer_file))
    tokens = torch.randint(0, tokenizer.vocab_size, (2, 12))
    assert torch.allclose(logits(loaded.model, tokens), logits(model, tokens), atol=1e-5)
    assert loaded.prefix_token == tokenizer.eos_id  # no BOS in this tokenizer


def test_clear_errors(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="neither an hlat checkpoint"):
        load_model(tmp_path)
    (tmp_path / "config.toml").write_text("[model]\nd_model = 30\nn_heads = 4\n")
    (tmp_path / "checkpoints").mkdir()
    with pytest.raises(FileNotFoundError, match="no checkpoints"):
        load_model(tmp_path)


def test_run_dir_with_a_sentencepiece_tokenizer(model, tokenizer_file, tmp_path) -> None:
    """A run trained with a SentencePiece model keeps tokenizer.model in its directory."""
    spm = require("sentencepiece")
    run = save_run(tmp_path / "run", model, tokenizer_file, [10])
    (run / "tokenizer.json").unlink()
    texts = ["The quick brown fox jumps over the lazy dog.", "def add(a, b):\n    return a + b"] * 50
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts),
        model_prefix=str(run / "tokenizer"),
        vocab_size=310,
        model_type="bpe",
        byte_fallback=True,
        minloglevel=2,
    )
    loaded = load_model(run)
    assert isinstance(loaded.tokenizer, SentencePieceTokenizer)
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("fox")) == "fox"
    assert loaded.tokenizer.token_id(loaded.tokenizer.eos_token) == loaded.tokenizer.eos_id == loaded.prefix_token
    assert loaded.tokenizer.token_id("no such piece") is None
