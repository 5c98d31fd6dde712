"""hlat plan counts the speed switches on the device it plans for: the GPU layout, what selective
recompute does with fused attention, the blocks float8 converts, mixed's bf16 casts per step."""

from __future__ import annotations

from hlat.config.load import load_config
from hlat.planning.forecast import Figures, make_system
from hlat.planning.switches import attention_saved_bytes, format_switches

NO_FIGURES = Figures(None, None, None, None, None, None)


def _switches(preset: str, world: int, device: str, *overrides: str) -> str:
    cfg = load_config(preset, overrides=list(overrides), world=world)
    return format_switches(cfg, world, make_system(device, NO_FIGURES, cfg, world))


def test_on_gpus_the_layout_and_saved_attention_are_counted():
    text = _switches("llama3.1-8b", 8, "H200", "--precision.float8", "true")
    assert "layout: parallel.device_layout auto runs tp 1, zero2" in text
    # counted on the layout training runs there: tp 1, so each rank saves all 32 heads' attention
    assert "selective: fused attention saved, 2.03 GiB per rank, instead of replaying 2.15 GFLOP/token" in text
    assert "float8: on; 32 of 32 blocks at least precision.float8_min_d_model 4096 wide" in text
    assert "bf16 weight casts per step: 64 per weight (64 micro-batches)" in text  # dp 8 at tp 1


def test_elsewhere_the_configured_layout_and_replayed_attention():
    text = _switches("hlat-7b", 64, "trn1", "--precision.float8_min_d_model", "8192")
    assert "layout: as configured (tp 8)" in text
    assert "selective: fused attention replayed in backward, 1.07 GFLOP/token" in text
    assert "float8: off (precision.float8 false); 0 of 32 blocks" in text and "no float8 matmuls" in text
    assert "bf16 weight casts" not in text  # bf16-sr stores bf16 weights: nothing to cast


def test_the_cache_casts_once_per_step():
    text = _switches("1b", 1, "H100 SXM", "--precision.bf16_weight_cache", "true")
    assert "bf16 weight casts per step: 1 per weight (128 micro-batches, precision.bf16_weight_cache)" in text


def test_saved_attention_bytes():
    cfg = load_config("hlat-7b", world=64)  # 32 heads of 128, bf16-sr computes in bf16 on accelerators
    assert attention_saved_bytes(cfg) == (4096 * 2 + 32 * 4) * 4096 * 1 * 32 / 8
