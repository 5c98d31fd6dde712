"""The parity stage of benchmarks/gpu_check_stages.py: hlat on the device against the same work on
the CPU in fp32, the reference (optimizer steps per precision mode, one step's gradients, document
masking, float8, and context parallelism's ring on one process)."""

from __future__ import annotations

import math
from functools import partial
from typing import Any

import torch
from gpu_check_common import CPU, EOS, Results, Sizes

from hlat.config.model import ModelConfig
from hlat.config.optim import OptimConfig
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.data.batch import Batch, make_batch
from hlat.device.record import device_record
from hlat.float8 import float8_problem
from hlat.model.ring_attention import RingContext, ring_attention
from hlat.parallel.compile import compile_disabled_by_torch
from hlat.parallel.init import canonical_name
from hlat.parallel.mesh import setup
from hlat.parallel.parallelize import build_parallel_model, global_target_count
from hlat.train.train_module import TrainModule


def one_process_layout(device: torch.device):  # type: ignore[no-untyped-def]
    return setup(ParallelConfig(), device)


def synthetic_batch(vocab: int, rows: int, seq: int, documents: bool, seed: int = 0) -> Batch:
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
        layout=one_process_layout(device),
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
    for number, micro in enumerate(steps, 1):
        module.step([b.to(device) for b in micro], OptimConfig().lr, number)
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
    plain, documents = (
        synthetic_batch(cfg.vocab_size, rows, seq, False),
        synthetic_batch(cfg.vocab_size, rows, seq, True),
    )
    steps = [
        [
            synthetic_batch(cfg.vocab_size, rows, seq, False, seed=PARITY_ACCUMULATION * i + j)
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
