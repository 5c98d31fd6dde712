"""The stages of benchmarks/gpu_check.py, one per process: each appends its results to a JSONL
file as they come (a stage cut off by its deadline keeps what it measured) and logs to stdout.

    python benchmarks/gpu_check_stages.py PLAN TOTAL_S RESULTS_JSONL LOG_DIR WORK_DIR [--cpu-dry-run]

PLAN: stage:seconds,... of env, parity, throughput, switches, end_to_end (benchmarks/gpu_check.py passes it). Each check inside a stage has its own soft deadline
(SIGALRM); the stage's hard deadline is the driver's. Sizes: `Sizes.gpu` on the GPU, `Sizes.dry`
(toy shapes, same code paths) in the CPU dry run, where everything compiled (blocks and the bf16
optimizer update) uses the aot_eager backend: the same capture and recompute, no inductor code
generation.
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import signal
import statistics
import sys
import sysconfig
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch

from hlat.config.load import load_config
from hlat.config.model import ModelConfig
from hlat.config.optim import OptimConfig
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.config.run import RunConfig
from hlat.data.batch import Batch, make_batch
from hlat.device import record
from hlat.device.record import device_record
from hlat.device.resolve import resolve_device
from hlat.device.runtime import accelerator, capability, synchronize, total_memory
from hlat.float8 import float8_problem
from hlat.metrics.memory import MemoryMeter
from hlat.model import flops_per_token
from hlat.model.ring_attention import RingContext, ring_attention
from hlat.parallel.compile import compile_disabled_by_torch
from hlat.parallel.init import canonical_name
from hlat.parallel.mesh import setup
from hlat.parallel.parallelize import build_parallel_model, global_target_count
from hlat.precision import compute_dtype
from hlat.train.train_module import TrainModule

CPU = torch.device("cpu")
EOS = 0  # the synthetic batches' end-of-document token


@dataclass(frozen=True)
class Sizes:
    parity: ModelConfig  # the small model of the parity checks
    parity_batch: tuple[int, int]  # (rows, tokens per row)
    throughput: list[str]  # overrides shrinking every throughput config (none on the GPU)
    steps: int  # timed steps per throughput config (the first, compilation included, is reported apart)
    gemm: int  # the bf16 GEMM's M = N = K
    e2e_steps: int
    check_s: float  # soft deadline of one check
    accumulation: int  # micro-batches per step of the configs that accumulate (Throughput.accumulated)


PARITY_MODEL = ModelConfig(
    vocab_size=512, d_model=256, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=688, max_seq_len=256
)
GPU = Sizes(PARITY_MODEL, (2, 256), [], 5, 8192, 20, 150.0, 4)
DRY = Sizes(
    replace(PARITY_MODEL, d_model=64, ffn_dim=160, max_seq_len=64),
    (2, 64),
    ["--model.n_layers", "2", "--model.d_model", "64", "--model.n_heads", "4", "--model.n_kv_heads", "2",
     "--model.ffn_dim", "160", "--model.vocab_size", "512", "--model.max_seq_len", "64", "--data.seq_len", "64"],
    2,
    256,
    4,
    60.0,
    2,
)  # fmt: skip


STAGE_DEADLINE = math.inf  # time.monotonic() at which the running stage is killed (set by host)


class CheckTimeout(Exception):
    pass


class Results:
    """Appends one JSON object per check to the stage's results file, flushed at once."""

    def __init__(self, path: Path, stage: str):
        self.path, self.stage = path, stage

    def rows(self) -> list[dict[str, Any]]:
        """Every row written so far, by this stage and the ones before it."""
        text = self.path.read_text() if self.path.exists() else ""
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def add(self, check: str, status: str, **fields: Any) -> None:
        row = {"stage": self.stage, "check": check, "status": status, **fields}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)

    def run(self, check: str, deadline_s: float, body: Callable[[], dict[str, Any]]) -> None:
        """`body`'s fields as an ok (or its own "status") row; an error or the deadline as such a row."""
        start = time.perf_counter()
        try:
            with _alarm(deadline_s):
                fields = body()
            status = fields.pop("status", "ok")
        except CheckTimeout:
            status, fields = "timeout", {"error": f"over its {deadline_s:.0f} s deadline"}
        except Exception as err:  # noqa: BLE001  (a check's failure is its result; the next check runs)
            status, fields = "error", {"error": f"{type(err).__name__}: {str(err).strip().splitlines()[0][:300]}"}
        self.add(check, status, wall_s=round(time.perf_counter() - start, 2), **fields)


@contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    def expired(signum: int, frame: Any) -> None:
        raise CheckTimeout

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# ---- env -----------------------------------------------------------------------------------


def stage_env(out: Results, device: torch.device, sizes: Sizes, dry: bool) -> None:
    def versions() -> dict[str, Any]:
        found = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
        for name in ("triton", "torchao"):
            try:
                found[name] = __import__(name).__version__
            except ImportError:
                found[name] = None
        found["compile"] = "disabled (TORCH_COMPILE_DISABLE)" if compile_disabled_by_torch() else "on"
        return found

    def device_row() -> dict[str, Any]:
        found = accelerator(device)
        if found is None:
            return {
                "device": f"{device} ({platform.processor() or platform.machine()}), no table row",
                "peak_tflops": None,
            }
        name, row = found
        major, minor = capability(device) or (None, None)
        return {
            "device": name,
            "capability": f"{major}.{minor}",
            "memory_gib": round((total_memory(device) or 0) / 2**30, 1),
            "table_row": row.name if row else None,
            "peak_tflops": row.bf16_tflops if row else None,
        }

    def gemm() -> dict[str, Any]:
        n = sizes.gemm
        a, b = (torch.randn(n, n, device=device, dtype=torch.bfloat16) for _ in range(2))
        a @ b
        synchronize(device)
        reps, start = 10, time.perf_counter()
        for _ in range(reps):
            a @ b
        synchronize(device)
        seconds = (time.perf_counter() - start) / reps
        return {"shape": n, "tflops": round(2 * n**3 / seconds / 1e12, 3)}

    out.run("versions", 30, versions)
    out.run("device", 30, device_row)
    out.run("bf16_gemm", 60, gemm)
    for preset in ("1b", "hlat-7b"):
        out.run(f"sdpa_kernel_{preset}", 60, partial(_sdpa_kernels, preset, device, dry))
    for preset in ("1b", "hlat-7b"):  # train.attention_backend's choices, forward and backward
        out.run(f"sdpa_backends_{preset}", 60, partial(_sdpa_backends, preset, device, dry))


def _sdpa_kernels(preset: str, device: torch.device, dry: bool) -> dict[str, Any]:
    """The kernels one SDPA forward and backward of the preset's attention shape runs (bf16 on the GPU)."""
    from torch.profiler import ProfilerActivity, profile

    from hlat.model.attention import sdpa

    shape, (q, k, v) = _attention_inputs(preset, device, dry)
    sdpa(q, k, v, None).sum().backward()  # warm-up: lazy initialisation stays out of the trace
    traced = device_record(device.type).profiler_activity
    activities = [ProfilerActivity.CPU] + ([getattr(ProfilerActivity, traced)] if traced else [])
    with profile(activities=activities) as prof:
        sdpa(q, k, v, None).sum().backward()
    keys = ("attention", "flash", "fmha", "cudnn", "efficient")
    names = sorted({e.key[:90] for e in prof.key_averages() if any(k in e.key.lower() for k in keys)})
    return {"shape": shape, "kernels": names}


def _attention_inputs(preset: str, device: torch.device, dry: bool) -> tuple[list[int], list[torch.Tensor]]:
    m = load_config(preset).model
    seq = 64 if dry else m.max_seq_len
    dtype = torch.float32 if dry else torch.bfloat16
    q = torch.randn(1, m.n_heads, seq, m.attn_head_dim, device=device, dtype=dtype, requires_grad=True)
    k, v = (
        torch.randn(1, m.n_kv_heads, seq, m.attn_head_dim, device=device, dtype=dtype, requires_grad=True) for _ in "kv"
    )
    return [1, m.n_heads, m.n_kv_heads, seq, m.attn_head_dim], [q, k, v]


