"""What hlat needs to know about a device type: one frozen record per type, looked up by name.

Rows for the types hlat has reasons to treat apart; any other type (a PrivateUse1 backend such as
a simulated device, or one torch adds later) gets the conservative record: eager, foreach AdamW,
the dense attention mask, ordinary copies. ROCm devices report the type "cuda" and take its row.
The distributed backend is read from torch's own device-to-backend map when asked, so a backend
registered after import (dist.Backend.register_backend(..., devices=[type])) is found. Autocast
needs no entry: every type here takes bf16, the dtype the precision modes name (hlat.precision).
"""

from __future__ import annotations

from dataclasses import dataclass

_GLOO = "gloo"


@dataclass(frozen=True)
class DeviceRecord:
    type: str
    compile_backend: str | None = None  # torch.compile's backend for blocks and the bf16 optimizer; None: eager
    # The backend takes dynamic=True (symbolic sizes and scalars): one optimizer kernel for all
    # parameter sizes. TorchNeuron's rejects it (its torch.compile reference): one per size there.
    compile_dynamic: bool = True
    # Compiled blocks under tensor parallelism (without recompute: hlat.parallel.compile); a row turns
    # this on once its compiler is shown to train them (the CPU's in the suite's parity scenarios).
    compiled_tp: bool = False
    # Models of up to 9B parameters run FSDP2/HSDP without tensor parallelism where a preset chose
    # tp and memory allows (parallel.device_layout): blocks then compile, as torchtitan runs Llama 3 8B.
    data_parallel_first: bool = False
    fused_adamw: bool = False  # torch's fused AdamW kernel (one kernel, exact `found_inf` skips); else foreach
    flex_attention: bool = False  # FlexAttention's compiled kernel for document masks; else a dense mask
    # The SDPA backends torch.nn.attention.sdpa_kernel can restrict attention to (train.attention_backend).
    sdpa_backends: tuple[str, ...] = ()
    # `selective` recompute replays fused attention in backward; False: its output is saved (on GPUs the
    # fused kernel's output and log-sum-exp are small, and the kernel is the block's costliest to replay).
    recompute_fused_attention: bool = True
    # The fused attention operator context parallelism's ring runs per chunk pair (hlat.model.
    # ring_attention): "flash_cpu" or "efficient" (CUDA's memory-efficient kernel); None: no ring.
    ring_kernel: str | None = None
    # Context parallelism trains on this device: its ring runs across processes in the suite (the
    # CPU's; CUDA's kernel on the simulated device's CUDA-like profile, tests/device/profiles.py).
    ring_attention: bool = False
    pin_memory: bool = False  # batches are copied from page-locked host memory without blocking
    float8: bool = False  # float8 matmuls, where the device's capability allows (hlat.float8)
    profiler_activity: str | None = None  # the torch.profiler.ProfilerActivity that traces its kernels
    stochastic_rounding_env: str | None = None  # the runtime's switch for hardware stochastic rounding
    # Initial weights computed on the host and copied (hlat.parallel.init): the value function issues
    # ~140 int64 operators per chunk (Threefry), which a device without int64 arithmetic runs as host
    # fallbacks one by one (TorchNeuron's, as read; never measured on one).
    init_on_host: bool = False

    @property
    def dist_backend(self) -> str | None:
        """The torch.distributed backend for this type's tensors: torch's default for the type, else
        a registered backend that declares it (TorchNeuron's "neuron"); None: none is registered."""
        import torch.distributed as dist

        if self.type == "cpu":
            return _GLOO
        declared = (name for name, types in dist.Backend.backend_capability.items() if self.type in types)
        return dist.Backend.default_device_backend_map.get(self.type) or next(declared, None)

    @property
    def process_group_backend(self) -> str | None:
        """What init_process_group takes: the device's backend alone where it also takes host
        tensors (object collectives, host-side flags), as TorchNeuron documents
        `init_process_group(backend="neuron")`; else gloo beside it for them (CUDA's nccl)."""
        import torch.distributed as dist

        backend = self.dist_backend
        if backend in (None, _GLOO) or "cpu" in dist.Backend.backend_capability.get(backend, ()):
            return backend
        return f"cpu:{_GLOO},{self.type}:{backend}"


RECORDS: dict[str, DeviceRecord] = {
    # torch 2.13's FlexAttention has no backward on the CPU (hlat.model.attention)
    "cpu": DeviceRecord(
        "cpu",
        compile_backend="inductor",
        compiled_tp=True,
        fused_adamw=True,
        sdpa_backends=("flash", "math"),
        ring_kernel="flash_cpu",
        ring_attention=True,
    ),
    "cuda": DeviceRecord(
        "cuda",
        compile_backend="inductor",
        fused_adamw=True,
        data_parallel_first=True,
        flex_attention=True,
        sdpa_backends=("cudnn", "flash", "efficient", "math"),
        recompute_fused_attention=False,
        ring_kernel="efficient",
        ring_attention=True,
        pin_memory=True,
        float8=True,
        profiler_activity="CUDA",
    ),
    "xpu": DeviceRecord("xpu", compile_backend="inductor", pin_memory=True, profiler_activity="XPU"),
    "mps": DeviceRecord("mps"),
    # TorchNeuron: torch.compile(backend="neuron"); HLAT's scripts switched the hardware's stochastic
    # rounding on with this runtime variable (hlat.device.rounding says what is known of it).
    "neuron": DeviceRecord(
        "neuron",
        compile_backend="neuron",
        compile_dynamic=False,
        stochastic_rounding_env="NEURON_RT_STOCHASTIC_ROUNDING_EN",
        init_on_host=True,
    ),
}


def device_record(device_type: str) -> DeviceRecord:
    """The record of `device_type`; the conservative default for a type without a row."""
    return RECORDS.get(device_type) or DeviceRecord(device_type)


# hlat.accelerators' calibration groups (Accelerator.calibration_group) and the device type each one runs as.
_GROUP_DEVICE_TYPES = {"gpu": "cuda", "trainium": "neuron", "cpu": "cpu"}


def calibration_group_record(group: str) -> DeviceRecord:
    """The record of the device type a calibration group runs as (`hlat plan --device`'s row)."""
    return device_record(_GROUP_DEVICE_TYPES.get(group, group))
