"""From a device setting to the torch.device a process uses.

"auto" is torch.accelerator's current accelerator when one is available (CUDA, ROCm, XPU, MPS,
TorchNeuron's neuron or any registered PrivateUse1 backend), else the CPU. An explicit name is
used as given: a type ("cuda", "neuron", "cpu", any registered type) or a type and index
("cuda:1"). Without an index the local rank picks one, so each torchrun process takes its own.
"""

from __future__ import annotations

import torch

from hlat.device.names import device_name_problem
from hlat.device.runtime import device_count, is_available
from hlat.errors import UserError


def resolve_device(name: str, setting: str, local_rank: int = 0) -> torch.device:
    """The device `setting` (the option that holds `name`, named in every refusal) asks for;
    `local_rank`: this process's index on its node (torchrun's LOCAL_RANK)."""
    problem = device_name_problem(name)
    if problem:
        raise UserError(f"{setting}: {problem}")
    if name == "auto":
        found = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
        device = torch.device(found.type if found is not None else "cpu")
    else:
        try:
            device = torch.device(name)
        except RuntimeError:
            raise UserError(
                f"{setting} {name}: torch knows no device type {name.partition(':')[0]!r} (is its backend "
                f"package installed?); use {setting} auto or cpu"
            ) from None
    if device.type == "cpu":
        return torch.device("cpu")
    return _indexed(device, name, setting, local_rank)


def _indexed(device: torch.device, name: str, setting: str, local_rank: int) -> torch.device:
    kind = device.type
    if not is_available(kind) or device_count(kind) == 0:
        raise UserError(f"{setting} {name}: no {kind} device is visible to this process; use {setting} cpu or auto")
    count, index = device_count(kind), local_rank if device.index is None else device.index
    if index >= count:
        fix = (
            f"pick an index below {count}"
            if device.index is not None
            else f"launch at most {count} processes per node (torchrun --nproc_per_node {count})"
        )
        raise UserError(
            f"{setting} {name}: this process needs {kind}:{index}, but {count} {kind} device"
            f"{'s are' if count > 1 else ' is'} visible; {fix}"
        )
    return torch.device(kind, index)
