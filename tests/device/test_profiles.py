"""Each profile of the simulated device (tests/device/profiles.py) trains, resumes, generates and
runs DDP and FSDP2 on two processes with the CPU's numbers, evaluates with its log-likelihoods, and a checkpoint moves between every
pair of {cpu, cuda-like, neuron-like}: fused AdamW state (the CPU's, CUDA's) resumed by foreach
(Neuron's) and back.

cuda-like runs the CPU's fused AdamW kernel but CUDA's choice of attention kernel (in fp32 the math
path for the tiny model's grouped-query attention, where the CPU runs its flash kernel; CUDA's cuDNN
operator in bf16, first on an H100); neuron-like runs
foreach AdamW, whose rounding differs from the fused kernel's in the last bits: both asserted
within 1e-6 relative of the CPU's losses."""

from __future__ import annotations

import io
import json
import shutil
from collections import Counter
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from device import profiles, simulated_device
from device.device_runs import train_here
from device.test_distributed_on_device import LAYOUTS
from device.test_distributed_on_device import SCENARIOS as CPU_SCENARIOS
from eval.task_files import write_tiny_tasks
from hlat.cli import main
from hlat.config.model import ModelConfig
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.data.batch import Batch, labels_for
from hlat.parallel.mesh import setup
from hlat.parallel.parallelize import build_parallel_model, global_target_count
from runs import Scenario, ScenarioResults

simulated_device.register()
STEPS = 4
HALF = "--checkpoint.every", "2"  # each run also saves step 2: the checkpoint the resumes start from
DEVICES = {"cpu": ("cpu", ""), **{name: (simulated_device.TYPE, name) for name in profiles.PROFILES}}
PAIRS = [(a, b) for a in DEVICES for b in DEVICES if a != b]
SCENARIOS = [s for s in CPU_SCENARIOS if s.name.endswith("-cpu")] + [
    Scenario(
        f"profile-{layout}-{name}",
        "device/device_runs.py:train",
        2,
        {"device": f"{simulated_device.TYPE}:0", "steps": 2, "extra": args, "profile": name},
        simulated_device.TYPE,
    )
    for layout, args in LAYOUTS.items()
    for name in profiles.PROFILES
]


def close(a: list[float], b: list[float], rel: float = 1e-6) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= rel * abs(y) for x, y in zip(a, b, strict=True))


@pytest.fixture(scope="module")
def uninterrupted(small_corpus, tmp_path_factory) -> dict[str, tuple[Path, list[float]]]:
    """Per device: the run directory of STEPS uninterrupted steps (checkpoints at 2 and STEPS) and its losses."""
    runs = {}
    for name, (device, profile) in DEVICES.items():
        run = tmp_path_factory.mktemp("uninterrupted") / name
        runs[name] = run, train_here(small_corpus, run, device, STEPS, *HALF, profile=profile)
    return runs


def test_each_profile_trains_as_the_cpu(uninterrupted):
    cpu = uninterrupted["cpu"][1]
    assert len(cpu) == STEPS
    assert close(uninterrupted["cuda-like"][1], cpu)  # CUDA's attention kernel choice
    assert close(uninterrupted["neuron-like"][1], cpu)  # foreach against fused


@pytest.mark.parametrize(("source", "target"), PAIRS, ids=[f"{a}-to-{b}" for a, b in PAIRS])
def test_a_checkpoint_moves_between_profiles(source, target, uninterrupted, small_corpus, tmp_path):
    """Step 2's checkpoint of the run on `source`, resumed to STEPS on `target` as a user would."""
    saved, losses = uninterrupted[source]
    run = tmp_path / "resumed"
    shutil.copytree(saved, run, ignore=shutil.ignore_patterns(f"step_{STEPS:08d}"))
    device, profile = DEVICES[target]
    resumed = train_here(small_corpus, run, device, STEPS, *HALF, resume="require", profile=profile)
    assert resumed[:2] == losses[:2]  # the source's own steps, kept
    assert close(resumed, losses)  # and the target's continue them


def test_each_profile_evaluates_and_generates_as_the_cpu(uninterrupted, tmp_path):
    """`hlat eval` (every example's log-likelihoods) and greedy `hlat generate` from the cuda-like
    run's checkpoint on each device."""
    run, _ = uninterrupted["cuda-like"]
    run = run / "checkpoints" / f"step_{STEPS:08d}"  # one checkpoint (a run directory would be swept)
    tasks = write_tiny_tasks(tmp_path / "tasks")
    results = {}
    for name, (device, profile) in DEVICES.items():
        out, text = tmp_path / f"eval-{name}", io.StringIO()
        evaluate = ["eval", "--checkpoint", str(run), "--tasks", "arc_easy,perplexity", "--data-dir", str(tasks),
                    "--output", str(out), "--device", device, "--log-samples"]  # fmt: skip
        generate = [
            "generate",
            "--checkpoint",
            str(run),
            "--prompt",
            "def ",
            "--max-new-tokens",
            "12",
            "--device",
            device,
        ]
        with profiles.profile(profiles.PROFILES[profile]) if profile else simulated_device.present():
            assert main(evaluate) == 0, name
            with redirect_stdout(text):
                assert main(generate) == 0, name
        samples = [
            json.loads(line) for task in ("arc_easy", "perplexity") for line in (out / f"samples_{task}.jsonl").open()
        ]
        generated = [line for line in text.getvalue().splitlines() if "tokens/s" not in line]  # not the timing
        results[name] = samples, generated
    assert results["neuron-like"] == results["cpu"]  # the CPU's attention kernel: the same numbers
    # cuda-like runs CUDA's kernel choice (the math path for grouped-query attention): its scores
    # agree to rounding; it generates (a near-tie may pick another greedy token than the CPU's)
    (cuda, text), (cpu, cpu_text) = results["cuda-like"], results["cpu"]
    assert cpu_text != [] and len(text) == len(cpu_text) and text[0].startswith("def ")
    for got, want in zip(cuda, cpu, strict=True):  # the scores' floats to rounding, the rest exactly
        assert got.keys() == want.keys()
        for key, value in want.items():
            assert got[key] == (pytest.approx(value, rel=1e-5) if key.startswith("loglikelihood") else value), key


