"""A tiny byte-level BPE and a tiny random LLaMA: every evaluation test runs on them in seconds."""

from __future__ import annotations

from pathlib import Path

import pytest
import tokenizers
import torch
from tokenizers import decoders, models, pre_tokenizers, trainers

from hlat.config.model import ModelConfig
from hlat.data.tokenizer import Tokenizer
from hlat.eval import LanguageModel
from hlat.model import Llama
from task_files import TEXT, write_tiny_tasks


@pytest.fixture(autouse=True)
def _one_thread():
    """Tiny models run fastest single-threaded, and the machine's cores are shared."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tokenizer_file(tmp_path_factory) -> Path:
    tk = tokenizers.Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(TEXT, trainer=trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tk.save(str(path))
    return path


@pytest.fixture(scope="session")
def tokenizer(tokenizer_file) -> Tokenizer:
    return Tokenizer.from_file(tokenizer_file)


@pytest.fixture(scope="session")
def model_config(tokenizer) -> ModelConfig:
    return ModelConfig(
        vocab_size=tokenizer.vocab_size,
        d_model=32,
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        ffn_dim=64,
        max_seq_len=96,
        norm_eps=1e-6,
    )


@pytest.fixture(scope="session")
def model(model_config) -> Llama:
    torch.manual_seed(0)
    m = Llama(model_config).eval()
    with torch.no_grad():  # larger weights than init, so choices get clearly different scores
        for p in m.parameters():
            p.mul_(4.0)
    return m


@pytest.fixture
def lm(model, tokenizer) -> LanguageModel:
    return LanguageModel(model, tokenizer, batch_size=3, progress=False)


@pytest.fixture
def task_dir(tmp_path) -> Path:
    """Local files of two tiny tasks: arc_easy (multiple choice) and perplexity (rolling)."""
    return write_tiny_tasks(tmp_path / "tasks")
