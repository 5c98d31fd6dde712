"""A checkpoint written where AdamW is foreach (a device with no fused kernel: Neuron, XPU, MPS, any
PrivateUse1 backend) resumes where it is fused (the CPU, CUDA), and the reverse: the loaded param
groups take the loading device's implementation instead of crashing at the first step."""

from __future__ import annotations

import dataclasses
import shutil
from unittest import mock

import pytest

from hlat.cli import main
from hlat.device import record
from runs import tiny_args

STEPS = 3
# fused and foreach AdamW may round differently: measured 0 difference in these losses on an
# AVX-512 CPU (torch 2.13); the bound allows a few fp32 ulps of the loss
RTOL = 1e-6


def _foreach_device():  # type: ignore[no-untyped-def]
    """This process as a device without fused AdamW: the record is all the optimizer asks."""
    return mock.patch.dict(record.RECORDS, cpu=dataclasses.replace(record.RECORDS["cpu"], fused_adamw=False))


def _losses(run) -> list[float]:  # type: ignore[no-untyped-def]
    import json

    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("saved_on, resumed_on", [("foreach", "fused"), ("fused", "foreach")])
def test_a_checkpoint_resumes_across_fused_and_foreach_adamw(small_corpus, tmp_path, saved_on, resumed_on):
    def train(run, steps: int, implementation: str) -> None:  # type: ignore[no-untyped-def]
        args = tiny_args(small_corpus, run, "--train.steps", str(steps), "--checkpoint.every", "2")
        with _foreach_device() if implementation == "foreach" else mock.patch.dict({}):
            assert main(["train", *args]) == 0

    reference = tmp_path / "reference"
    train(reference, STEPS, saved_on)
    run = tmp_path / "resumed"
    shutil.copytree(reference, run, ignore=shutil.ignore_patterns(f"step_{STEPS:08d}"))
    train(run, STEPS, resumed_on)  # resumes from step 2 on the other implementation
    resumed, uninterrupted = _losses(run), _losses(reference)
    assert len(resumed) == STEPS
    assert resumed[:2] == uninterrupted[:2]
    assert resumed[2:] == pytest.approx(uninterrupted[2:], rel=RTOL)
