"""The sample a run prints when it ends: a few greedy tokens continuing a short prompt, written by
the model just trained, so that what training did can be read as well as plotted.

The weights are gathered to rank 0 the way in-training evaluation gathers them (every layout:
DDP, ZeRO, FSDP2, TP, PP); generation is the evaluation harness's (hlat.eval.lm, KV cache).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from hlat.config.data import DataConfig, default_cache_dir
from hlat.config.data_paths import entry_kind, source_entries
from hlat.config.model import ModelConfig
from hlat.data.documents import BadDocument, TokenPieces
from hlat.data.loader import open_source
from hlat.data.shards import ShardDocuments
from hlat.data.tokenizer import Tokenizer
from hlat.eval.in_training import gather_full_weights, unsharded_model
from hlat.eval.lm import LanguageModel
from hlat.eval.requests import GenerateRequest
from hlat.parallel.mesh import Layout

AUTO = "auto"  # train.sample_prompt: the start of the training data's first document
PROMPT_CHARS = 40
SHARD_PROMPT_TOKENS = 64  # decoded from the first document of token shards: enough for PROMPT_CHARS


def sample_prompt(setting: str, data: DataConfig, tokenizer: Tokenizer) -> str | None:
    """The prompt train.sample_prompt asks for; None when there is none to draw from."""
    if setting != AUTO:
        return setting
    try:
        first = _first_document_start(data, tokenizer)
    except (ValueError, IndexError):  # no documents
        return None
    line = next((line for line in first.splitlines() if line.strip()), "")
    return line if len(line) <= PROMPT_CHARS else line[:PROMPT_CHARS].rsplit(" ", 1)[0]  # whole words


def _first_document_start(data: DataConfig, tokenizer: Tokenizer) -> str:
    """The start of data.source's first document: its text, or its first tokens decoded when the
    first entry is token shards (whose text is not kept)."""
    first = source_entries(data.source)[0]
    if entry_kind(first) != "shards":
        return open_source(data)[0]
    (tokens,) = ShardDocuments(Path(first), tokenizer, cache=default_cache_dir()).tokens([0])
    if isinstance(tokens, TokenPieces):  # a long document: its first piece is enough
        tokens = next(iter(tokens))
    if isinstance(tokens, BadDocument):
        return ""
    return tokenizer.decode(tokens[:SHARD_PROMPT_TOKENS].tolist(), skip_special_tokens=True)


def end_of_training_sample(
    parts: list[nn.Module],
    layout: Layout,
    model_cfg: ModelConfig,
    data: DataConfig,
    tokenizer: Tokenizer,
    device: torch.device,
    precision_mode: str,
    setting: str,
    max_tokens: int,
) -> str | None:
    """Rank 0: the line that shows the model's greedy continuation of the prompt that `setting`
    (train.sample_prompt) names; None elsewhere. Collective: every rank joins the gather."""
    start = time.perf_counter()
    weights = gather_full_weights(parts, layout)
    if weights is None:
        return None
    prompt = sample_prompt(setting, data, tokenizer)
    if not prompt:
        return f"sample: skipped, the first document of data.source={data.source!r} is empty or unreadable; set train.sample_prompt"
    lm = LanguageModel(
        unsharded_model(model_cfg, weights),
        tokenizer,
        device,
        batch_size=1,
        precision=precision_mode,
        progress=False,
        bos=data.bos,
    )
    (text,) = lm.generate([GenerateRequest(prompt, max_tokens=max_tokens)])
    return (
        f'sample (greedy, {time.perf_counter() - start:.2f} s; --train.sample_prompt "" turns it off):\n{prompt}{text}'
    )
