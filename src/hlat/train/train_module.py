"""The model being trained as one object: the parallelized model, its optimizers and the optimizer
step, with what a step leaves behind (this rank's part of each step's loss, the skipped-step
counter) kept on device inside it until a logging step reads them in one host sync.

The trainer asks it to step, to read its losses, and for its state; it never touches the loss
parts or the counter itself. A train module that reduces over more than the model's own ranks
(an elastic group: hlat.train.elastic.module), or in a fixed order (train.deterministic:
hlat.train.deterministic), overrides the step's phases, not the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

from hlat.config.optim import OptimConfig
from hlat.config.precision import PrecisionConfig
from hlat.data.batch import Batch
from hlat.optim import adamw_class, build_adamw, decay_groups
from hlat.optim.muon import muon_class, muon_groups
from hlat.parallel.parallelize import ParallelModel
from hlat.precision import bf16_rounding
from hlat.train.optimizers import Optimizers, zero1_optimizer
from hlat.train.step import accumulate, clip, target_count, update


@dataclass
class StepOutput:
    lr: float
    grad_norm: torch.Tensor  # pre-clip global norm, on device (read on logging steps only)
    committed: bool = True  # False: the step left weights, optimizer and losses as they were; retry it


class TrainModule:
    """`max_grad_norm` > 0 also skips steps whose pre-clip norm exceeds it (recovery.max_grad_norm);
    non-finite steps are always skipped. `hardware_rounding`: the device rounds bf16 casts
    stochastically (hlat.device.rounding), so bf16-sr's optimizer casts instead of adding noise."""

    def __init__(
        self,
        model: ParallelModel,
        *,
        optim: OptimConfig,
        precision: PrecisionConfig,
        dp_sharding: str,
        seed: int,
        max_grad_norm: float,
        hardware_rounding: bool = False,
    ):
        self.model, self.grad_clip, self.max_grad_norm = model, optim.grad_clip, max_grad_norm
        rounding, compile = bf16_rounding(precision.mode), precision.compile_optimizer
        if hardware_rounding and rounding == "stochastic":
            rounding = "hardware"
        zero1 = dp_sharding == "zero1" and model.layout.dp > 1  # ZeRO-1 is an optimizer: one shard per dp rank
        device = next(iter(model.parameters())).device

        def build(part: nn.Module) -> torch.optim.Optimizer:
            muon = optim.name == "muon"
            cls, kwargs = (muon_class if muon else adamw_class)(optim, rounding, seed, compile, device.type, part)
            groups = (muon_groups if muon else decay_groups)(part, optim)
            if zero1:
                return zero1_optimizer(groups, cls, model.layout.group("dp"), **kwargs)
            if muon:  # DDP's ranks hold every matrix alike: they share out Muon's orthogonalisations
                ddp = model.layout.group("dp") if model.layout.dp > 1 and dp_sharding == "ddp" else None
                return cls(groups, **kwargs, spread_group=ddp)
            return build_adamw(part, optim, rounding, seed, compile)

        self.optimizers = Optimizers(model.parts, build)
        self._skipped = torch.zeros((), dtype=torch.int64, device=device)
        self._rank_losses: list[torch.Tensor] = []  # this rank's part of each step's loss since the last read
        self.number = 0  # the run's step being taken (step())

    def train(self) -> None:
        self.model.train()

    def step(self, micro_batches: Sequence[Batch], lr: float, number: int) -> StepOutput:
        """The run's optimizer step `number` (1-based, as logged: a resumed or healed run goes on
        counting) at learning rate `lr` (hlat.train.step); no host sync."""
        self.number = number
        self.optimizers.set_lr(lr)
        rank_loss = self._reduce(self._accumulate(micro_batches, self._target_count(micro_batches)))
        grad_norm, bad = self._clip()
        committed = self._commit()
        if committed:
            update(self.optimizers, bad, self._skipped)
            self._rank_losses.append(rank_loss)
        self.optimizers.zero_grad()
        return StepOutput(lr, grad_norm, committed)

    # --- the phases a subclass that reduces otherwise overrides (elastic groups, the deterministic mode)
    def _target_count(self, micro_batches: Sequence[Batch]) -> torch.Tensor:
        return target_count(self.model, micro_batches)

    def _accumulate(self, micro_batches: Sequence[Batch], n_targets: torch.Tensor) -> torch.Tensor:
        """Forward and backward: this rank's part of the global mean loss, the gradients in .grad."""
        return accumulate(self.model, micro_batches, n_targets)

    def _clip(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(pre-clip global grad norm, whether to skip the step), the gradients clipped."""
        return clip(self.model, self.grad_clip, self.max_grad_norm)

    def _step_losses(self, rank_losses: torch.Tensor) -> torch.Tensor:
        """Each step's global mean loss from this rank's parts of them (one collective)."""
        return self.model.reduce_loss(rank_losses)

    def _reduce(self, rank_loss: torch.Tensor) -> torch.Tensor:
        """After backward: the gradients and `rank_loss` as the optimizer step sees them."""
        return rank_loss

    def _commit(self) -> bool:
        """Whether the step applies (every rank alike)."""
        return True

    def read_losses(self) -> tuple[list[float], int]:
        """The global mean loss of each step since the last read, and the skipped-step counter:
        one collective and one host sync, for logging steps."""
        *losses, skipped = torch.cat(
            [self._step_losses(torch.stack(self._rank_losses)), self._skipped.reshape(1).to(torch.float32)]
        ).tolist()
        self._rank_losses.clear()
        return losses, int(skipped)

    @property
    def skipped_steps(self) -> int:
        """Steps the optimizers skipped so far (reads the device counter: a host sync)."""
        return int(self._skipped.item())

    @skipped_steps.setter
    def skipped_steps(self, count: int) -> None:
        self._skipped.fill_(count)

    def validation_loss(self, batches: Sequence[Batch]) -> float:
        """Collective; one host sync."""
        return self.model.validation_loss(batches)

    def param_norm(self) -> torch.Tensor:
        return self.model.param_norm()

    def model_state_dict(self) -> dict[str, Any]:
        return {k: v for part in self.model.parts for k, v in get_model_state_dict(part).items()}

    def state_dict(self) -> dict[str, Any]:
        """Sharded, name-keyed state for torch.distributed.checkpoint (the checkpoint's "model" and
        "optim" entries)."""
        return {"model": self.model_state_dict(), "optim": self.optimizers.sharded_state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for part in self.model.parts:
            set_model_state_dict(part, state["model"], options=StateDictOptions(strict=False))
        self.optimizers.load_sharded_state_dict(state["optim"])