def _sdpa_backends(preset: str, device: torch.device, dry: bool) -> dict[str, Any]:
    """Milliseconds of one causal SDPA forward and backward of the preset's attention shape under
    each backend the device offers (train.attention_backend), or why the backend cannot run it."""
    from hlat.model.attention import attention_backend, sdpa

    shape, (q, k, v) = _attention_inputs(preset, device, dry)
    found: dict[str, Any] = {"shape": shape}
    for name in ("auto", *device_record(device.type).sdpa_backends):
        try:
            with attention_backend(name):
                sdpa(q, k, v, None).sum().backward()  # warm-up
                synchronize(device)
                start, reps = time.perf_counter(), 1 if dry else 3
                for _ in range(reps):
                    sdpa(q, k, v, None).sum().backward()
                synchronize(device)
            found[name] = round((time.perf_counter() - start) / reps * 1e3, 3)
        except RuntimeError as err:
            found[name] = f"error: {str(err).strip().splitlines()[0][:120]}"
    return found


# ---- parity ---------------------------------------------------------------------------------


def _layout(device: torch.device):  # type: ignore[no-untyped-def]
    return setup(ParallelConfig(), device)


def _synthetic(vocab: int, rows: int, seq: int, documents: bool, seed: int = 0) -> Batch:
    """Random tokens (never EOS), with EOS at a few places per row when `documents`."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, vocab, (rows, seq), generator=gen)
    if documents:
        for row in range(rows):
            tokens[row, torch.randint(1, seq - 1, (3,), generator=gen)] = EOS
    return make_batch(tokens, EOS, documents, mask_eos_target=documents)


def _build(model_cfg: ModelConfig, device: torch.device, mode: str, build: dict[str, Any], accumulation: int):  # type: ignore[no-untyped-def]
    """hlat's parallelized model (one process) with `build`'s options (recompute, compiled, float8)."""
    par = ParallelConfig(activation_checkpoint=build.pop("recompute", "none"))
    build["compiled"] = build.get("compiled", False) and not compile_disabled_by_torch()
    return build_parallel_model(
        model_cfg,
        parallel=par,
        layout=_layout(device),
        device=device,
        seed=0,
        n_microbatches=accumulation,
        precision=PrecisionConfig(mode=mode),
        **build,
    )


def _loss_and_grads(
    model_cfg: ModelConfig, device: torch.device, mode: str, batch: Batch, **build: Any
) -> tuple[float, dict[str, torch.Tensor]]:
    """One forward and backward: the loss and the gradients by canonical name, on the CPU in fp32."""
    model = _build(model_cfg, device, mode, build, 1)
    batches = [batch.to(device)]
    loss = model.forward_backward(batches, global_target_count(batches, model.layout)).item()
    grads = {
        canonical_name(n): p.grad.detach().float().cpu() for part in model.parts for n, p in part.named_parameters()
    }
    return loss, grads


def _trajectory(
    model_cfg: ModelConfig, device: torch.device, mode: str, steps: list[list[Batch]], **build: Any
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Optimizer steps (AdamW, the default learning rate, gradient accumulation over each step's
    micro-batches): the losses and the final weights by canonical name, on the CPU in fp32."""
    model = _build(model_cfg, device, mode, build, len(steps[0]))
    module = TrainModule(
        model, optim=OptimConfig(), precision=PrecisionConfig(mode=mode), dp_sharding="ddp", seed=0, max_grad_norm=1.0
    )
    for micro in steps:
        module.step([b.to(device) for b in micro], OptimConfig().lr)
    losses, _ = module.read_losses()
    weights = {canonical_name(n): p.detach().float().cpu() for part in model.parts for n, p in part.named_parameters()}
    return losses, weights


