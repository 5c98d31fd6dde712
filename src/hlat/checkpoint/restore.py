"""Putting saved state back into a run of any layout: the data position, and initial weights.

Model and optimizer state reshard through torch.distributed.checkpoint (keyed by name). The data
position is per data-parallel rank: a run with the saved layout takes its own rank's file; any
other layout merges every saved rank's loader state (hlat.data.merge_states) and deals the
virtual shards to its own ranks, so no document is skipped or repeated within an epoch.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

from hlat.checkpoint.completeness import (
    check_complete,
    checkpoint_shapes,
    model_config_of,
    model_shapes,
)
from hlat.checkpoint.errors import CheckpointError
from hlat.checkpoint.manager import CheckpointManager, rank_file, read_checkpoint_manifest
from hlat.data import merge_states

HF_PREFIX = "hf:"
_RANK_FILE = re.compile(r"rank_\d+\.pt")


def holds_training_state(path: Path) -> bool:
    """Whether a checkpoint can be resumed (optimizer and data position), rather than only holding
    weights (an archive, or what hlat import writes)."""
    return any(Path(path).glob("rank_*.pt"))


def rank_state_for(
    manager: CheckpointManager, path: Path, rank: int, dp_rank: int, dp: int, same_layout: bool, merged: bool = False
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(loader state, RNG state or None) for this process from checkpoint `path`; `merged`: every
    saved rank's state merged, even where the saved run had `dp` ranks too (train.deterministic's
    loader holds several ranks' positions: hlat.train.global_batch).

    RNG states belong to a process of the saved layout; a resharded run keeps its seeded ones.
    Only rank files that the manifest lists (and `check` verified) are read.
    """
    saved_ranks = _listed_ranks(path)
    if same_layout:
        own = manager.load_rank_state(path, rank)
        if own is None:
            raise CheckpointError(f"{path} lacks {rank_file(rank)} although it was saved with this layout")
        return own["loader"], own["rng"]
    # Tensor- and pipeline-parallel ranks of one data-parallel rank hold the same loader state; an
    # elastic group's is already merged, from its data shares' states (hlat.train.elastic.shares).
    by_dp: dict[int | str, dict[str, Any]] = {}
    for saved_rank in saved_ranks:
        loader = manager.load_rank_state(path, saved_rank)["loader"]
        for state in loader.get("ranks", [loader]):
            by_dp.setdefault(state["dp_rank"], state)
    if not by_dp:
        raise CheckpointError(
            f"{path} has no rank_*.pt files: it holds weights only (an archive); "
            "start from it with --checkpoint.init_from instead"
        )
    if "all" in by_dp:  # merged without its shares' own states (an earlier hlat): reshard from it
        return by_dp["all"], None
    saved_dp = next(iter(by_dp.values()))["dp_size"]
    if saved_dp == dp and not merged:  # only tensor/pipeline degrees changed: every rank keeps its position
        return by_dp[dp_rank], None
    return merge_states(list(by_dp.values())), None


def _listed_ranks(path: Path) -> list[int]:
    """The ranks whose files checkpoint `path`'s manifest lists; a rank file it does not list
    (copied in, or left by another save) is refused rather than read unverified."""
    listed = {name for name in read_checkpoint_manifest(Path(path))["files"] if _RANK_FILE.fullmatch(name)}
    unlisted = sorted(file.name for file in Path(path).glob("rank_*.pt") if file.name not in listed)
    if unlisted:
        raise CheckpointError(
            f"{path} holds {', '.join(unlisted)}, which its manifest does not list: not written by this save "
            "(copied in or tampered with); remove it, or resume from another checkpoint"
        )
    return sorted(int(name.removeprefix("rank_").removesuffix(".pt")) for name in listed)


def init_weights(spec: str, parts: list[nn.Module]) -> str:
    """Fill the model parts (any layout) from `spec`: hf:DIR (a Hugging Face LLaMA directory) or
    an hlat checkpoint or run directory. Collective under torchrun. Returns what was loaded.
    The source must hold exactly the model's tensors (hlat.checkpoint.completeness), else nothing
    is loaded and IncompleteWeights names the missing, unexpected and mis-shaped ones."""
    cfg = model_config_of(parts)
    expected = model_shapes(cfg)
    if spec.startswith(HF_PREFIX):
        from hlat.checkpoint.hf_import import HF_CONFIG, hf_model_config, hlat_weights

        directory = Path(spec.removeprefix(HF_PREFIX)).expanduser()
        if not directory.is_dir():
            raise FileNotFoundError(f"checkpoint.init_from={spec}: no such directory")
        if (directory / HF_CONFIG).exists():  # the model is [model]'s; the file is checked all the same
            hf_model_config(directory)
        full = hlat_weights(directory, cfg, source=f"init_from {spec}")
        for part in parts:  # every rank holds the full tensors and keeps its own shard of them
            set_model_state_dict(part, full, options=StateDictOptions(full_state_dict=True, strict=False))
        return f"Hugging Face weights from {directory}"
    path = Path(spec).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint.init_from={spec}: no such checkpoint or run directory")
    if (path / "checkpoints").is_dir():  # a run directory: its newest valid checkpoint
        found = CheckpointManager(path / "checkpoints", keep_last=None).latest()
        if found is None:
            raise FileNotFoundError(f"checkpoint.init_from={spec}: no valid checkpoint under {path / 'checkpoints'}")
        path = found
    manager = CheckpointManager(path.parent, keep_last=None)
    manager.check(path)
    check_complete(f"init_from {path}", expected, checkpoint_shapes(path))
    # each part loads its own tensors (strict=False: a pipeline stage holds only its layers)
    state = {"model": {k: v for part in parts for k, v in get_model_state_dict(part).items()}}
    manager.load_sharded(path, state)
    for part in parts:
        set_model_state_dict(part, state["model"], options=StateDictOptions(strict=False))
    return f"weights of {path}"
