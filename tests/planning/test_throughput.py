"""The planner's step-time model on hand-computed layouts, the layout search, the calibration."""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest

from hlat.config.load import load_config
from hlat.config.run import RunConfig
from hlat.errors import UserError
from hlat.model import flops_per_token
from hlat.planning.calibration import RUNS, calibration_group_of, efficiencies, errors, format_calibration
from hlat.planning.forecast import Figures, format_forecast, make_system
from hlat.planning.layout_search import TIE_RULE, format_search, search
from hlat.planning.throughput import LayoutChoice, System, executed_flops_per_token, step_time

# 100 TFLOP/s at half efficiency = 50 TFLOP/s of compute; 4 ranks per node.
SYSTEM = System("test", 100.0, 80.0, 4, 100.0, 10.0, "gpu", 0.5)


@functools.cache
def _tiny() -> RunConfig:
    return load_config("tiny")  # fp32, d 256, 4 layers, 8 x 256 tokens per step


def _layout(tp=1, pp=1, dp=1, sharding="ddp", micro=1, recompute="none") -> LayoutChoice:
    return LayoutChoice(tp=tp, pp=pp, dp=dp, sharding=sharding, dp_shard=dp, micro_batch=micro, recompute=recompute)


def test_kv_projections_computed_by_several_ranks_count_once_per_copy():
    """tp 8 over 2 KV heads: each head is computed by 4 ranks (hlat.parallel.tensor_parallel), so
    the KV projections run 4 times, forward and backward (and forward again under full recompute)."""
    model = dataclasses.replace(_tiny().model, n_kv_heads=2)
    kv_forward = 2 * 2 * model.n_layers * model.d_model * model.n_kv_heads * model.attn_head_dim  # wk and wv
    for policy, passes in (("none", 3), ("full", 4)):
        base = executed_flops_per_token(model, 256, policy)
        assert executed_flops_per_token(model, 256, policy, tp=2) == base  # one copy of each head
        assert executed_flops_per_token(model, 256, policy, tp=8) == pytest.approx(base + passes * kv_forward * 3)


def test_compute_is_executed_flops_over_peak_times_efficiency():
    cfg = _tiny()
    step = step_time(cfg, 1, SYSTEM, _layout())
    tokens = 8 * 256
    causal_half = 6 * 4 * 256 * 256  # the masked half of attention's 12 L d s, skipped by the kernels
    executed = flops_per_token(cfg.model, 256) - causal_half
    assert step.compute_s == pytest.approx(executed * tokens / 50e12)
    assert step.total_s == step.compute_s  # nothing else on one rank
    assert step.mfu == pytest.approx(0.5 * flops_per_token(cfg.model, 256) / executed)  # MFU keeps the 12 L d s
    # full recompute runs the blocks' forward again: 2 FLOPs per block weight and causal attention's 2 L d s
    full = step_time(cfg, 1, SYSTEM, _layout(recompute="full"))
    block_weights = 4 * (
        2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 688 + 2 * 256
    )  # wq wo, wk wv (4 kv heads), mlp, norms
    assert full.compute_s == pytest.approx((executed + 2 * block_weights + 2 * 4 * 256 * 256) * tokens / 50e12)
    # op saving every other matmul recomputes wk, wo and w3
    every_other = dataclasses.replace(
        cfg, parallel=dataclasses.replace(cfg.parallel, activation_checkpoint="op", recompute_every_other_mm=True)
    )
    op = step_time(every_other, 1, SYSTEM, _layout(recompute="op"))
    assert op.compute_s == pytest.approx((executed + 2 * 4 * 256 * (128 + 256 + 688)) * tokens / 50e12)


def test_tensor_parallel_traffic_within_a_node():
    # TP 2 on 2 ranks: per block and micro-batch 8 collectives of (t-1)/t of b x s x d fp32 at 100 GB/s.
    step = step_time(_tiny(), 2, SYSTEM, _layout(tp=2, micro=8))
    assert step.tp_s == pytest.approx(8 * 0.5 * (8 * 256 * 256 * 4) * 4 / 100e9)
    # "op" recomputes the 2 gathers (it saves only the reduce-scatters' outputs), "full" all 4
    assert step_time(_tiny(), 2, SYSTEM, _layout(tp=2, micro=8, recompute="op")).tp_s == pytest.approx(
        step.tp_s * 10 / 8
    )
    assert step_time(_tiny(), 2, SYSTEM, _layout(tp=2, micro=8, recompute="full")).tp_s == pytest.approx(
        step.tp_s * 12 / 8
    )


