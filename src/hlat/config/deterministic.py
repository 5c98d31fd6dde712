"""What train.deterministic supports: the rules, asked before any process group exists
(docs/reproducibility.md says why each one holds)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from hlat.config.layout import Degrees

if TYPE_CHECKING:
    from hlat.config.run import RunConfig


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def deterministic_problems(cfg: RunConfig) -> list[tuple[str, str]]:
    """The rules that do not depend on the world size."""
    problems = []
    if cfg.recovery.wrong_computation == "exclude" and not cfg.elastic.enabled:
        why = "exclude takes the named node's elastic group out of the run: it needs elastic.enabled (else stop)"
        problems.append(("recovery.wrong_computation", why))
    if not cfg.train.deterministic:
        needs = "replay compares gradients bit for bit, which needs --train.deterministic true"
        return problems + ([("train.replay_every", needs)] if cfg.train.replay_every > 0 else [])
    batch, micro = cfg.train.global_batch, cfg.train.micro_batch
    if micro >= 1 and not batch % micro and not _power_of_two(batch // micro):
        problems.append(
            (
                "train.global_batch",
                f"train.deterministic sums the step's micro-batches as a binary tree: "
                f"{batch} / train.micro_batch={micro} = {batch // micro} micro-batches is not a power of two",
            )
        )
    if cfg.precision.fp32_grad_accum:
        problems.append(
            (
                "precision.fp32_grad_accum",
                "train.deterministic sums each micro-batch's gradients in its own order; set it to false "
                "(the bf16 modes then sum bf16 gradients, in that order)",
            )
        )
    if cfg.elastic.enabled:
        if micro >= 1 and not batch % micro and smallest_block(batch // micro, cfg.elastic.max_groups) < 1:
            problems.append(
                (
                    "elastic.max_groups",
                    f"train.deterministic deals each group present whole micro-batches: at most "
                    f"{batch // micro} groups for {batch // micro} micro-batches a step",
                )
            )
    return problems


def smallest_block(micro_batches: int, max_groups: int) -> int:
    """The fewest micro-batches of a step an elastic group is dealt under train.deterministic, with
    up to `max_groups` groups present (a subtree: hlat.parallel.ordered_sum.tree_blocks)."""
    return micro_batches >> math.ceil(math.log2(max_groups)) if max_groups > 1 else micro_batches


def deterministic_layout_problems(cfg: RunConfig, degrees: Degrees) -> list[tuple[str, str]]:
    """The rules of a layout: the data-parallel degree a power of two (a subtree of each step's
    tree); tensor and context parallelism at any fixed degree (context parallelism a power of two,
    under DDP, ZeRO or plain FSDP2, without replay); pipelines at any fixed degree, one stage per
    rank, without tied embeddings, replay or elastic groups (docs/reproducibility.md says why)."""
    if not cfg.train.deterministic:
        return []
    problems = []
    if degrees.pp > 1:
        for field, value, why in (
            ("parallel.pp_stages_per_rank", cfg.parallel.pp_stages_per_rank > 1, "one stage per rank (1f1b or gpipe)"),
            ("model.tie_embeddings", cfg.model.tie_embeddings, "untied embeddings (FSDP2 would sum over dp first)"),
            ("train.replay_every", cfg.train.replay_every > 0, "no replay (each stage checks its own gradients)"),
            ("elastic.enabled", cfg.elastic.enabled, "no elastic groups (not tested yet)"),
        ):
            if value:
                problems.append((field, f"train.deterministic runs a pipeline with {why}; or set --parallel.pp 1"))
    if degrees.cp > 1:
        if not _power_of_two(degrees.cp):
            problems.append(
                ("parallel.cp", f"train.deterministic sums cp's parts as a binary tree: got cp={degrees.cp}")
            )
        if degrees.dp_replicate > 1:
            problems.append(("parallel.dp_shard", "train.deterministic runs context parallelism without HSDP for now"))
        if cfg.train.replay_every:
            problems.append(
                ("train.replay_every", "replay compares whole micro-batch gradients; a cp rank holds a part: cp 1")
            )
    if not _power_of_two(degrees.dp):
        problems.append(("train.deterministic", f"needs a power-of-two data-parallel degree, got dp={degrees.dp}"))
    micro_batches = cfg.train.global_batch // max(cfg.train.micro_batch, 1)
    if cfg.elastic.enabled and 1 <= smallest_block(micro_batches, cfg.elastic.max_groups) < degrees.dp:
        fewest = smallest_block(micro_batches, cfg.elastic.max_groups)
        problems.append(
            (
                "train.global_batch",
                f"train.deterministic deals a group as few as {fewest} micro-batches with elastic.max_groups="
                f"{cfg.elastic.max_groups} present, fewer than its {degrees.dp} data-parallel ranks: use a global "
                f"batch of at least {degrees.dp * micro_batches // fewest * cfg.train.micro_batch}",
            )
        )
    if degrees.dp_replicate > 2:
        problems.append(
            (
                "parallel.dp_shard",
                f"train.deterministic sums HSDP's replicas with torch's all-reduce, in a fixed order for 2 "
                f"replicas only; got {degrees.dp_replicate} (dp {degrees.dp} / dp_shard {degrees.dp_shard}): "
                f"use --parallel.dp_shard {degrees.dp // 2} or 0",
            )
        )
    return problems
