"""parallel.compile: the setting's values and the start-up decision (probe, fallback, torch's own
switch, tensor parallelism). Compiled training against eager and the golden trajectory of the
default path: tests/train/test_golden.py.

The suite runs eager (tests/conftest.py sets TORCH_COMPILE_DISABLE=1); the tests that compile ask
for the `compiling` fixture.
"""

import dataclasses
from pathlib import Path

import pytest
import torch

from hlat.config.data import DataConfig
from hlat.config.load import load_config
from hlat.config.model import ModelConfig
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.config.train import TrainConfig
from hlat.errors import ConfigError, UserError
from hlat.parallel import compile as compile_mod
from hlat.parallel.compile import decide_compile
from hlat.train.trainer import Trainer
from parallel.parity_worker import Case
from runs import Scenario, tiny_args
from test_parity import SCENARIOS as PARITY_SCENARIOS
from test_parity import check, references, results

CPU = torch.device("cpu")
MODEL = ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=64)


def decide(setting: str, device: torch.device = CPU, tp: int = 1, recompute: str = "none"):
    return decide_compile(
        model=MODEL,
        parallel=ParallelConfig(compile=setting, tp=tp, activation_checkpoint=recompute),
        precision=PrecisionConfig(mode="fp32"),
        train=TrainConfig(micro_batch=2),
        data=DataConfig(seq_len=32, document_masking=False),
        device=device,
    )


@pytest.mark.parametrize(
    ("given", "stored"), [("auto", "auto"), ("true", "true"), ("off", "false"), ("1", "true"), ("False", "false")]
)
def test_command_line_words(given, stored):
    assert load_config("tiny", None, ["--parallel.compile", given]).parallel.compile == stored


def test_toml_booleans_and_default(tmp_path: Path):
    assert load_config("tiny").parallel.compile == "auto"
    for value, stored in (("true", "true"), ("false", "false"), ('"auto"', "auto")):
        (tmp_path / "c.toml").write_text(f"[parallel]\ncompile = {value}\n")
        assert load_config(None, tmp_path / "c.toml").parallel.compile == stored


def test_other_values_name_the_field_and_choices():
    with pytest.raises(ConfigError, match=r"parallel\.compile: got 'maybe'; choose one of auto, true, false"):
        load_config("tiny", None, ["--parallel.compile", "maybe"])


def test_torch_switch_wins():
    """Without the `compiling` fixture torch.compile is disabled: auto and true both run eager, and say why."""
    for setting in ("auto", "true"):
        decision = decide(setting)
        assert not decision.enabled and "TORCH_COMPILE_DISABLE=1" in decision.line
    assert decide("false").line == "compile: off (parallel.compile false)"


def test_no_compile_backend(compiling):
    assert decide("auto", torch.device("meta")).line == "compile: off (auto: no compile backend for meta)"
    with pytest.raises(UserError, match="no torch.compile backend for device 'meta'; set --parallel.compile false"):
        decide("true", torch.device("meta"))


def test_tensor_parallel_compiles_without_recompute(compiling, monkeypatch):
    """TP blocks compile where the device record says its compiler trains them (the CPU's: the
    parity scenario below), without recompute (hlat.parallel.compile.TP_RECOMPUTE_UNSUPPORTED);
    elsewhere auto runs eager and true is refused, each naming why."""
    monkeypatch.setattr(compile_mod, "probe_block", lambda **_: None)  # the probe's own tests are below
    assert decide("auto", tp=2).enabled
    for recompute in ("selective", "full"):
        assert "do not compile on this torch" in decide("auto", tp=2, recompute=recompute).line
        with pytest.raises(
            UserError, match=r"parallel\.compile=true with parallel\.tp=2: tensor-parallel blocks with recompute"
        ):
            decide("true", tp=2, recompute=recompute)
    no_tp = torch.device("meta")  # a device whose record has not shown compiled TP
    assert "not yet shown to compile tensor-parallel blocks" in decide("auto", no_tp, tp=2).line
    with pytest.raises(UserError, match=r"set --parallel\.compile false \(or auto, which runs such layouts eager\)"):
        decide("true", no_tp, tp=2)


