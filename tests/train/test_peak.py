"""The MFU denominator: the CPU peak formula, the GEMM ceiling's cache, the selection order,
MFU <= 100% in a real run, and the logged MFU of a 4-process run equal to docs/training.md's
tokens/s x FLOPs per token / (peak x world)."""

import json

import pytest
import torch

import hlat.metrics.peak as peak_module
from hlat.accelerators import by_table_name
from hlat.config.load import read_run_config
from hlat.metrics.cpu_peak import MAX_FREQ, CpuFacts, cpu_peak, max_clock_ghz, physical_cores
from hlat.metrics.gemm_ceiling import CACHE_FILE, MAX_AGE_S, cpu_load_note, gemm_ceiling_tflops, model_shapes
from hlat.metrics.peak import resolve_peak, slow_bf16_warning
from hlat.metrics.sinks import read_metrics
from hlat.model import Llama
from hlat.train.trainer import Trainer
from runs import ScenarioResults
from test_resume_layouts import SCENARIOS as LAYOUT_SCENARIOS
from test_trainer import tiny_cfg

TP2XDP2 = "tp2xdp2-straight"  # 4 ranks, train.peak_tflops = 1 (tests/runs.py: tiny_args)
SCENARIOS = [s for s in LAYOUT_SCENARIOS if s.name == TP2XDP2]

CPU = torch.device("cpu")
META = torch.device("meta")


def facts(capability="AVX2", flags=(), ghz=2.3, cores=4) -> CpuFacts:
    return CpuFacts("Test CPU 9000", capability, frozenset(flags), ghz, "max clock from test", cores)


def test_cpu_peak_is_cores_times_flops_per_cycle_times_clock():
    peak = cpu_peak(facts(), threads=2, dtype=torch.float32)
    assert peak.gflops == pytest.approx(2 * 32 * 2.3)
    assert peak.explanation == "2 cores x 32 FLOP/cycle (AVX2 FMA, fp32) x 2.3 GHz (max clock from test)"
    assert cpu_peak(facts(), threads=16, dtype=torch.float32).gflops == pytest.approx(
        4 * 32 * 2.3
    )  # physical cores cap
    assert cpu_peak(facts("AVX512"), 1, torch.float32).gflops == pytest.approx(64 * 2.3)
    # bf16: AMX, then AVX512-BF16 (2 x the AVX-512 fp32 rate), else emulated at the fp32 ceiling.
    assert cpu_peak(facts("AVX512", {"amx_bf16", "avx512_bf16"}), 1, torch.bfloat16).gflops == pytest.approx(1024 * 2.3)
    assert cpu_peak(facts("AVX512", {"avx512_bf16"}), 1, torch.bfloat16).gflops == pytest.approx(128 * 2.3)
    emulated = cpu_peak(facts("AVX2"), 1, torch.bfloat16)
    assert emulated.gflops == pytest.approx(32 * 2.3) and "bf16 emulated in fp32" in emulated.explanation
    assert cpu_peak(facts("ZVECTOR"), 1, torch.float32) is None
    assert cpu_peak(facts(ghz=None), 1, torch.float32) is None


def test_clock_sources_in_order_and_physical_cores():
    cpuinfo = "".join(
        f"processor\t: {i}\nphysical id\t: 0\ncore id\t\t: {i // 2}\ncpu MHz\t\t: 2445.4\n\n" for i in range(4)
    )
    assert max_clock_ghz(cpuinfo, "3500000\n", "CPU max MHz: 3000.0") == (3.5, f"max clock from {MAX_FREQ}")
    assert max_clock_ghz(cpuinfo, "", "CPU max MHz:                     3000.0000\n")[0] == 3.0
    ghz, source = max_clock_ghz(cpuinfo, "", "")
    assert ghz == pytest.approx(2.4454) and "'cpu MHz'" in source
    assert max_clock_ghz("", "", "") == (None, "no clock found")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("os.sched_getaffinity", lambda _: {0, 1, 2, 3})
        assert physical_cores(cpuinfo) == 2  # 4 hyperthreads on 2 cores
        mp.setattr("os.sched_getaffinity", lambda _: {0})
        assert physical_cores(cpuinfo) == 1


