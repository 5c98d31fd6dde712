"""Every parallel layout matches the single-process run: losses, gradient norms and weights.

fp32 on gloo/CPU; tolerances: losses and grad norms 1e-5 relative; weights 2e-5 absolute after
4 AdamW steps at LR 1e-3 (Adam divides by sqrt(v), so near-zero gradient entries turn the
summation-order noise that separates layouts into visible weight differences; 2e-5 is 2% of one
step's largest update).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("parity_worker.py")
REFERENCE = "1,1,1,ddp,1f1b,1,none"

TWO = [
    "1,2,1,ddp,1f1b,1,none",
    "1,2,1,zero1,1f1b,1,none",
    "1,2,1,zero2,1f1b,1,none",
    "1,2,1,fsdp,1f1b,1,selective",
    "1,1,2,ddp,1f1b,1,none",
    "1,1,2,ddp,1f1b,1,full",
    "2,1,1,ddp,1f1b,1,none",
    "2,1,1,ddp,gpipe,1,none",
    "2,1,1,ddp,interleaved-1f1b,2,none",
]
FOUR = [
    "1,2,2,fsdp,1f1b,1,none",
    "2,2,1,zero2,1f1b,1,none",
    "2,2,1,fsdp,1f1b,1,selective",
    "2,1,2,ddp,1f1b,1,none",
    "1,1,4,ddp,1f1b,1,none",  # tp 4 > 2 KV heads: KV projections replicated
]
EIGHT = ["2,2,2,zero2,1f1b,1,none", "1,2,4,fsdp,1f1b,1,none"]  # the second: FSDP over replicated KV projections


def launch(out: Path, nproc: int, specs: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if nproc == 1:
        cmd = [sys.executable, str(WORKER), str(out), *specs]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(WORKER), str(out), *specs]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]


def results(out: Path, spec: str) -> tuple[dict, dict]:
    tag = spec.replace(",", "_")
    weights: dict[str, torch.Tensor] = {}
    for file in sorted(out.glob(f"{tag}.rank*.pt")):
        weights.update(torch.load(file, weights_only=True))
    return json.loads((out / f"{tag}.json").read_text()), weights


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    launch(out, 1, [REFERENCE])
    return results(out, REFERENCE)


def check(reference, out: Path, spec: str) -> None:
    (ref_metrics, ref_weights), (metrics, weights) = reference, results(out, spec)
    assert metrics["losses"] == pytest.approx(ref_metrics["losses"], rel=1e-5), spec
    assert metrics["grad_norms"] == pytest.approx(ref_metrics["grad_norms"], rel=1e-5), spec
    assert weights.keys() == ref_weights.keys(), spec
    for name, value in ref_weights.items():
        torch.testing.assert_close(weights[name], value, rtol=0, atol=2e-5, msg=f"{spec}: {name}")


@pytest.mark.parametrize("nproc, specs", [(2, TWO), (4, FOUR)], ids=["2-proc", "4-proc"])
def test_layouts_match_single_process(reference, tmp_path, nproc, specs):
    launch(tmp_path, nproc, specs)
    for spec in specs:
        check(reference, tmp_path, spec)


def test_eight_processes(reference, tmp_path):
    launch(tmp_path, 8, EIGHT)
    for spec in EIGHT:
        check(reference, tmp_path, spec)
