"""benchmarks/gpu_check.sh: its CPU dry run runs every stage and writes the three files; the
script finds python3 where there is no python."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
STAGES = ["env", "parity", "throughput", "switches", "end_to_end"]


def test_cpu_dry_run_reports_every_stage(tmp_path: Path) -> None:
    """Every stage at toy sizes, exactly as docs/parallelism.md gives the command: compiled checks
    compile (aot_eager, the suite's TORCH_COMPILE_DISABLE is not passed on) with the driver's cold
    compiler cache; 19-31 s on 2 loaded cores."""
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "TORCH_COMPILE_DISABLE"} | {"PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", str(SCRIPT), "--cpu-dry-run", str(out)], env=env, capture_output=True, text=True, timeout=170
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check.jsonl", "gpu_check.md", "gpu_check_logs.tar.gz"]
    rows = [json.loads(line) for line in (out / "gpu_check.jsonl").read_text().splitlines()]
    stages = {r["stage"]: r["status"] for r in rows if r["check"] == "stage"}
    assert stages == dict.fromkeys(STAGES, "ok")
    checks = [r for r in rows if r["check"] != "stage"]
    assert {r["stage"] for r in checks} == set(STAGES)
    # on a CPU only float8 cannot run, and says why; every other check passed its tolerance
    float8 = {"float8_compiled", "1b_float8_compiled", "7b_4layers_float8_compiled"}
    assert {r["check"] for r in checks if r["status"] != "ok"} == float8
    assert all(r["status"] == "skip" and "CUDA" in r["error"] for r in checks if "float8" in r["check"])
    by_check = {r["check"]: r for r in checks}
    for switch in ("1b_selective_attention_saved_eager", "1b_bf16_cache_eager", "1b_autotune_compiled"):
        assert by_check[switch]["agrees"], switch  # measured against its "off" row, on the same batch
    for mode in ("fp32_3_steps", "mixed_3_steps_compiled", "bf16-sr_3_steps_compiled"):
        assert len(by_check[mode]["losses"]) == 3, mode  # three optimizer steps against the CPU's fp32
    assert all(r["compiled"] for r in checks if r["check"].endswith("_compiled") and "float8" not in r["check"])
    # 1b is timed at gradient accumulation: the dry run's 2 micro-batches a step against one
    assert by_check["1b_eager"]["tokens_per_step"] == 2 * by_check["1b_selective_eager"]["tokens_per_step"]
    rings = [r for r in checks if r["check"].startswith("ring_two_chunks_")]
    assert len(rings) == 4 and all(r["kernel"] == "flash_cpu" for r in rings)
    backends = by_check["sdpa_backends_1b"]
    assert isinstance(backends["auto"], float) and isinstance(backends["math"], float)  # the CPU's backends, timed
    report = (out / "gpu_check.md").read_text()
    assert "CPU DRY RUN" in report and all(f"## {stage}: ok" in report for stage in STAGES)
    with tarfile.open(out / "gpu_check_logs.tar.gz") as archive:
        assert sorted(archive.getnames()) == ["logs", *(f"logs/{s}.log" for s in sorted(STAGES))]


def test_the_script_finds_python3_without_python(tmp_path: Path) -> None:
    only_python3 = tmp_path / "bin"
    only_python3.mkdir()
    (only_python3 / "python3").symlink_to(sys.executable)
    env = {"PATH": str(only_python3), "HOME": str(tmp_path)}
    done = subprocess.run(["/bin/bash", str(SCRIPT), "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "--cpu-dry-run" in done.stdout
    (only_python3 / "python3").unlink()
    done = subprocess.run(["/bin/bash", str(SCRIPT), "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "neither python3 nor python" in done.stderr