def test_gemm_ceiling_is_measured_once_per_key(tmp_path):
    calls = []

    def measure(device, dtype, shape, seconds):
        calls.append(shape)
        return 0.001 * shape[0]

    shapes = model_shapes(64, 128, 32)
    first = gemm_ceiling_tflops(CPU, "Test CPU", torch.float32, shapes, tmp_path, measure=measure)
    assert first == (pytest.approx(0.001 * 1024), False) and len(calls) == len(shapes)
    assert gemm_ceiling_tflops(CPU, "Test CPU", torch.float32, shapes, tmp_path, measure=measure)[1] is True
    assert len(calls) == len(shapes)  # the second call read the cache
    gemm_ceiling_tflops(CPU, "Test CPU", torch.bfloat16, shapes, tmp_path, measure=measure)  # another dtype: a new key
    assert len(calls) == 2 * len(shapes) and len(json.loads((tmp_path / CACHE_FILE).read_text())) == 2
    (tmp_path / CACHE_FILE).write_text("{torn")  # an unreadable cache is measured again, not an error
    assert gemm_ceiling_tflops(CPU, "Test CPU", torch.float32, shapes, tmp_path, measure=measure)[1] is False


def test_gemm_ceiling_is_measured_again_when_a_week_old(tmp_path):
    """A ceiling measured under load must not stand for ever: an entry past MAX_AGE_S, or one from
    a cache file written without times, is measured again and replaced."""
    shapes = model_shapes(64, 128, 32)
    measured = iter([1.0, 2.0, 3.0, 4.0] * 3)
    measure = lambda *args: next(measured)  # noqa: E731
    assert gemm_ceiling_tflops(CPU, "Test CPU", torch.float32, shapes, tmp_path, measure=measure) == (4.0, False)
    path = tmp_path / CACHE_FILE
    ((key, entry),) = json.loads(path.read_text()).items()
    path.write_text(json.dumps({key: {**entry, "measured_at": entry["measured_at"] - MAX_AGE_S + 60}}))
    assert gemm_ceiling_tflops(CPU, "Test CPU", torch.float32, shapes, tmp_path, measure=measure) == (4.0, True)
    path.write_text(json.dumps({key: {"tflops": 0.5, "measured_at": entry["measured_at"] - MAX_AGE_S - 1}}))
    assert gemm_ceiling_tflops(CPU, "Test CPU", torch.float32, shapes, tmp_path, measure=measure) == (4.0, False)
    assert json.loads(path.read_text())[key]["tflops"] == 4.0
    path.write_text(json.dumps({key: 0.5}))  # the format without times: stale
    assert gemm_ceiling_tflops(CPU, "Test CPU", torch.float32, shapes, tmp_path, measure=measure) == (4.0, False)


def test_a_ceiling_measured_under_load_is_used_but_not_kept(tmp_path):
    """A CPU whose load average exceeds its cores times GEMMs low (28 GFLOP/s, 18% of peak, on a
    shared 2-core machine): that figure serves this run and the next start measures again."""
    shapes = model_shapes(64, 128, 32)
    measured = iter([1.0, 2.0, 3.0, 4.0] * 2)
    measure = lambda *args: next(measured)  # noqa: E731
    assert gemm_ceiling_tflops(CPU, "Test CPU", torch.float32, shapes, tmp_path, measure=measure, keep=False) == (
        4.0,
        False,
    )
    assert not (tmp_path / CACHE_FILE).exists()
    assert gemm_ceiling_tflops(CPU, "Test CPU", torch.float32, shapes, tmp_path, measure=measure) == (4.0, False)
    assert cpu_load_note(CPU, (10.2, 9.0, 8.0), 2) == (
        "measured under load (load average 10.2 on 2 cores): not cached, measured again next start"
    )
    assert cpu_load_note(CPU, (2.0, 9.0, 8.0), 2) is None  # its own threads on every core: not loaded
    assert cpu_load_note(torch.device("meta"), (10.2, 9.0, 8.0), 2) is None  # a CPU's cores only


