"""What `hlat plan` can count of the speed switches on the device it plans for: the layout
parallel.device_layout would take, what `selective` recompute does with fused attention (FLOPs
replayed, or bytes saved), which blocks float8 converts, and the bf16 weight casts a step runs.
Their measured effect comes from a GPU run (benchmarks/gpu_check.sh); these are counts only."""

from __future__ import annotations

from hlat.config.run import RunConfig
from hlat.device.record import calibration_group_record
from hlat.model import flops_per_token
from hlat.planning.device_layout import device_layout
from hlat.planning.memory import GIB
from hlat.planning.throughput import System, _causal_attention_forward
from hlat.precision import compute_dtype


def attention_saved_bytes(cfg: RunConfig) -> float:
    """Bytes per rank that saving fused attention's output and log-sum-exp adds under `selective`
    (one micro-batch's, every layer; sequence parallel splits them over tp)."""
    model = cfg.model
    width = compute_dtype(cfg.precision.mode).itemsize
    per_token = model.n_heads * model.attn_head_dim * width + model.n_heads * 4  # output, fp32 lse
    return per_token * cfg.data.seq_len * cfg.train.micro_batch * model.n_layers / cfg.parallel.tp


def planned_layout(cfg: RunConfig, world: int, system: System) -> tuple[RunConfig, str | None]:
    """The config training would run on `world` ranks of `system` (parallel.device_layout
    applied) and, where that differs from the config's own layout, the line saying so."""
    record = calibration_group_record(system.calibration_group)
    return device_layout(cfg, world, record, int(system.memory_gib * GIB))


def format_switches(cfg: RunConfig, world: int, system: System) -> str:
    """`cfg` as configured; the counts are of the layout training would run (planned_layout)."""
    record = calibration_group_record(system.calibration_group)
    lines = [f"speed switches on {system.name} (counted, not measured):"]
    laid_out, line = planned_layout(cfg, world, system)
    if line:
        lines.append(
            f"  layout: parallel.device_layout auto runs tp 1, {laid_out.parallel.dp_sharding} "
            f"(the config's tp {cfg.parallel.tp}: --parallel.device_layout config)"
        )
    else:
        lines.append(f"  layout: as configured (tp {cfg.parallel.tp})")
    cfg = laid_out
    par = cfg.parallel
    if par.activation_checkpoint == "selective":
        replayed = (
            record.recompute_fused_attention if par.recompute_attention == "auto" else par.recompute_attention == "true"
        )
        replay = _causal_attention_forward(cfg.model, cfg.data.seq_len)
        share = replay / flops_per_token(cfg.model, cfg.data.seq_len)
        if replayed:
            lines.append(
                f"  selective: fused attention replayed in backward, {replay / 1e9:.2f} GFLOP/token "
                f"({share:.1%} of the model's); saving it would hold {attention_saved_bytes(cfg) / GIB:.2f} GiB more per rank"
            )
        else:
            lines.append(
                f"  selective: fused attention saved, {attention_saved_bytes(cfg) / GIB:.2f} GiB per rank, "
                f"instead of replaying {replay / 1e9:.2f} GFLOP/token ({share:.1%} of the model's)"
            )
    prec = cfg.precision
    wide = cfg.model.d_model >= prec.float8_min_d_model
    blocks = f"{cfg.model.n_layers if wide else 0} of {cfg.model.n_layers} blocks"
    state = "on" if prec.float8 else "off (precision.float8 false)"
    lines.append(
        f"  float8: {state}; {blocks} at least precision.float8_min_d_model {prec.float8_min_d_model} wide "
        f"(d_model {cfg.model.d_model}){'' if record.float8 else '; this device has no float8 matmuls'}"
    )
    if prec.mode == "mixed":
        micro = cfg.train.global_batch // max(1, world // (par.tp * par.pp * par.cp)) // cfg.train.micro_batch
        casts = 1 if prec.bf16_weight_cache else micro
        lines.append(
            f"  bf16 weight casts per step: {casts} per weight ({micro} micro-batches"
            f"{', precision.bf16_weight_cache' if prec.bf16_weight_cache else ''})"
        )
    return "\n".join(lines)
