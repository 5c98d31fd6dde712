"""One completeness check for every weights-only start.

`--checkpoint.init_from` (an hlat checkpoint or run directory, an imported run, `hf:DIR`) and
`hlat import` load weights into a model built from a configuration. Loading is by name, so a
tensor the source lacks would silently keep its random initialisation and a stray one would be
ignored; instead the source's names and shapes must be exactly the model's, and anything else is
refused, naming the tensors:

    init_from hf:/x: missing tensors layers.3.attention.wq.weight; unexpected lm_head.bias
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TypeVar

import torch
from torch import nn
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from hlat.checkpoint.errors import CheckpointError
from hlat.checkpoint.manager import METADATA
from hlat.checkpoint.safe_metadata import read_metadata
from hlat.config.model import ModelConfig
from hlat.model import Llama, build_model, model_spec

T = TypeVar("T")
Shapes = Mapping[str, tuple[int, ...]]
MODEL_KEY = "model"  # the model's entry in an hlat checkpoint's state (see the trainer's save)
SHOWN = 8  # names listed per kind before "... (N in all)"


class IncompleteWeights(CheckpointError):
    """The source's tensors are not exactly the model's: the message names the differences."""


def model_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the full (unsharded, all stages) model, by name, without allocating it."""
    with torch.device("meta"):
        return {name: tuple(t.shape) for name, t in build_model(cfg).state_dict().items()}


def model_config_of(parts: Iterable[nn.Module]) -> ModelConfig:
    """The configuration the model parts were built from (any wrapper or pipeline stage)."""
    return next(m.cfg for part in parts for m in part.modules() if isinstance(m, Llama))


def checkpoint_shapes(checkpoint: Path) -> dict[str, tuple[int, ...]]:
    """The model tensors an hlat checkpoint holds, from its (already verified) DCP metadata."""
    prefix = MODEL_KEY + "."
    return {
        key.removeprefix(prefix): tuple(meta.size)
        for key, meta in read_metadata(Path(checkpoint) / METADATA).state_dict_metadata.items()
        if key.startswith(prefix) and isinstance(meta, TensorStorageMetadata)
    }


def rename_from_hf(state: Mapping[str, T], cfg: ModelConfig) -> tuple[dict[str, T], list[str]]:
    """(the tensors the model of `cfg` has, under hlat names; the Hugging Face names it has no place for)."""
    to_hlat = model_spec(cfg).hf.to_hlat
    ours: dict[str, T] = {}
    unknown = []
    for name, value in state.items():
        try:
            ours.update(to_hlat({name: value}))
        except KeyError:
            unknown.append(name)
    return ours, unknown


def drop_tied_copy(weights: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """A tied model's weights without a saved copy of the output head equal to the embedding (some
    Hugging Face files keep lm_head.weight beside embed_tokens.weight); a differing one stays, for
    check_complete to report as unexpected."""
    head, embedding = weights.get("output.weight"), weights.get("tok_embeddings.weight")
    if cfg.tie_embeddings and head is not None and embedding is not None and torch.equal(head, embedding):
        return {k: v for k, v in weights.items() if k != "output.weight"}
    return weights


def check_complete(source: str, expected: Shapes, found: Shapes, unknown: Iterable[str] = ()) -> None:
    """Raise IncompleteWeights unless `found` has exactly the names and shapes of `expected`;
    `unknown` are further unexpected names (a Hugging Face tensor hlat has no name for)."""
    missing = _ordered(expected.keys() - found.keys())
    unexpected = _ordered([*(found.keys() - expected.keys()), *unknown])
    shapes = [
        f"{name} {tuple(found[name])} (the model's is {tuple(expected[name])})"
        for name in _ordered(expected.keys() & found.keys())
        if tuple(found[name]) != tuple(expected[name])
    ]
    problems = [
        f"{kind} {_listed(names)}"
        for kind, names in (("missing tensors", missing), ("unexpected", unexpected), ("wrong shapes", shapes))
        if names
    ]
    if problems:
        raise IncompleteWeights(
            f"{source}: {'; '.join(problems)}; the weights do not match the model "
            "configuration (check [model] against the source's architecture)"
        )


def _ordered(names: Iterable[str]) -> list[str]:
    """Layer numbers in numeric order (layers.2 before layers.10)."""
    return sorted(names, key=lambda n: [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", n)])


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown if len(names) <= SHOWN else f"{shown}, ... ({len(names)} in all)"