@pytest.mark.parametrize("layout", LAYOUTS)
def test_two_processes_on_each_profile_give_the_cpu_losses(scenarios: ScenarioResults, layout: str) -> None:
    cpu = scenarios.json(f"device-{layout}-cpu", "summary.rank0.json")["losses"]  # foreach AdamW
    for name in profiles.PROFILES:
        summary = scenarios.json(f"profile-{layout}-{name}", "summary.rank0.json")
        assert f"on 2 x {simulated_device.TYPE} (pp 1 x dp 2 x tp 1, {layout})" in " ".join(summary["messages"])
        losses = summary["losses"]
        assert losses == cpu if name == "neuron-like" else close(losses, cpu), (name, losses, cpu)


@pytest.mark.parametrize(("recompute_attention", "calls"), [("auto", 1), ("true", 2)])
@pytest.mark.parametrize(
    ("mode", "kv_heads", "attention", "operator"),
    [
        ("fp32", 4, "auto", "_scaled_dot_product_efficient_attention"),
        ("mixed", 2, "auto", "_scaled_dot_product_cudnn_attention"),
        ("mixed", 2, "flash", "_scaled_dot_product_flash_attention"),
    ],
)
def test_selective_saves_cudas_fused_attention(recompute_attention, calls, mode, kv_heads, attention, operator):
    """`selective` on the cuda-like profile saves the fused operator's output (its record's
    recompute_fused_attention false, as CUDA's): one forward call per layer and step; replayed
    with parallel.recompute_attention true: two. In fp32, multi-head attention, which CUDA's
    memory-efficient kernel takes; in mixed (bf16), grouped-query attention, which its cuDNN one
    takes on an H100 (first there), and its flash one under train.attention_backend flash."""
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=kv_heads, ffn_dim=64, max_seq_len=32)
    par = ParallelConfig(activation_checkpoint="selective", recompute_attention=recompute_attention)
    counted: Counter[str] = Counter()
    with profiles.profile(profiles.CUDA_LIKE), profiles.counted_kernels(counted):
        device = torch.device(simulated_device.TYPE)
        model = build_parallel_model(
            cfg, parallel=par, layout=setup(par, device), device=device, seed=0, n_microbatches=1,
            precision=PrecisionConfig(mode=mode), attention=attention,
        )  # fmt: skip
        tokens = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(0))
        batches = [Batch(tokens, labels_for(tokens)).to(device)]
        model.forward_backward(batches, global_target_count(batches, model.layout))
    assert counted[operator] == calls * cfg.n_layers
    assert counted[f"{operator}_backward"] == cfg.n_layers


def test_cudas_flash_operator_keeps_its_contract_and_computes_attention():
    """The profile's flash operator: bf16 grouped-query attention (4 query heads over 2 K/V heads)
    within bf16's rounding of fp32 attention of the same values on the CPU, forward and backward,
    with its outputs laid out as CUDA's; fp32 inputs refused as CUDA's kernel refuses them."""
    gen = torch.Generator().manual_seed(0)
    q, k, v, weights = (torch.randn(2, h, 16, 8, generator=gen).bfloat16().float() for h in (4, 2, 2, 4))
    want = [t.clone().requires_grad_() for t in (q, k, v)]
    reference = F.scaled_dot_product_attention(*want, is_causal=True, enable_gqa=True)
    (reference * weights).sum().backward()
    with profiles.profile(profiles.CUDA_LIKE):
        device = torch.device(simulated_device.TYPE)
        got = [t.to(device, torch.bfloat16).requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*got, is_causal=True, enable_gqa=True)
        (out.float() * weights.to(device)).sum().backward()
        raw = torch.ops.aten._scaled_dot_product_flash_attention(*(t.detach() for t in got), 0.0, True)
        with pytest.raises(RuntimeError, match="FlashAttention only support fp16 and bf16"):
            torch.ops.aten._scaled_dot_product_flash_attention(*(t.detach().float() for t in got), 0.0, True)
    # one rounding to bf16's 8 bits; the backward reads the bf16 output (as CUDA's does), whose
    # rounding its row sums then cancel: within that rounding of the largest gradient
    torch.testing.assert_close(out.float().cpu(), reference.detach(), rtol=2**-7, atol=1e-3)
    for mine, theirs in zip(got, want):
        torch.testing.assert_close(mine.grad.float().cpu(), theirs.grad, rtol=0, atol=2**-7 * theirs.grad.abs().max())
    lse, lengths = raw[1], raw[4:6]
    assert lse.shape == (2, 4, 16) and lse.dtype == torch.float32 and lengths == (16, 16)
    assert raw[0].transpose(1, 2).is_contiguous()  # [B, M, H, D] in memory