def test_data_parallel_traffic_is_exposed_beyond_its_window():
    # DDP over 8 ranks (two nodes: the network's 10 GB/s) all-reduces 2 x 7/8 of the fp32 gradients
    # beside the backward (2/3 of the compute without recompute).
    cfg = _tiny()
    slow = System("test", 1e6, 80.0, 4, 100.0, 10.0, "gpu", 1.0)  # compute next to nothing
    step = step_time(cfg, 8, slow, _layout(dp=8))
    n = 4 * (2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 688 + 2 * 256) + 2 * 4096 * 256 + 256
    assert step.dp_s == pytest.approx(2 * 7 / 8 * n * 4 / 10e9 - step.compute_s * 2 / 3)
    slow_compute = System("test", 0.01, 80.0, 4, 100.0, 10.0, "gpu", 1.0)
    assert step_time(cfg, 8, slow_compute, _layout(dp=8)).dp_s == 0  # a longer compute hides it
    # accumulating over 4 micro-batches, the one reduction has only the last one's backward beside it
    acc = step_time(cfg, 2, slow, _layout(dp=2))  # 2 ranks of one node: 100 GB/s
    assert acc.dp_s == pytest.approx(2 * 1 / 2 * n * 4 / 100e9 - acc.compute_s / 4 * 2 / 3)
    # zero1 gathers the updated weights after the optimizer step: beside nothing
    assert step_time(cfg, 8, slow_compute, _layout(dp=8, sharding="zero1")).dp_s == pytest.approx(7 / 8 * n * 4 / 10e9)


def test_pipeline_bubble_is_pp_minus_1_over_micro_batches_plus_pp_minus_1():
    step = step_time(_tiny(), 2, SYSTEM, _layout(pp=2, micro=2))  # 8 sequences in 4 micro-batches over 2 stages
    assert step.bubble_s / (step.compute_s + step.bubble_s) == pytest.approx(1 / (4 + 1))
    assert step.pp_s == pytest.approx(2 * 4 * (2 * 256 * 256 * 4) / 100e9)  # both ranks in one node


