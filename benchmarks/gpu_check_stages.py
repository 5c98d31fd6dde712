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
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import torch
from gpu_check_common import CPU, DRY, GPU, Results, Sizes
from gpu_check_parity import one_process_layout, stage_parity, synthetic_batch

from hlat.config.load import load_config
from hlat.config.run import RunConfig
from hlat.device import record
from hlat.device.record import device_record
from hlat.device.resolve import resolve_device
from hlat.device.runtime import accelerator, capability, synchronize, total_memory
from hlat.float8 import float8_problem
from hlat.metrics.memory import MemoryMeter
from hlat.model import flops_per_token
from hlat.parallel.compile import compile_disabled_by_torch
from hlat.parallel.parallelize import build_parallel_model
from hlat.precision import compute_dtype
from hlat.train.train_module import TrainModule

STAGE_DEADLINE = math.inf  # time.monotonic() at which the running stage is killed (set by host)

# ---- env -----------------------------------------------------------------------------------


def stage_env(out: Results, device: torch.device, sizes: Sizes, dry: bool) -> None:
    def versions() -> dict[str, Any]:
        found = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
        # cuDNN's runtime decides SDPA's order on sm90/sm100: above 9.15.0 cuDNN attention comes first
        # (torch 2.13's PyPI wheel: 9.20), unless TORCH_CUDNN_SDPA_DEPRIORITIZED=1 (docs/devices.md)
        found["cudnn"] = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        found["cudnn_sdpa_deprioritized"] = os.environ.get("TORCH_CUDNN_SDPA_DEPRIORITIZED")
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
        synthetic_batch(cfg.model.vocab_size, micro, seq, cfg.data.document_masking, seed).to(device)
        for seed in range(cfg.train.global_batch // micro)
    ]
    compiled = spec.compiled and not compile_disabled_by_torch()  # TORCH_COMPILE_DISABLE: eager, as hlat runs
    model = build_parallel_model(
        cfg.model,
        parallel=cfg.parallel,
        layout=one_process_layout(device),
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
    for number in range(1, sizes.steps + 1):
        start = time.perf_counter()
        module.step(batches, cfg.optim.lr, number)
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
    """`hlat train` (tiny preset, a small BPE on 40 standard-library files) + resume + `hlat generate`,
    through the CLI; then train.deterministic twice, which must agree bit for bit."""
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

    def deterministic() -> dict[str, Any]:
        """train.deterministic twice from scratch (torch's deterministic algorithms on this device):
        the same losses and gradient norms, bit for bit. Last: the setting stays on in this process."""
        found = []
        for name in ("det-a", "det-b"):
            argv = [*common, "--train.run_dir", str(work / name), "--train.micro_batch", "2"]
            code = main(["train", "--fresh", *argv, "--train.deterministic", "true", "--train.steps", str(steps)])
            if code:
                return {"exit_code": code, "status": "fail"}
            records = [json.loads(line) for line in (work / name / "metrics.jsonl").read_text().splitlines()]
            found.append([(r["loss"], r["grad_norm"]) for r in records if "loss" in r])
        same = found[0] == found[1]
        return {"same_bits": same, "steps": len(found[0]), "status": "ok" if same else "fail"}

    out.run("deterministic", sizes.check_s, deterministic)


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