def _compare_trajectory(
    run: tuple[list[float], dict[str, torch.Tensor]], ref: tuple[list[float], dict[str, torch.Tensor]], tol: float
) -> dict[str, Any]:
    """Every step's loss within `tol` (relative) of the reference's; the weights' relative error reported."""
    (losses, weights), (ref_losses, ref_weights) = run, ref
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses, strict=True))
    diff = torch.cat([(weights[n] - ref_weights[n]).flatten() for n in ref_weights]).norm()
    weight_err = (diff / torch.cat([w.flatten() for w in ref_weights.values()]).norm()).item()
    ok = worst <= tol and all(math.isfinite(x) for x in losses)
    return {
        "status": "ok" if ok else "fail",
        "losses": [round(x, 5) for x in losses],
        "ref_losses": [round(x, 5) for x in ref_losses],
        "loss_rel_err": worst,
        "weight_rel_err": weight_err,
        "tolerance": tol,
    }


def _compare(
    run: tuple[float, dict[str, torch.Tensor]], ref: tuple[float, dict[str, torch.Tensor]], tol: float
) -> dict[str, Any]:
    """Loss difference and the gradients' relative error (||g - g_ref|| / ||g_ref||, overall and worst tensor)."""
    (loss, grads), (ref_loss, ref_grads) = run, ref
    if grads.keys() != ref_grads.keys():
        return {"status": "fail", "error": f"parameter names differ: {sorted(grads.keys() ^ ref_grads.keys())[:4]}"}
    rel = {n: ((grads[n] - ref_grads[n]).norm() / ref_grads[n].norm().clamp_min(1e-30)).item() for n in grads}
    diff = torch.cat([(grads[n] - ref_grads[n]).flatten() for n in grads]).norm()
    total = (diff / torch.cat([g.flatten() for g in ref_grads.values()]).norm()).item()
    worst = max(rel, key=rel.__getitem__)
    ok = abs(loss - ref_loss) <= tol * abs(ref_loss) and total <= tol and math.isfinite(loss)
    return {
        "status": "ok" if ok else "fail",
        "loss": loss,
        "ref_loss": ref_loss,
        "grad_rel_err": total,
        "worst": f"{worst} {rel[worst]:.2e}",
        "tolerance": tol,
    }


PARITY_STEPS = 3  # optimizer steps of the trajectory checks, each of PARITY_ACCUMULATION micro-batches
PARITY_ACCUMULATION = 2
# (check, precision mode, compiled, loss tolerance relative to the CPU's fp32 trajectory)
TRAJECTORIES = [("fp32_3_steps", "fp32", False, 1e-4), ("mixed_3_steps_compiled", "mixed", True, 3e-2),
                ("bf16-sr_3_steps_compiled", "bf16-sr", True, 5e-2)]  # fmt: skip


