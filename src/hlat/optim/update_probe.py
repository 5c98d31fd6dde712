"""The start-up decision on compiling the bf16 modes' optimizer update (precision.compile_optimizer).

The update is compiled on the first optimizer step. A device whose compiler refuses it would then
fail a run that passed start-up; so the update is compiled here, on a small tensor of the run's
device, through the very function the optimizer calls (hlat.optim.bf16_adamw.compiled_update is
cached per backend and form): with dynamic shapes that is the kernel every parameter then uses;
in the static form (DeviceRecord.compile_dynamic false) each parameter size compiles on its first
step, but a form the compiler refuses is found here. A refusal on any rank runs the update eager
on all of them, with one warning.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hlat.config.optim import OptimConfig
from hlat.config.precision import PrecisionConfig
from hlat.device.record import device_record
from hlat.optim.bf16_adamw import compiled_update
from hlat.optim.stochastic_round import int32_seed
from hlat.parallel.compile import all_ranks_ok, compile_disabled_by_torch, error_line
from hlat.precision import bf16_rounding

PROBE_SHAPE = (96, 160)  # a weight matrix (most parameters are), not square: sizes alike are guarded alike


@dataclass(frozen=True)
class UpdateDecision:
    compiled: bool  # what BF16AdamW is built with (precision.compile_optimizer, or false after a refusal)
    line: str | None  # the start-up line; None where nothing was decided (no bf16 state)


def decide_update_compile(
    *,
    precision: PrecisionConfig,
    optim: OptimConfig,
    device: torch.device,
    out: Callable[[str], None] = lambda _: None,
) -> UpdateDecision:
    """Collective when a process group exists (every rank calls it). `optim`: the run's AdamW
    constants, which a compiler may bake into the kernel (so the probe builds the run's kernel)."""
    if bf16_rounding(precision.mode) is None:
        return UpdateDecision(precision.compile_optimizer, None)
    record = device_record(device.type)
    if not precision.compile_optimizer:
        return UpdateDecision(False, "optimizer: bf16 update eager (precision.compile_optimizer false)")
    if record.compile_backend is None:
        return UpdateDecision(False, f"optimizer: bf16 update eager (no compile backend for {device.type})")
    if compile_disabled_by_torch():
        return UpdateDecision(
            False, "optimizer: bf16 update eager (torch.compile is disabled: TORCH_COMPILE_DISABLE=1)"
        )
    form = "one kernel for all sizes" if record.compile_dynamic else "one kernel per parameter size"
    out(f"optimizer: compiling the bf16 update ({record.compile_backend}, {form})")
    start, error = time.perf_counter(), None
    try:
        _probe(device, record.compile_backend, record.compile_dynamic, optim)
    except Exception as err:  # any failure of the compiler stack
        error = err
    if not all_ranks_ok(error is None, device):
        reason = error_line(error) if error is not None else "failed on another rank"
        return UpdateDecision(
            False,
            f"warning: optimizer: torch.compile of the bf16 update failed ({reason}); running it eager "
            "(several times slower; --precision.compile_optimizer false says so without the probe)",
        )
    seconds = time.perf_counter() - start
    return UpdateDecision(
        True, f"optimizer: bf16 update compiled ({record.compile_backend}, {form}, probe {seconds:.1f} s)"
    )


@torch.no_grad()  # as BF16AdamW.step runs it: grad mode is part of what the compiled kernel is kept for
def _probe(device: torch.device, backend: str, dynamic: bool, optim: OptimConfig) -> None:
    """One update of a PROBE_SHAPE matrix, as BF16AdamW.step calls it for a decayed parameter
    (the run's weight decay; the undecayed group's kernel compiles at the first step)."""
    g, m, v = (torch.zeros(PROBE_SHAPE, dtype=torch.bfloat16, device=device).view(-1) for _ in range(3))
    p = torch.nn.Parameter(torch.zeros(PROBE_SHAPE, dtype=torch.bfloat16, device=device)).view(
        -1
    )  # as the step passes it
    skip, bias1, bias2_sqrt = (torch.ones((), device=device) for _ in range(3))  # distinct: aliasing is guarded
    scalars: dict[str, float | int | torch.Tensor] = {"lr": optim.lr, "offset": 0, "seed": int32_seed(2**32 - 1)}
    if not dynamic:
        scalars = {
            "lr": torch.tensor(optim.lr).to(device),
            "offset": torch.tensor(0, dtype=torch.int32).to(device),
            "seed": torch.tensor(int32_seed(2**32 - 1), dtype=torch.int32).to(device),
        }
    update = compiled_update(backend, dynamic)
    constants = {"beta1": optim.beta1, "beta2": optim.beta2, "eps": optim.eps, "weight_decay": optim.weight_decay}
    update(p, g, m, v, skip, bias1, bias2_sqrt, stochastic=True, **constants, **scalars)  # skipped: no change