def test_bf16_storage_compiles_with_recompute(compiling):
    """HLAT 7B's recipe on a CPU: bf16-sr (bf16 weights, fp32 compute) with a recompute policy. The
    weights' upcast is the model's own code (hlat.model.llama.Linear), so the compiled recompute
    region holds it; the compiled block computes what the eager one does. The failure this guards
    against ("expected m1 and m2 to have the same dtype") is raised while the region is traced,
    before any backend runs, so aot_eager (the traced forward and backward graphs, replayed) finds
    it at a tenth of inductor's cost from a cold cache (about 6 CPU-seconds against 57, most of
    them compiling the bf16 kernels in C++)."""
    from torch import nn

    from hlat.model.llama import TransformerBlock, rope_tables
    from hlat.parallel.activation_checkpoint import checkpoint_block
    from hlat.precision import autocast, cast_parameters

    recompute = "selective"
    torch.manual_seed(0)
    block = cast_parameters(TransformerBlock(MODEL), "bf16-sr")
    with torch.no_grad():
        for param in block.parameters():
            param.normal_(0, 0.02) if param.ndim > 1 else param.fill_(1.0)
    cos, sin = (t[None, :32, None] for t in rope_tables(MODEL))
    table = nn.Parameter(torch.randn(16, MODEL.d_model, dtype=torch.bfloat16))
    ids = torch.randint(0, 16, (2, 32))
    results = []
    for wrapped in (
        checkpoint_block(block, recompute),
        torch.compile(checkpoint_block(block, recompute, compiled=True), fullgraph=True, backend="aot_eager"),
    ):
        block.zero_grad()
        with autocast("bf16-sr", CPU):
            x = nn.functional.embedding(ids, table).detach().requires_grad_()
            out = wrapped(x, cos, sin, None)
            out.sum().backward()
        results.append((out.detach(), x.grad, [p.grad.float() for p in block.parameters()]))
    (eager, eager_x, eager_grads), (compiled, compiled_x, compiled_grads) = results
    assert compiled.dtype == torch.float32  # fp32 compute from bf16 weights
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled_x, eager_x, rtol=1e-5, atol=1e-5)
    for a, b in zip(compiled_grads, eager_grads):  # bf16 gradients: equal up to one rounding
        torch.testing.assert_close(a, b, rtol=2**-7, atol=1e-6)


def test_failed_probe_falls_back_with_one_warning(compiling, monkeypatch, small_corpus, tmp_path):
    def broken(*args, **kwargs):
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\nsecond line")

    monkeypatch.setattr(compile_mod, "probe_block", broken)
    with pytest.raises(
        UserError,
        match=r"compiling a transformer block failed: RuntimeError: InvalidCxxCompiler: "
        r"No working C\+\+ compiler found; set --parallel.compile false",
    ):
        decide("true")
    lines: list[str] = []
    trainer = Trainer(
        load_config(None, None, tiny_args(small_corpus, tmp_path / "run", "--train.steps", "1")), out=lines.append
    )
    compile_lines = [line for line in lines if "compile" in line]
    assert compile_lines == [
        "compile probe: one transformer block through torch.compile (inductor) ...",  # its start line
        "warning: compile: torch.compile failed (RuntimeError: InvalidCxxCompiler: No working C++ "
        "compiler found); running eager",
    ]
    assert not any(
        isinstance(b, torch._dynamo.eval_frame.OptimizedModule) for b in trainer.model.raw_parts[0].layers.values()
    )
    assert len(trainer.fit().losses) == 1


# Compiled layouts against the eager single-process run of tests/parallel/test_parity.py, at the
# eager layouts' tolerances: FSDP2 with HLAT's selective recompute, and pipeline stages with op-level
# recompute. What a layout can break is dynamo's fullgraph capture and AOT autograd around FSDP2's
# hooks, pipeline stages and recompute wrappers, so the blocks are captured with the aot_eager
# backend: the same graphs without inductor's code generation, whose numerics against eager
# test_golden.py checks step by step. (With inductor the scenario took 34-40 s of the shared
# launch from an empty compiler cache, 7 s with aot_eager; run with inductor it matched too:
# losses 1e-7 relative, weights 7e-6 apart.) Tensor parallel with sequence parallel, no recompute:
# the first block's input is the embedding's reduce-scatter, which must reach it as a plain tensor
# (hlat.parallel.tensor_parallel.VocabParallelEmbedding; without it backward fails; with inductor
# it matched: gradients 1.3e-8 apart). Context parallel: the ring operator (hlat::ring_attention)
# inside the compiled block, captured by its fake implementations (their strides must be the real
# outputs'), with and without selective recompute saving its output (run with inductor it matched
# too: losses 1e-7 relative, weights 9e-6 apart; 49 s from an empty compiler cache).
COMPILED = [
    Case(dp=2, dp_sharding="fsdp", recompute="selective"),
    Case(pp=2, recompute="op"),
    Case(cp=2),
    Case(cp=2, recompute="selective", variant="documents"),
    Case(tp=2),
]
SCENARIOS = [
    next(s for s in PARITY_SCENARIOS if s.name == "parity-1"),  # the eager reference
    Scenario(
        "parity-compiled-2",
        "parallel/parity_worker.py:layouts",
        2,
        {"cases": [dataclasses.asdict(c) for c in COMPILED], "backend": "aot_eager"},
    ),
]


def test_compiled_layouts_match_eager_single_process(scenarios):
    reference = references(scenarios)
    for case in COMPILED:
        assert results(scenarios.path("parity-compiled-2"), case)[0]["graphs"] > 0, f"{case.id}: nothing was compiled"
        check(reference, scenarios.path("parity-compiled-2"), case)
