"""Whose stochastic rounding `precision.mode = bf16-sr` uses: the device's hardware or hlat's own.

NeuronCore-v2 and later round fp32 -> bf16 either to nearest or stochastically; the Neuron
Runtime switches to stochastic rounding with NEURON_RT_STOCHASTIC_ROUNDING_EN=1, which HLAT's
scripts set (Neuron docs, "Neuron Rounding Modes":
https://awsdocs-neuron.readthedocs-hosted.com/en/latest/general/arch/neuron-features/rounding-modes.html;
the torch-xla "Migration From XLA_USE_BF16/XLA_DOWNCAST_BF16" note sets it with model.to(bf16)).
It is a variable of the runtime (libnrt), read from the process environment, which TorchNeuron
also runs on; TorchNeuron's own pages (environment variables, torch.neuron reference) do not
mention it, so whether its eager and compiled paths honour it is not confirmed. hlat therefore
never sets it: only when the launch set it does the optimizer hand its fp32 -> bf16 casts to the
hardware, and otherwise rounds in software, bit for bit as on every other device.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hlat.device.record import DeviceRecord

_TRUE = ("1", "true")  # the runtime's booleans: 0, 1, false, true, any case


@dataclass(frozen=True)
class Rounding:
    hardware: bool  # the device rounds the optimizer's plain bf16 casts stochastically
    line: str | None  # the start-up line (None: nothing to say in this mode)


def stochastic_rounding(mode: str, record: DeviceRecord, environ: Mapping[str, str]) -> Rounding:
    """The decision for `mode` on a device of `record`'s type in the process environment `environ`."""
    switch = record.stochastic_rounding_env
    on = switch is not None and environ.get(switch, "").strip().lower() in _TRUE
    if mode == "bf16-sr":
        if on:
            return Rounding(True, f"stochastic rounding: hardware ({switch}={environ[switch]})")
        hint = f" (launch with {switch}=1 for the hardware's)" if switch else ""
        return Rounding(False, f"stochastic rounding: software{hint}")
    if on and mode in ("mixed", "bf16"):
        return Rounding(
            False,
            f"warning: {switch}={environ[switch]} makes the device round every bf16 cast stochastically, "
            f"also under precision.mode {mode}; unset it for round-to-nearest",
        )
    return Rounding(False, None)
