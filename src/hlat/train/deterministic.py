"""train.deterministic's step: every reduction of a step in one fixed order, whatever the
data-parallel layout (docs/reproducibility.md; the sums: hlat.parallel.ordered_sum).

Rank r of d computes, at accumulation slot t, the global batch's micro-batch t*d + r
(hlat.train.global_batch). After each micro-batch's backward its gradients are summed over the
data-parallel ranks in rank order (FSDP2 in its reduce-scatter, replicated weights here), and the
slots' sums pair up as a binary tree; the loss, the target count and the gradient norm follow the
same rule. The optimizer update is elementwise, so it adds no order of its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Replicate

from hlat.data.batch import IGNORE_INDEX, Batch
from hlat.dtensor import local_tensor
from hlat.faults import flips
from hlat.parallel.ordered_sum import CanonicalNorm, PairwiseSum, ordered_all_reduce_, tree_sum
from hlat.parallel.parallelize import ParallelModel
from hlat.train.replay import Replay, WrongComputation, flip_one_bit
from hlat.train.step import clip
from hlat.train.train_module import TrainModule


def fix_numerics(device: torch.device) -> str:
    """Make each kernel's result depend on its inputs alone; the start-up line that says how. The
    CPU's GEMMs split their reductions by thread, so every process runs one intra-op thread;
    accelerators run torch's deterministic algorithms (a kernel without one fails by name)."""
    if device.type == "cpu":
        torch.set_num_threads(1)
        return "deterministic: on (one fixed reduction order; one intra-op thread per process)"
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's deterministic workspaces
    torch.use_deterministic_algorithms(True)
    return "deterministic: on (one fixed reduction order; torch.use_deterministic_algorithms)"


def summed_over_tp(grad: torch.Tensor) -> torch.Tensor:
    """A micro-batch's gradient that tensor parallelism left partial (a weight every tp rank holds,
    e.g. a norm's under sequence parallelism) summed over its fixed tp group, before the tree over
    micro-batches, as FSDP2 sums it before its reduce-scatter: the same order with or without it."""
    if not isinstance(grad, DTensor) or not any(p.is_partial() for p in grad.placements):
        return grad
    return grad.redistribute(grad.device_mesh, [Replicate() if p.is_partial() else p for p in grad.placements])