def stage_parity(out: Results, device: torch.device, sizes: Sizes, dry: bool) -> None:
    """hlat on `device` against the same work on the CPU in fp32 eager, the reference: optimizer
    steps per precision mode, one step's gradients for determinism, document masking and float8,
    and the ring attention of context parallelism on two chunks in one process."""
    cfg, (rows, seq) = sizes.parity, sizes.parity_batch
    torch.set_float32_matmul_precision("highest")  # fp32 means fp32 for the parity (no TF32), on any device
    plain, documents = _synthetic(cfg.vocab_size, rows, seq, False), _synthetic(cfg.vocab_size, rows, seq, True)
    steps = [
        [
            _synthetic(cfg.vocab_size, rows, seq, False, seed=PARITY_ACCUMULATION * i + j)
            for j in range(PARITY_ACCUMULATION)
        ]
        for i in range(PARITY_STEPS)
    ]
    ref_steps = _trajectory(cfg, CPU, "fp32", steps)
    ref = _loss_and_grads(cfg, CPU, "fp32", plain)
    ref_documents = _loss_and_grads(cfg, CPU, "fp32", documents)  # the CPU's dense mask
    first: list[tuple[float, dict[str, torch.Tensor]]] = []

    def trajectory(mode: str, compiled: bool, tol: float) -> dict[str, Any]:
        run = _trajectory(cfg, device, mode, steps, compiled=compiled)
        return {**_compare_trajectory(run, ref_steps, tol), "compiled": compiled and not compile_disabled_by_torch()}

    def fp32_step() -> dict[str, Any]:
        first.append(_loss_and_grads(cfg, device, "fp32", plain))
        return _compare(first[0], ref, 1e-4)

    def repeat() -> dict[str, Any]:
        again = _loss_and_grads(cfg, device, "fp32", plain)
        fields = _compare(again, first[0], 0.0) if first else {"status": "skip", "error": "fp32_step did not run"}
        return {**fields, "bitwise": fields.get("grad_rel_err") == 0.0}

    def documents_selective() -> dict[str, Any]:
        run = _loss_and_grads(cfg, device, "fp32", documents, recompute="selective")
        mask = type(documents.to(device).attn_mask).__name__  # BlockMask (FlexAttention) on CUDA, else Tensor
        return {**_compare(run, ref_documents, 1e-4), "mask": mask}

    def float8() -> dict[str, Any]:
        if problem := float8_problem(device):
            return {"status": "skip", "error": problem}
        run = _loss_and_grads(cfg, device, "mixed", plain, compiled=True, float8=True)
        return {**_compare(run, ref, 1e-1), "compiled": not compile_disabled_by_torch()}

    for name, mode, compiled, tol in TRAJECTORIES:
        out.run(name, sizes.check_s, partial(trajectory, mode, compiled, tol))
    out.run("fp32_step_gradients", sizes.check_s, fp32_step)
    out.run("fp32_repeat_deterministic", sizes.check_s, repeat)
    out.run("documents_selective_recompute", sizes.check_s, documents_selective)
    out.run("float8_compiled", sizes.check_s, float8)
    for dtype, tol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        for docs in (False, True):
            name = f"ring_two_chunks_{'documents' if docs else 'causal'}_{str(dtype).removeprefix('torch.')}"
            out.run(name, sizes.check_s, partial(_ring_two_chunks, device, dtype, docs, tol, dry))


