"""Published training runs, and the one efficiency constant per calibration group fitted on them.

Each run is described as hlat would run it (a preset with overrides, a layout, a device) with the
tokens/s per rank its source reports. The fit picks, per calibration group (gpu, trainium, cpu),
the efficiency (fraction of the dense peak that compute reaches in hlat.planning.throughput) that
minimises the squared log error over the group's `fit` rows; the other rows are held out and
their error is reported.
Conditions the step-time model does not see (torch.compile, power limits, kernels) are written in
each row: they are what the held-out errors measure.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from hlat.accelerators import by_table_name
from hlat.config.load import load_config
from hlat.config.run import RunConfig
from hlat.planning.throughput import LayoutChoice, System, step_time

_TT = "https://github.com/pytorch/torchtitan/blob/main/benchmarks/"
_TT_2412 = _TT + "llama3_h100_202412_torchtitan.md"
_TT_ASYNC = _TT + "asyncTP_llama3_h100_2025-06_torchtitan.md"
_OLMO = "https://github.com/allenai/OLMo-core/blob/7e58d1289bc27103880e7a8382ad0847c35e04f7/README.md"
# The Neuron SDK's trn1 training table as published on 2024-12-20 (Neuron 2.21), the last version with all five
# Llama rows; conditions not in the table are the NxD tutorial scripts' (neuronx-distributed examples/training/llama).
# NxD's ZeRO-1 beside TP is hlat's zero2 (hlat's zero1 is 1-D only): both reduce-scatter the gradients
# and gather the updated bf16 weights once per step.
_NEURON = (
    "https://github.com/aws-neuron/aws-neuron-sdk/blob/752349fd3de5aaa6eb69690955eeaa7d43fcd082/"
    "general/benchmarks/trn1/training_data_decoder.csv"
)
_NXD = (
    "NxD 2.21, BF16 autocast + fp32 optimizer, ZeRO-1, selective recompute, micro-batch 1, global batch 1024 "
    "(70B: 8 KV heads replicated 4x)"
)
_HLAT_CPU = "benchmarks/train_throughput.md"
_TT_H100 = "Grand Teton H100 SXM, 96 GB HBM2e at 500 W (below the data sheet's 700 W)"
_LLAMA_70B = ("--model.d_model", "8192", "--model.n_layers", "80", "--model.n_heads", "64", "--model.ffn_dim", "28672")
_LLAMA2_13B = (
    "--model.d_model",
    "5120",
    "--model.n_layers",
    "40",
    "--model.n_heads",
    "40",
    "--model.n_kv_heads",
    "40",
    "--model.ffn_dim",
    "13824",
)
_OLMO2_7B = ("--model.vocab_size", "100352", "--model.rope_theta", "500000")  # llama2-7B shape, padded vocabulary
# This machine's CPU as hlat.metrics.cpu_peak reads it: 2 cores x 32 FLOP/cycle (AVX2) x 2.445 GHz.
CPU_BENCHMARK_GFLOPS = 156.5


@dataclass(frozen=True)
class Run:
    name: str
    source: str
    conditions: str
    device: str  # a row of hlat.accelerators, or "cpu"
    preset: str
    overrides: tuple[str, ...]  # model, sequence, batch and precision
    world: int
    layout: LayoutChoice
    tokens_per_s_per_rank: float  # as published
    fit: bool  # fitted on, else held out

    def config(self) -> RunConfig:
        return _config(self.preset, self.overrides)


@functools.cache
def _config(preset: str, overrides: tuple[str, ...]) -> RunConfig:
    return load_config(preset, None, list(overrides))


def _settings(seq: int, batch: int, micro: int, *extra: str) -> tuple[str, ...]:
    return (
        "--data.seq_len",
        str(seq),
        "--train.global_batch",
        str(batch),
        "--train.micro_batch",
        str(micro),
        "--precision.mode",
        "mixed",
        *extra,
    )


def _nxd(
    model: str,
    nodes: int,
    preset: str,
    seq: int,
    layout: LayoutChoice,
    seq_per_s: float,
    extra: tuple[str, ...] = (),
    fit: bool = False,
) -> Run:
    """A row of NxD's trn1 table, its layout over NeuronCores as NxD runs it: one rank per
    NeuronCore, 32 a trn1.32xlarge."""
    cores = nodes * 32
    return Run(
        f"Neuron SDK {model}, {nodes} trn1.32xlarge",
        _NEURON,
        f"{_NXD}, seq {seq}; {layout.name} NeuronCores; {seq_per_s} seq/s",
        "trn1 NeuronCore-v2",
        preset,
        _settings(seq, 1024, 1, *extra),
        cores,
        layout,
        seq_per_s * seq / cores,
        fit,
    )


# torchtitan's per-op SAC saves the matmuls' outputs except every second one per block (its
# _custom_policy: "Saves output of all compute ops, except every second mm"): hlat's op policy
# with recompute_every_other_mm, whose recomputed wk, wo and w3 the step time counts.
_TT_OP_SAC = ("--parallel.activation_checkpoint", "op", "--parallel.recompute_every_other_mm", "true")


RUNS: tuple[Run, ...] = (
    Run(
        "torchtitan Llama 3.1 8B, 8 H100, FSDP",
        _TT_2412,
        f"eager, op SAC (every other matmul recomputed), seq 8192, local batch 2; {_TT_H100}",
        "H100 SXM",
        "llama3.1-8b",
        _settings(8192, 16, 2, *_TT_OP_SAC),
        8,
        LayoutChoice(tp=1, pp=1, dp=8, sharding="fsdp", dp_shard=8, micro_batch=2, recompute="op"),
        5762,
        False,
    ),
    Run(
        "torchtitan Llama 3.1 8B, 8 H100, FSDP, compiled",
        _TT_2412,
        f"torch.compile, op SAC (every other matmul recomputed), seq 8192, local batch 2; {_TT_H100}",
        "H100 SXM",
        "llama3.1-8b",
        _settings(8192, 16, 2, *_TT_OP_SAC),
        8,
        LayoutChoice(tp=1, pp=1, dp=8, sharding="fsdp", dp_shard=8, micro_batch=2, recompute="op"),
        6667,
        True,
    ),
    Run(
        "torchtitan Llama 3.1 8B, 128 H100, FSDP",
        _TT_2412,
        f"eager, op SAC (every other matmul recomputed), seq 8192, local batch 2; {_TT_H100}",
        "H100 SXM",
        "llama3.1-8b",
        _settings(8192, 256, 2, *_TT_OP_SAC),
        128,
        LayoutChoice(tp=1, pp=1, dp=128, sharding="fsdp", dp_shard=128, micro_batch=2, recompute="op"),
        5605,
        False,
    ),
    Run(
        "torchtitan Llama 3.1 8B, 64 H100, FSDP 8 x TP 8",
        _TT_ASYNC,
        f"torch.compile, per-op SAC (every other matmul recomputed), bf16, vanilla TP, seq 8192, local batch 12; {_TT_H100}",
        "H100 SXM",
        "llama3.1-8b",
        _settings(8192, 96, 12, *_TT_OP_SAC),
        64,
        LayoutChoice(tp=8, pp=1, dp=8, sharding="fsdp", dp_shard=8, micro_batch=12, recompute="op"),
        4378,
        False,
    ),
    Run(
        "torchtitan Llama 3.1 70B, 256 H100, FSDP 32 x TP 8",
        _TT_ASYNC,
        f"torch.compile, full AC, bf16, vanilla TP, seq 8192, local batch 16; {_TT_H100}",
        "H100 SXM",
        "llama3.1-8b",
        _settings(8192, 512, 16, *_LLAMA_70B),
        256,
        LayoutChoice(tp=8, pp=1, dp=32, sharding="fsdp", dp_shard=32, micro_batch=16, recompute="full"),
        597.3,
        False,
    ),
    Run(
        "OLMo-core OLMo-2 7B, H100, HSDP",
        _OLMO,
        "torch.compile, no AC, bf16 weights, fp32 reduce, seq 4096, micro-batch 2, 1024 x 4096 tokens per step; "
        "GPU count not published: planned as 8 nodes of 8 (HSDP 8 x 8)",
        "H100 SXM",
        "hlat-7b",
        (
            "--data.seq_len",
            "4096",
            "--train.global_batch",
            "1024",
            "--train.micro_batch",
            "2",
            "--precision.mode",
            "mixed",
            *_OLMO2_7B,
        ),
        64,
        LayoutChoice(tp=1, pp=1, dp=64, sharding="fsdp", dp_shard=8, micro_batch=2, recompute="none"),
        10000,
        False,
    ),
    Run(
        "OLMo-core Llama 3 8B, H100, HSDP",
        _OLMO,
        "torch.compile, no AC, bf16 weights, fp32 reduce, seq 4096, micro-batch 2, 1024 x 4096 tokens per step; "
        "GPU count not published: planned as 8 nodes of 8 (HSDP 8 x 8)",
        "H100 SXM",
        "llama3.1-8b",
        _settings(4096, 1024, 2),
        64,
        LayoutChoice(tp=1, pp=1, dp=64, sharding="fsdp", dp_shard=8, micro_batch=2, recompute="none"),
        9500,
        False,
    ),
    _nxd(
        "Llama 2 7B",
        16,
        "hlat-7b",
        4096,
        LayoutChoice(tp=8, pp=1, dp=64, sharding="zero2", dp_shard=64, micro_batch=1, recompute="selective"),
        95.14,
    ),
    _nxd(
        "Llama 2 13B",
        32,
        "hlat-7b",
        4096,
        LayoutChoice(tp=8, pp=8, dp=16, sharding="zero2", dp_shard=16, micro_batch=1, recompute="selective"),
        80.33,
        _LLAMA2_13B,
    ),
    _nxd(
        "Llama 2 70B",
        32,
        "hlat-70b",
        4096,
        LayoutChoice(tp=32, pp=8, dp=4, sharding="zero2", dp_shard=4, micro_batch=1, recompute="selective"),
        14.44,
    ),
    _nxd(
        "Llama 3.1 8B",
        32,
        "llama3.1-8b",
        8192,
        LayoutChoice(tp=32, pp=1, dp=32, sharding="zero2", dp_shard=32, micro_batch=1, recompute="selective"),
        53.51,
        fit=True,
    ),
    _nxd(
        "Llama 3.1 70B",
        32,
        "llama3.1-8b",
        8192,
        LayoutChoice(tp=32, pp=8, dp=4, sharding="zero2", dp_shard=4, micro_batch=1, recompute="selective"),
        7.97,
        _LLAMA_70B,
    ),
    Run(
        "hlat small (8,192 vocabulary), this machine's CPU, compiled",
        _HLAT_CPU,
        "fp32, one process, 2 threads, AVX2 AMD EPYC, batch 8 x 512, blocks compiled (hlat's default)",
        "cpu",
        "small",
        ("--model.vocab_size", "8192", "--train.global_batch", "8", "--train.micro_batch", "8"),
        1,
        LayoutChoice(tp=1, pp=1, dp=1, sharding="ddp", dp_shard=1, micro_batch=8, recompute="none"),
        561,
        True,
    ),
    Run(
        "hlat small (8,192 vocabulary), this machine's CPU, eager",
        _HLAT_CPU,
        "fp32, one process, 2 threads, AVX2 AMD EPYC, batch 8 x 512, eager",
        "cpu",
        "small",
        ("--model.vocab_size", "8192", "--train.global_batch", "8", "--train.micro_batch", "8"),
        1,
        LayoutChoice(tp=1, pp=1, dp=1, sharding="ddp", dp_shard=1, micro_batch=8, recompute="none"),
        472,
        False,
    ),
)


def system_for(device: str, efficiency: float) -> System:
    """A table row (or the benchmark's CPU) at `efficiency`, for the calibration's rows."""
    if device == "cpu":
        return System("cpu", CPU_BENCHMARK_GFLOPS / 1e3, 0.0, 1, 0.0, 0.0, "cpu", efficiency)
    row = by_table_name(device)
    return System(
        row.name,
        row.bf16_tflops,
        row.memory_gib,
        row.per_node,
        row.intra_gbs,
        row.inter_gbs,
        row.calibration_group,
        efficiency,
    )


def calibration_group_of(run: Run) -> str:
    return "cpu" if run.device == "cpu" else by_table_name(run.device).calibration_group


def predicted_per_rank(run: Run, efficiency: float) -> float:
    cfg = run.config()
    return step_time(cfg, run.world, system_for(run.device, efficiency), run.layout).tokens_per_s / run.world


@functools.cache
def efficiencies() -> dict[str, float]:
    """Calibration group -> the efficiency that fits its `fit` rows best (least squared log error)."""
    fitted: dict[str, float] = {}
    for group in sorted({calibration_group_of(r) for r in RUNS}):
        rows = [r for r in RUNS if r.fit and calibration_group_of(r) == group]
        fitted[group] = _minimise(
            lambda e: sum(math.log(predicted_per_rank(r, e) / r.tokens_per_s_per_rank) ** 2 for r in rows), 0.005, 1.0
        )
    return fitted


def _minimise(loss, low: float, high: float) -> float:
    """Golden-section search: the loss is unimodal in the efficiency (throughput rises with it)."""
    ratio = (math.sqrt(5) - 1) / 2
    while high - low > 1e-6:
        a, b = high - ratio * (high - low), low + ratio * (high - low)
        low, high = (low, b) if loss(a) <= loss(b) else (a, high)
    return (low + high) / 2


def errors() -> list[tuple[Run, float, float]]:
    """(run, predicted tokens/s per rank, relative error) for every run, at the fitted constants."""
    out = []
    for run in RUNS:
        predicted = predicted_per_rank(run, efficiencies()[calibration_group_of(run)])
        out.append((run, predicted, predicted / run.tokens_per_s_per_rank - 1))
    return out


def format_calibration() -> str:
    """The table `hlat plan --calibration` prints."""
    fitted = efficiencies()
    lines = [
        # "device family" is the printed name of a calibration group (docs/parallelism.md quotes this table)
        "efficiency per device family (fraction of the dense peak compute reaches): "
        + ", ".join(f"{group} {value:.3f}" for group, value in fitted.items()),
        f"{'run':<58} {'role':<8} {'published':>10} {'predicted':>10} {'error':>7}",
    ]
    rows = errors()
    for run, predicted, error in rows:
        lines.append(
            f"{run.name:<58} {'fit' if run.fit else 'held out':<8} {run.tokens_per_s_per_rank:>10,.0f} "
            f"{predicted:>10,.0f} {error:>+7.1%}"
        )
    held = [abs(e) for r, _, e in rows if not r.fit]
    lines.append(
        f"held-out rows: {len(held)}, mean |error| {sum(held) / len(held):.1%}, max {max(held):.1%} "
        "(tokens/s per rank; sources and conditions: docs/parallelism.md)"
    )
    return "\n".join(lines)