def test_selection_order_override_then_table_then_cpu_formula(tmp_path, monkeypatch):
    def no_measuring(*args, **kwargs):
        raise AssertionError("an override must not measure")

    monkeypatch.setattr(peak_module, "gemm_ceiling_tflops", no_measuring)
    for device in (CPU, torch.device("cuda")):
        override = resolve_peak(device, torch.float32, 2.5, [], tmp_path)
        assert (override.tflops, override.ceiling_tflops, override.warning) == (2.5, None, None)
        assert "set by train.peak_tflops" in override.summary

    monkeypatch.setattr(peak_module, "gemm_ceiling_tflops", lambda *args, **kwargs: (0.1, True))
    # two threads, whatever this process runs with (tests/conftest.py: one): the formula's peak then
    # exceeds the 0.1 TFLOP/s ceiling
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    cpu = resolve_peak(CPU, torch.float32, 0, [], tmp_path, cpu=facts())
    assert cpu.tflops == pytest.approx(min(torch.get_num_threads(), 4) * 32 * 2.3e-3)
    assert "measured GEMM ceiling 100 GFLOP/s" in cpu.summary and cpu.mfu_of_gemm(0.05e12, 1) == pytest.approx(0.5)
    # A ceiling above the formula (a clock read below the boost clock) becomes the peak: MFU stays <= 1.
    monkeypatch.setattr(peak_module, "gemm_ceiling_tflops", lambda *args, **kwargs: (5.0, True))
    faster = resolve_peak(CPU, torch.float32, 0, [], tmp_path, cpu=facts())
    assert faster.tflops == 5.0 and "the measured GEMM ceiling, as it exceeds the theoretical" in faster.summary

    monkeypatch.setattr(peak_module, "gemm_ceiling_tflops", lambda *args, **kwargs: (400.0, True))
    monkeypatch.setattr(peak_module, "accelerator", lambda device: ("NVIDIA L40S", by_table_name("L40S")))
    assert resolve_peak(torch.device("cuda"), torch.bfloat16, 0, [], tmp_path).tflops == 400.0
    monkeypatch.setattr(peak_module, "gemm_ceiling_tflops", lambda *args, **kwargs: (100.0, True))
    bf16 = resolve_peak(torch.device("cuda"), torch.bfloat16, 0, [], tmp_path)
    assert bf16.tflops == 362.1 and "NVIDIA L40S = L40S, dense bf16" in bf16.summary
    monkeypatch.setattr(peak_module, "gemm_ceiling_tflops", lambda *args, **kwargs: (50.0, True))
    assert resolve_peak(torch.device("cuda"), torch.float32, 0, [], tmp_path).tflops == 91.6  # "highest": no TF32


def test_unknown_device_leaves_mfu_empty_with_one_warning(tmp_path, monkeypatch):
    monkeypatch.setattr(peak_module, "accelerator", lambda device: ("NVIDIA GeForce RTX 4090", None))
    peak = resolve_peak(torch.device("cuda"), torch.bfloat16, 0, [], tmp_path)
    assert peak.tflops is None and peak.mfu(1e12, 8) is None and peak.mfu_of_gemm(1e12, 8) is None
    assert "'NVIDIA GeForce RTX 4090'" in peak.warning and "--train.peak_tflops" in peak.warning
    assert "\n" not in peak.warning
    assert resolve_peak(CPU, torch.float32, 0, [], tmp_path, cpu=facts("ZVECTOR")).tflops is None
    monkeypatch.undo()  # a device whose module reports no name (here: none at all)
    assert "no peak FLOP/s known for this meta device" in resolve_peak(META, torch.bfloat16, 0, [], tmp_path).warning


def test_slow_bf16_warning_follows_the_cpu_flags():
    assert slow_bf16_warning(CPU, "mixed", frozenset({"avx2"})).startswith("warning: this CPU has no bf16 instructions")
    assert slow_bf16_warning(CPU, "mixed", frozenset({"avx512_bf16"})) is None
    assert slow_bf16_warning(CPU, "fp32", frozenset()) is None


def test_a_tiny_run_reports_mfu_at_most_one_against_its_stated_peak(small_corpus, tmp_path):
    lines = []
    cfg = tiny_cfg(
        small_corpus, tmp_path / "run", "--train.steps", "2", "--train.peak_tflops", "0", "--eval.every", "0"
    )
    Trainer(cfg, out=lines.append).fit()
    startup = next(line for line in lines if "MFU against" in line)
    assert "FLOP/cycle" in startup and "measured GEMM ceiling" in startup, startup
    records = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert len(records) == 2
    assert all(0 < r["mfu"] <= 1 and 0 < r["mfu_of_gemm"] for r in records), records


def test_the_logged_mfu_is_tokens_per_s_times_flops_per_token_over_peak_times_world(scenarios: ScenarioResults):
    run = read_run_config(scenarios.path(TP2XDP2) / "run")
    cfg, seq_len, world = run.model, run.data.seq_len, SCENARIOS[0].world
    assert world == 4 and run.train.peak_tflops == 1
    params = sum(p.numel() for p in Llama(cfg).parameters())
    # counted here, not by hlat.model.size: 6 x the matmul weights (the input embedding is a lookup)
    # + 12 L d s for QK^T and AV
    flops_per_token = 6 * (params - cfg.vocab_size * cfg.d_model) + 12 * cfg.n_layers * cfg.d_model * seq_len
    records = [r for r in read_metrics(scenarios.path(TP2XDP2) / "run") if "loss" in r]
    assert len(records) == 4
    for r in records:
        assert r["mfu"] == pytest.approx(r["tokens_per_s"] * flops_per_token / (1e12 * world), rel=1e-9), r