def _ring_two_chunks(
    device: torch.device, dtype: torch.dtype, documents: bool, tol: float, dry: bool
) -> dict[str, Any]:
    """Context parallelism's ring on one process (cp 1: its two load-balanced chunks run serially,
    three chunk pairs through the device's fused operator and the log-sum-exp merge), forward and
    backward, against full attention in fp32 on the CPU (causal, or within documents)."""
    kernel = device_record(device.type).ring_kernel
    if kernel is None:
        return {"status": "skip", "error": f"no ring kernel on {device.type}"}
    b, h, h_kv, t, d = (1, 4, 2, 64, 32) if dry else (1, 8, 2, 2048, 128)  # the reference runs on the CPU
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, n, t, d, generator=gen) for n in (h, h_kv, h_kv))
    doc_ids = torch.cumsum(torch.rand(b, t, generator=gen) < 4 / t, dim=1) if documents else None
    grad = torch.randn(b, h, t, d, generator=gen)

    def run(on: torch.device, as_dtype: torch.dtype, ring: bool) -> list[torch.Tensor]:
        leaves = [x.to(on, as_dtype, copy=True).requires_grad_() for x in (q, k, v)]  # fresh leaves per run
        if ring:
            ctx = RingContext(torch.distributed.group.WORLD, 0, 1, None if doc_ids is None else doc_ids.to(on))
            o = ring_attention(*leaves, ctx)
        else:  # the reference: one dense causal (within documents) softmax over the whole sequence
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            if doc_ids is not None:
                mask = mask & (doc_ids[:, :, None] == doc_ids[:, None, :])[:, None]
            kk, vv = (x.repeat_interleave(h // h_kv, dim=1) for x in leaves[1:])
            o = torch.nn.functional.scaled_dot_product_attention(leaves[0], kk, vv, attn_mask=mask)
        o.backward(grad.to(on, as_dtype))
        return [o.detach().float().cpu(), *(x.grad.float().cpu() for x in leaves)]

    if not torch.distributed.is_initialized():  # the ring's context names a group; cp 1 sends nothing on it
        torch.distributed.init_process_group("gloo", store=torch.distributed.HashStore(), rank=0, world_size=1)
    got, want = run(device, dtype, True), run(CPU, torch.float32, False)
    errors = {
        n: ((a - w).norm() / w.norm()).item() for n, a, w in zip(("out", "dq", "dk", "dv"), got, want, strict=True)
    }
    worst = max(errors.values())
    status = "ok" if worst <= tol and math.isfinite(worst) else "fail"
    return {"status": status, "kernel": kernel, "shape": [b, h, h_kv, t, d], **errors, "tolerance": tol}


# ---- throughput -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Throughput:
    name: str
    preset: str
    overrides: tuple[str, ...]
    compiled: bool
    float8: bool = False
    same_loss_as: str = ""  # a config on the same batch whose first loss this one must match
    accumulated: bool = False  # Sizes.accumulation micro-batches per step (else the global batch is 4)


SEVEN_B_SLICE = ("--model.n_layers", "4", "--parallel.tp", "1", "--parallel.dp_sharding", "ddp")
DOCUMENTS_SELECTIVE = ("--data.document_masking", "true", "--parallel.activation_checkpoint", "selective")
# `1b` at real gradient accumulation (Sizes.accumulation micro-batches a step, as a run amortises
# its optimizer step), eager and compiled, then with document masking under selective recompute.
THROUGHPUT = [
    Throughput("1b_eager", "1b", (), False, accumulated=True),
    Throughput("1b_compiled", "1b", (), True, same_loss_as="1b_eager", accumulated=True),
    Throughput("1b_documents_selective_compiled", "1b", DOCUMENTS_SELECTIVE, True, accumulated=True),
    Throughput("7b_4layers_compiled", "hlat-7b", SEVEN_B_SLICE, True),
    Throughput("1b_float8_compiled", "1b", (), True, float8=True, same_loss_as="1b_eager", accumulated=True),
    Throughput("1b_micro8_compiled", "1b", ("--train.micro_batch", "8", "--train.global_batch", "8"), True),
]  # fmt: skip
# The speed switches, each against its "off" run (the row named in same_loss_as, of this stage or
# the throughput stage before it): tokens/s and peak memory of both, and the first losses agree.
SWITCHES = [
    Throughput("1b_selective_eager", "1b", ("--parallel.activation_checkpoint", "selective", "--parallel.recompute_attention", "true"), False),
    Throughput("1b_selective_attention_saved_eager", "1b", ("--parallel.activation_checkpoint", "selective", "--parallel.recompute_attention", "false"), False, same_loss_as="1b_selective_eager"),
    Throughput("1b_bf16_cache_eager", "1b", ("--precision.bf16_weight_cache", "true"), False, same_loss_as="1b_eager", accumulated=True),
    Throughput("7b_4layers_float8_compiled", "hlat-7b", SEVEN_B_SLICE, True, float8=True, same_loss_as="7b_4layers_compiled"),
    Throughput("1b_autotune_compiled", "1b", ("--parallel.compile_mode", "max-autotune-no-cudagraphs"), True, same_loss_as="1b_compiled", accumulated=True),
]  # fmt: skip
AUTOTUNE_NEEDS_S = 75  # inductor's GEMM autotuning of `1b`: run only with this much of the stage left
FIRST_LOSS_TOL = {False: 2e-3, True: 2e-2}  # relative; float8 rounds its matmul inputs


def stage_throughput(
    out: Results, device: torch.device, sizes: Sizes, dry: bool, specs: list[Throughput] = THROUGHPUT
) -> None:
    """Synthetic batches through hlat's parallelized model, optimizer and step: no data pipeline,
    no tokenizer, no checkpoint."""
    first_losses = {r["check"]: r["first_loss"] for r in out.rows() if "first_loss" in r}  # earlier stages'
    for spec in specs:
        left = STAGE_DEADLINE - time.monotonic()
        if "max-autotune" in " ".join(spec.overrides) and left < AUTOTUNE_NEEDS_S and not dry:
            out.add(spec.name, "skip", error=f"{left:.0f} s left of the stage; autotuning needs {AUTOTUNE_NEEDS_S} s")
            continue
        out.run(spec.name, sizes.check_s * 1.5, partial(_throughput, spec, device, sizes, first_losses))


def stage_switches(out: Results, device: torch.device, sizes: Sizes, dry: bool) -> None:
    """The speed switches on and off (docs/parallelism.md, docs/precision.md), as the throughput stage runs them."""
    stage_throughput(out, device, sizes, dry, SWITCHES)


def _throughput(spec: Throughput, device: torch.device, sizes: Sizes, first_losses: dict[str, float]) -> dict[str, Any]:
    if spec.float8 and (problem := float8_problem(device)):
        return {"status": "skip", "error": problem}
    default_batch = ["--train.global_batch", "4"] if "--train.micro_batch" not in spec.overrides else []
    cfg: RunConfig = load_config(spec.preset, overrides=[*spec.overrides, *default_batch, *sizes.throughput])
    if spec.accumulated:
        cfg.train.global_batch = cfg.train.micro_batch * sizes.accumulation
    micro, seq = cfg.train.micro_batch, cfg.data.seq_len
    batches = [
        _synthetic(cfg.model.vocab_size, micro, seq, cfg.data.document_masking, seed).to(device)
        for seed in range(cfg.train.global_batch // micro)
    ]
    compiled = spec.compiled and not compile_disabled_by_torch()  # TORCH_COMPILE_DISABLE: eager, as hlat runs
    model = build_parallel_model(
        cfg.model,
        parallel=cfg.parallel,
        layout=_layout(device),
        device=device,
        seed=0,
        n_microbatches=len(batches),
        precision=cfg.precision,
        compiled=compiled,
        float8=spec.float8,
        attention=cfg.train.attention_backend,
    )
    module = TrainModule(
        model,
        optim=cfg.optim,
        precision=cfg.precision,
        dp_sharding=cfg.parallel.dp_sharding,
        seed=0,
        max_grad_norm=0.0,
    )
    meter = MemoryMeter(device)
    times = []
    for _ in range(sizes.steps):
        start = time.perf_counter()
        module.step(batches, cfg.optim.lr)
        synchronize(device)
        times.append(time.perf_counter() - start)
    losses, _ = module.read_losses()
    tokens = len(batches) * micro * seq
    steady = statistics.median(times[1:] or times)
    tps = tokens / steady
    peak = _peak_tflops(device, cfg.precision.mode)
    mfu = tps * flops_per_token(cfg.model, seq) / (peak * 1e12) if peak else None
    fields: dict[str, Any] = {
        "tokens_per_s": round(tps),
        "mfu": round(mfu, 4) if mfu is not None else None,
        "first_step_s": round(times[0], 2),
        "step_s": round(steady, 4),
        "peak_gib": round(meter.read()["mem_peak_gib"], 2),
        "first_loss": losses[0],
        "tokens_per_step": tokens,
        "compiled": compiled,
    }
    first_losses[spec.name] = losses[0]
    if spec.same_loss_as in first_losses:
        expected, tol = first_losses[spec.same_loss_as], FIRST_LOSS_TOL[spec.float8]
        agree = abs(losses[0] - expected) <= tol * abs(expected)
        fields.update(agrees_with=spec.same_loss_as, agrees=agree, status="ok" if agree else "fail")
    return fields


def _peak_tflops(device: torch.device, mode: str) -> float | None:
    """The device table's dense peak for the mode's matmul dtype; None for a device without a row."""
    found = accelerator(device)
    row = found[1] if found else None
    return (
        row.peak_tflops(compute_dtype(mode, device), torch.get_float32_matmul_precision() != "highest") if row else None
    )


# ---- end to end -----------------------------------------------------------------------------


def stage_end_to_end(out: Results, device: torch.device, sizes: Sizes, work: Path, dry: bool) -> None:
    """`hlat train` (tiny preset, a small BPE on 40 standard-library files) + resume + `hlat generate`, through the CLI."""
    from hlat.cli import main

    corpus = work / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(p for p in stdlib.glob("*.py") if 2_000 < p.stat().st_size < 40_000)[:40]:
        shutil.copy(path, corpus / path.name)
    run_dir = work / "run"
    common = [
        "--preset", "tiny", "--data.source", str(corpus), "--data.cache_dir", str(work / "cache"),
        "--model.vocab_size", "512", "--data.tokenizer_train_chars", "200000", "--train.device", device.type,
        "--train.run_dir", str(run_dir), "--train.log_every", "1", "--eval.every", "0", "--train.sample_prompt", "",
        "--train.plot", "false", "--train.tensorboard", "false", "--checkpoint.every", "1000",
        "--train.global_batch", "4", "--train.micro_batch", "4", "--parallel.compile", "false",  # throughput compiles
        *(["--model.n_layers", "2", "--model.d_model", "64", "--model.ffn_dim", "160", "--data.seq_len", "64"] if dry else []),
    ]  # fmt: skip
    steps = sizes.e2e_steps

    def cli(*argv: str) -> dict[str, Any]:
        code = main(list(argv))
        return {"exit_code": code, "status": "ok" if code == 0 else "fail"}

    out.run("train", sizes.check_s, partial(cli, "train", "--fresh", *common, "--train.steps", str(steps)))
    out.run("resume", sizes.check_s, partial(cli, "train", *common, "--train.steps", str(steps + steps // 2)))
    generate = [
        "generate",
        "--checkpoint",
        str(run_dir),
        "--prompt",
        "def ",
        "--max-new-tokens",
        "16",
        "--device",
        device.type,
    ]
    out.run("generate", sizes.check_s, partial(cli, *generate))


STAGES = {"env": stage_env, "parity": stage_parity, "throughput": stage_throughput, "switches": stage_switches}


def run_stage(name: str, results: Path, work: Path, dry: bool) -> None:
    device, sizes = (CPU, DRY) if dry else (resolve_device("auto", "gpu_check"), GPU)
    if dry:  # blocks and the bf16 optimizer update: the same capture and recompute, no inductor code generation
        record.RECORDS["cpu"] = replace(record.RECORDS["cpu"], compile_backend="aot_eager")
    out = Results(results, name)
    if name == "end_to_end":
        stage_end_to_end(out, device, sizes, work / name, dry)
    else:
        STAGES[name](out, device, sizes, dry)


def host(plan: list[tuple[str, float]], total_s: float, results: Path, logs: Path, work: Path, dry: bool) -> None:
    """Each stage in a child forked from this process, which imported torch and hlat once and
    touches no device: a child that crashes or passes its deadline (killed) ends only its stage.
    A stage's deadline is its own or what is left of `total_s`, whichever is less."""
    global STAGE_DEADLINE
    start = time.monotonic()
    for name, own_s in plan:
        limit = max(1.0, min(own_s, total_s - (time.monotonic() - start)))
        began = time.monotonic()
        STAGE_DEADLINE = began + limit  # the child reads it (a forked copy): checks that may not fit skip
        pid = os.fork()
        if pid == 0:  # the child: its output to the stage's log, its exit code to the parent
            log = os.open(logs / f"{name}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(log, 1)
            os.dup2(log, 2)
            code = 0
            try:
                run_stage(name, results, work, dry)
            except BaseException:  # noqa: BLE001  (reported as the stage's exit code; its log has the traceback)
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        status = _wait(pid, began + limit)
        row = {"stage": name, "check": "stage", "status": status, "wall_s": round(time.monotonic() - began, 1)}
        with results.open("a") as f:
            f.write(json.dumps({**row, "limit_s": round(limit)}) + "\n")
        print(f"gpu_check: {name}: {status} in {row['wall_s']} s", flush=True)


def _wait(pid: int, deadline: float) -> str:
    while time.monotonic() < deadline:
        done, code = os.waitpid(pid, os.WNOHANG)
        if done:
            return "ok" if os.waitstatus_to_exitcode(code) == 0 else f"failed (exit {os.waitstatus_to_exitcode(code)})"
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return "timeout"


def main(argv: list[str]) -> None:
    """host PLAN TOTAL_S RESULTS LOGS WORK [--cpu-dry-run], PLAN = stage:seconds,... (in order)."""
    plan = [(name, float(s)) for name, _, s in (item.partition(":") for item in argv[0].split(","))]
    host(plan, float(argv[1]), Path(argv[2]), Path(argv[3]), Path(argv[4]), "--cpu-dry-run" in argv)


if __name__ == "__main__":
    main(sys.argv[1:])