class DeterministicTrainModule(TrainModule):
    """The train module of train.deterministic: its accumulation, clipping and target count are the
    ordered ones; everything else is TrainModule's. `replay` (train.replay_every): its checks,
    before the update of every step it is due."""

    def __init__(self, model: ParallelModel, *, replay: Replay | None = None, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        self.replay = replay
        layout = model.layout
        self.sharded = isinstance(model.parts[0], FSDPModule)  # else each dp rank holds whole tensors
        self.dp_group = layout.group("dp") if layout.dp > 1 else None
        # a micro-batch's parts on its cp ranks, summed in cp rank order before the dp tree (FSDP2
        # sums them so in its reduce-scatter over dp x cp, dp-major: the same tree)
        self.cp_group = layout.group("cp") if layout.cp > 1 else None
        # FSDP2's shard group: within a replica under HSDP, else dp x cp (CanonicalNorm skips one of 1 rank)
        shard_group = layout.group("dp_shard" if layout.dp_replicate > 1 else "dp_cp") if self.sharded else None
        self.norm = CanonicalNorm(
            shard_group, layout.group("tp") if layout.tp > 1 else None, layout.group("pp") if layout.pp > 1 else None
        )
        self.pp_group = layout.group("pp") if layout.pp > 1 else None
        self.dp = layout.dp

    def _target_count(self, micro_batches: Sequence[Batch]) -> torch.Tensor:
        return self._exact_count(micro_batches).float().clamp_min(1.0)

    def _exact_count(self, micro_batches: Sequence[Batch]) -> torch.Tensor:
        """The targets of the data-parallel ranks' micro-batches, in int64 (a float sum rounds past 2**24)."""
        count = sum((b.labels != IGNORE_INDEX).sum() for b in micro_batches).to(torch.int64)
        if self.dp_group is not None:
            dist.all_reduce(count, group=self.dp_group)
        return count

    def _accumulate(self, micro_batches: Sequence[Batch], n_targets: torch.Tensor) -> torch.Tensor:
        """The global batch's gradient in .grad as a tree over its micro-batches; the step's loss,
        the same bits on every rank."""
        replaying = self.replay is not None and self.replay.due(self.number)
        params, sums, losses = self.model.parameters(), PairwiseSum(), []
        digest = b""
        for slot, loss in enumerate(self._backward_each(micro_batches, n_targets, replaying)):
            grads = self._own_gradients()
            if slot == 0 and replaying:
                digest = self._digest(grads)
            if not self.sharded:
                local = [local_tensor(g) for g in grads]
                for group in (self.cp_group, self.dp_group):
                    ordered_all_reduce_(local, group)
            sums.add(grads)
            losses.append(loss)
        for param, grad in zip(params, sums.total()):
            param.grad = grad
        if replaying:
            found = self.replay.check(self.number, micro_batches[0], digest, lambda b: self._recompute(b, n_targets))
            if found:
                self._computing_wrong(found)
        return self._ordered_loss(torch.stack(losses))

    def _computing_wrong(self, line: str) -> None:
        """Replay named ranks computing wrong (`line`): the run stops before the update."""
        raise WrongComputation(f"{line}; stop here and take the named node out of the job before resuming")

    def _backward_each(
        self, micro_batches: Sequence[Batch], n_targets: torch.Tensor, replaying: bool
    ) -> Iterator[torch.Tensor]:
        """The model's backward_each, the first micro-batch's gradients fed to the tap on a replay
        step (and computed wrong where HLAT_FAULT="flip:STEP:RANK" asks: hlat.faults)."""
        fault = flip_one_bit(self.model.parts[0]) if flips(self.number, self.model.layout.rank) else None
        if replaying:
            self.model.gradient_tap.open()
        for loss in self.model.backward_each(micro_batches, n_targets):
            if fault is not None:  # the first micro-batch's forward and backward are done
                fault.remove()
                fault = None
            yield loss

    def _own_gradients(self) -> list[torch.Tensor]:
        return [summed_over_tp(p.grad) if p.grad is not None else torch.zeros_like(p) for p in self.model.parameters()]

    def _digest(self, grads: list[torch.Tensor]) -> bytes:
        """The tap's digest of this rank's gradient of the micro-batch just computed: FSDP2 fed it
        what it reduced; replicated gradients are fed here, before the cross-rank sum."""
        tap = self.model.gradient_tap
        if not self.sharded:
            for grad in grads:
                tap.feed(local_tensor(grad))
        return tap.close()

    def _recompute(self, batch: Batch, n_targets: torch.Tensor) -> bytes:
        """The digest of this rank's gradient of `batch` at the current weights; the step's gradients
        are put back (collective under FSDP2: every rank recomputes at once)."""
        saved = [p.grad for p in self.model.parameters()]
        self.model.gradient_tap.open()
        for _ in self.model.backward_each([batch], n_targets):
            digest = self._digest(self._own_gradients())
        for param, grad in zip(self.model.parameters(), saved):
            param.grad = grad
        return digest

    def _ordered_loss(self, losses: torch.Tensor) -> torch.Tensor:
        """Each micro-batch's loss share (its cp parts summed in cp rank order), from every dp rank,
        summed as a tree in global index order; under a pipeline, the last stage's, sent to every
        stage (the others add zeros)."""
        ordered_all_reduce_([losses], self.cp_group)
        if self.pp_group is not None:
            dist.all_reduce(losses, group=self.pp_group)
        if self.dp_group is None:
            return tree_sum(list(losses))
        every = torch.empty(self.dp * losses.numel(), dtype=losses.dtype, device=losses.device)
        dist.all_gather_single(every, losses, group=self.dp_group)
        by_index = every.view(self.dp, -1).t().reshape(-1)  # rank r's slot t is micro-batch t*dp + r
        return tree_sum(list(by_index))

    def _clip(self) -> tuple[torch.Tensor, torch.Tensor]:
        params = self.model.counted_in_norms([p for p in self.model.parameters() if p.grad is not None])
        norm = self.norm([p.grad for p in params], self._skipped.device)
        return clip(self.model, self.grad_clip, self.max_grad_norm, norm)

    def _step_losses(self, rank_losses: torch.Tensor) -> torch.Tensor:
        """Every rank holds each step's loss already, summed in the canonical order."""
        return rank_losses