def test_search_returns_only_fitting_layouts_fastest_first():
    cfg = load_config("tiny", None, ["--data.seq_len", "256", "--train.global_batch", "8"])
    nodes_of_2 = System("test", 100.0, 80.0, 2, 100.0, 10.0, "gpu", 0.5)  # HSDP: sharded over a node's 2 ranks
    everything = search(cfg, 4, nodes_of_2)
    memory = sorted(c.memory_gib for c in everything)
    limit = memory[len(memory) // 2]
    small = System("test", 100.0, limit, 2, 100.0, 10.0, "gpu", 0.5)
    found = search(cfg, 4, small)
    assert found and all(c.memory_gib <= limit for c in found) and len(found) < len(everything)
    assert {c.layout for c in found} == {c.layout for c in everything if c.memory_gib <= limit}
    speeds = [c.step.tokens_per_s for c in found]
    assert speeds == sorted(speeds, reverse=True)
    assert {c.layout.tp for c in everything} == {1, 2} and {c.layout.pp for c in everything} == {1, 2, 4}
    assert {c.layout.name for c in everything} >= {
        "tp 1 x pp 1 x hsdp 2x2",
        "tp 1 x pp 1 x fsdp 4",
        "tp 1 x pp 1 x ddp 4",
    }


def test_calibration_reproduces_its_fitted_rows_and_reports_held_out_ones():
    fitted = efficiencies()
    assert set(fitted) == {"cpu", "gpu", "trainium"} and all(0 < e <= 1 for e in fitted.values())
    rows = errors()
    for run, predicted, error in rows:
        assert error == pytest.approx(predicted / run.tokens_per_s_per_rank - 1)
        if run.fit and sum(r.fit and calibration_group_of(r) == calibration_group_of(run) for r in RUNS) == 1:
            assert abs(error) < 1e-4, run.name  # one fitted row per group: reproduced
    held = [e for r, _, e in rows if not r.fit]
    assert len(held) >= 5 and all(math.isfinite(e) for e in held)
    table = format_calibration()
    assert table.count("held out") == len(held) and f"max {max(abs(e) for e in held):.1%}" in table
    assert all(run.source and run.conditions for run in RUNS)


def test_the_system_is_a_table_row_with_custom_figures_on_top():
    cfg = load_config("hlat-7b")  # bf16-sr: the bf16 peak
    trn1 = make_system("trn1", Figures(inter_gbs=12.5), cfg, 4096)  # a rank per NeuronCore: half a chip
    assert (trn1.peak_tflops, trn1.memory_gib, trn1.per_node, trn1.intra_gbs, trn1.inter_gbs) == (
        95.0,
        16,
        32,
        103.0,
        12.5,
    )
    assert trn1.rank == "1 NeuronCore-v2 (16 GiB; 2 per chip)"
    assert trn1.calibration_group == "trainium" and trn1.efficiency == efficiencies()["trainium"]
    custom = make_system(None, Figures(peak_tflops=400.0, memory_gib=64.0, per_node=8, efficiency=0.5), cfg, 8)
    assert (custom.peak_tflops, custom.memory_gib, custom.efficiency, custom.calibration_group) == (
        400.0,
        64.0,
        0.5,
        "gpu",
    )
    assert make_system(None, Figures(), cfg, 8) is None  # memory only, as before
    with pytest.raises(UserError, match="--peak-tflops and --memory-gib"):
        make_system(None, Figures(peak_tflops=400.0), cfg, 8)
    with pytest.raises(UserError, match="L4: 8 ranks span nodes of 1.*--per-node.*--inter-gbs"):
        make_system("L4", Figures(), cfg, 8)  # a row without node figures
    assert make_system("L4", Figures(per_node=8), cfg, 8).intra_gbs == 0  # one node: nothing crosses the network


def test_forecast_prints_days_and_cost_by_hand():
    step = step_time(_tiny(), 1, SYSTEM, _layout())
    text = format_forecast(step, SYSTEM, 1, budget_tokens=step.tokens_per_s * 86400 * 2, price=10.0)
    assert "in 2 days" in text and "cost at 10.00 per node-hour: 480 " in text  # 2 days x 24 h x 1 node x 10


def test_search_breaks_ties_by_its_stated_rule_and_prints_it():
    """Layouts the model predicts equal (their traffic all hidden) come in TIE_RULE's order."""
    cfg = load_config("tiny", None, ["--data.seq_len", "256", "--train.global_batch", "8"])
    found = search(cfg, 4, System("test", 100.0, 80.0, 2, 100.0, 10.0, "gpu", 0.5))
    fastest = [c for c in found if c.step.tokens_per_s == found[0].step.tokens_per_s]
    assert len(fastest) > 1
    keys = [
        (c.layout.tp * c.layout.pp * c.layout.cp, c.step.issued_comm_s, c.layout.recompute != "none", c.memory_gib)
        for c in fastest
    ]
    assert keys == sorted(keys)
    assert [c.layout.recompute for c in fastest] == ["none", "op"]  # here the rule's third term decides
    table = format_search(found, 3, 1e9, 0.0, 2)
    assert table.endswith(f"{len(fastest)} layouts tie for the fastest prediction; {TIE_RULE}")


def test_the_deterministic_mode_reduces_once_per_micro_batch():
    # dp 2 accumulating 4 micro-batches of 1: the mode's 4 all-reduces move 4 x the default's one;
    # under FSDP2 its 4 reduce-scatters add 3 x the default's one to the same weight gathers
    cfg = dataclasses.replace(_tiny(), train=dataclasses.replace(_tiny().train, micro_batch=1))
    on = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, deterministic=True))
    ddp = [step_time(c, 2, SYSTEM, _layout(dp=2)).dp_issued_s for c in (cfg, on)]
    assert ddp[1] == pytest.approx(4 * ddp[0])
    fsdp = [step_time(c, 2, SYSTEM, _layout(dp=2, sharding="fsdp")).dp_issued_s for c in (cfg, on)]
    assert fsdp[1] - fsdp[0] == pytest.approx(3 * ddp[0] / 2)  # a reduce-scatter moves half an all-reduce


def test_the_deterministic_mode_pays_a_pipeline_bubble_per_micro_batch():
    # pp 2 over 8 micro-batches of 1: 1F1B's bubble is 1/8 of the compute, the mode's 1 (each
    # micro-batch a schedule step of its own)
    cfg = dataclasses.replace(_tiny(), train=dataclasses.replace(_tiny().train, micro_batch=1))
    on = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, deterministic=True))
    default, mode = (step_time(c, 2, SYSTEM, _layout(pp=2, sharding="zero2")) for c in (cfg, on))
    assert mode.bubble_s == pytest.approx(8 * default.bubble_s)
