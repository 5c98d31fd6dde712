"""Whether this run compiles its transformer blocks, decided once at start-up, and the compiling.

`parallel.compile = "auto"` compiles wherever the device's record names a compile backend
(hlat.device.record: inductor on CPU, CUDA and XPU, TorchNeuron's on Trainium) and runs eager
elsewhere. A probe compiles one block of the run's own shape on the run's device, dtype and
precision and runs a forward and backward; every rank must succeed (MIN over the world group) or
the whole run falls back to eager, so no rank diverges alone. Under "true" a failing probe is an
error. torch's own switch (TORCH_COMPILE_DISABLE=1, i.e. torch._dynamo.config.disable) always wins.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from hlat.config.data import DataConfig
from hlat.config.model import ModelConfig
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.config.train import TrainConfig
from hlat.device.record import device_record
from hlat.device.runtime import collective_device, fork_rng
from hlat.errors import ConfigError, UserError
from hlat.model.attention import attention_backend as attention_backend_context
from hlat.model.attention import document_mask
from hlat.model.llama import rope_tables
from hlat.model.spec import model_spec
from hlat.parallel.activation_checkpoint import attention_recomputed, checkpoint_block
from hlat.precision import autocast, cast_parameters, param_dtype
from hlat.progress import Heartbeat


@dataclass(frozen=True)
class CompileDecision:
    enabled: bool
    line: str  # the one start-up line: "compile: on (inductor, probe 5.8 s)" or why not


def compile_disabled_by_torch() -> bool:
    return bool(torch._dynamo.config.disable)


INDUCTOR = "inductor"  # the one backend parallel.compile_mode applies to

# Compiled tensor-parallel blocks train where the device record says its compiler was shown to
# (DeviceRecord.compiled_tp), without recompute: on torch 2.13 a recompute policy inside a compiled
# block saves the DTensor's DeviceMesh among the tensors for backward, which AOT autograd refuses
# ("expected all tensors_saved_with_vc_check to be Tensors"; docs/parallelism.md has the repro).
TP_UNSUPPORTED = "this device's compiler is not yet shown to compile tensor-parallel blocks"
TP_RECOMPUTE_UNSUPPORTED = (
    "tensor-parallel blocks with recompute do not compile on this torch (the recompute saves a DeviceMesh for backward)"
)


def decide_compile(
    *,
    model: ModelConfig,
    parallel: ParallelConfig,
    precision: PrecisionConfig,
    train: TrainConfig,
    data: DataConfig,
    device: torch.device,
    out: Callable[[str], None] = lambda _: None,
) -> CompileDecision:
    """Collective when a process group exists (every rank must call it). Decides parallel.compile
    (auto/true/false) for parallel.tp; the probe compiles a block as the run will: its
    activation-checkpoint policy, parallel.compile_mode, precision.mode, train.micro_batch and
    train.attention_backend, data.seq_len and data.document_masking. `out`: where the probe's
    start line and heartbeat go (it can take minutes)."""
    setting, tp, mode = parallel.compile, parallel.tp, parallel.compile_mode
    if setting == "false":
        return CompileDecision(False, "compile: off (parallel.compile false)")
    if compile_disabled_by_torch():
        return CompileDecision(
            False,
            f"compile: off (parallel.compile {setting}, but torch.compile is disabled by "
            "TORCH_COMPILE_DISABLE=1 / torch._dynamo.config.disable)",
        )
    record = device_record(device.type)
    tp_problem = (
        TP_UNSUPPORTED
        if not record.compiled_tp
        else TP_RECOMPUTE_UNSUPPORTED
        if parallel.activation_checkpoint != "none"
        else None
    )
    if tp > 1 and tp_problem:
        if setting == "true":
            raise UserError(
                f"parallel.compile=true with parallel.tp={tp}: {tp_problem}; set --parallel.compile "
                "false (or auto, which runs such layouts eager)"
            )
        return CompileDecision(False, f"compile: off (auto: {tp_problem})")
    backend = record.compile_backend
    if backend is None:
        if setting == "true":
            raise UserError(
                f"parallel.compile=true, but hlat knows no torch.compile backend for device {device.type!r}; "
                "set --parallel.compile false (or auto)"
            )
        return CompileDecision(False, f"compile: off (auto: no compile backend for {device.type})")
    if mode != "default" and backend != INDUCTOR:
        raise ConfigError(
            [
                (
                    "parallel.compile_mode",
                    f"{mode} is inductor's; {device.type} compiles with {backend}, set --parallel.compile_mode default",
                )
            ]
        )
    start = time.perf_counter()
    try:
        with (
            Heartbeat(f"compile probe: one transformer block through torch.compile ({backend})", out),
            attention_backend_context(train.attention_backend),
        ):
            probe_block(model=model, parallel=parallel, precision=precision, train=train, data=data, device=device)
        error = None
    except Exception as err:  # any failure of the compiler stack (missing C++ compiler, Triton, ...)
        error = err
    seconds = time.perf_counter() - start
    if not all_ranks_ok(error is None, device):
        reason = error_line(error) if error is not None else "failed on another rank"
        if setting == "true":
            raise UserError(
                f"parallel.compile=true, but compiling a transformer block failed: {reason}; "
                "set --parallel.compile false (or auto, which falls back to eager)"
            ) from error
        return CompileDecision(False, f"warning: compile: torch.compile failed ({reason}); running eager")
    mode_note = f", {mode}" if mode != "default" else ""
    return CompileDecision(True, f"compile: on ({backend}{mode_note}, probe {seconds:.1f} s)")


def compile_options(backend: str | None, mode: str) -> dict[str, str]:
    """torch.compile's mode argument for parallel.compile_mode `mode` (inductor's alone: other
    backends take none, and decide_compile refuses one for them)."""
    return {"mode": mode} if mode != "default" and backend == INDUCTOR else {}


def compile_blocks(module: nn.Module, device_type: str, backend: str | None = None, mode: str = "default") -> None:
    """Compile each transformer block in place; fullgraph, so a graph break is an error, not a slowdown.
    `backend`: torch.compile's; None = `device_type`'s (hlat.device.record; the multi-process tests
    capture with aot_eager). `mode`: parallel.compile_mode."""
    backend = backend or device_record(device_type).compile_backend
    for name, block in list(module.layers.items()):
        module.layers[name] = torch.compile(block, fullgraph=True, backend=backend, **compile_options(backend, mode))


def probe_block(
    *,
    model: ModelConfig,
    parallel: ParallelConfig,
    precision: PrecisionConfig,
    train: TrainConfig,
    data: DataConfig,
    device: torch.device,
) -> None:
    """Compile one block with the run's shapes and recompute policy and run forward and backward.
    The same shapes and inputs as Llama.forward gives its blocks, so the real blocks reuse this
    compilation; a combination the compiler cannot take fails here, not at the first step."""
    mode, precision_mode = parallel.compile_mode, precision.mode
    micro_batch, seq_len = train.micro_batch, data.seq_len
    recompute_attention = attention_recomputed(parallel.recompute_attention, device)
    with fork_rng(device):  # the run's RNG untouched
        with torch.device("meta"):
            block = cast_parameters(model_spec(model).model.block_class(model), precision_mode)
        block.to_empty(device=device)
        for param in block.parameters():
            nn.init.normal_(param, std=model.init_std)
        backend = device_record(device.type).compile_backend
        compiled = torch.compile(
            checkpoint_block(
                block,
                parallel.activation_checkpoint,
                parallel.recompute_every_other_mm,
                compiled=True,
                recompute_attention=recompute_attention,
            ),
            fullgraph=True,
            backend=backend,
            **compile_options(backend, mode),
        )
        cos, sin = rope_tables(model, device=device)
        # The block's input as the model makes it: an embedding lookup under the precision mode, whose
        # dtype (fp32 under bf16-sr's upcast on CPU, bf16 under mixed's weight casts) the graph depends on.
        table = nn.Parameter(torch.randn(16, model.d_model, device=device, dtype=param_dtype(precision_mode)))
        ids = torch.randint(0, 16, (micro_batch, seq_len), device=device)
        with autocast(precision_mode, device):
            x = nn.functional.embedding(ids, table).detach().requires_grad_()
        if data.document_masking:
            positions = torch.arange(seq_len, device=device).expand(micro_batch, seq_len)
            cos, sin = cos[positions][:, :, None], sin[positions][:, :, None]
            # one document per row, through the run's masking backend
            mask = document_mask(torch.zeros(micro_batch, seq_len, dtype=torch.long, device=device))
        else:
            cos, sin, mask = cos[None, :, None], sin[None, :, None], None
        with autocast(precision_mode, device):  # backward too, as the trainer runs it: a recompute replays the forward
            compiled(x, cos, sin, mask).float().sum().backward()


def all_ranks_ok(ok: bool, device: torch.device) -> bool:
    """Whether `ok` holds on every rank (collective where a process group exists)."""
    if not (dist.is_available() and dist.is_initialized()):
        return ok
    flag = torch.tensor([int(ok)], device=collective_device(device))
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def error_line(error: BaseException) -> str:
    """`Type: first line` of a compiler failure, for a one-line warning or refusal."""
    inner = getattr(error, "inner_exception", None)  # dynamo's BackendCompilerFailed wraps the real cause
    error = inner if isinstance(inner, BaseException) else error
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")
