"""precision.float8: torchao's float8 linears on the transformer blocks, and the refusal elsewhere."""

import copy

import pytest
import torch

from deps import require
from hlat.config.layout import Degrees
from hlat.config.load import load_config
from hlat.config.model import ModelConfig
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.errors import ConfigError
from hlat.float8 import check_float8, convert_to_float8, float8_line
from hlat.model import Llama
from hlat.model.llama import Linear
from hlat.parallel.mesh import Layout
from hlat.parallel.parallelize import build_parallel_model

CFG = ModelConfig(vocab_size=200, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=176, max_seq_len=32)


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return ((a.float() - ref).norm() / ref.norm()).item()


def test_block_linears_convert_and_match_bf16_numerics():
    require("torchao")
    torch.manual_seed(0)
    ref = Llama(CFG)
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.05)
    f8 = copy.deepcopy(ref)
    # 7 linears per block; the output head stays a plain Linear; parameter names are unchanged,
    # so checkpoints load either way.
    assert convert_to_float8(f8) == 7 * CFG.n_layers
    assert type(f8.output) is Linear  # the head stays unconverted
    assert f8.state_dict().keys() == ref.state_dict().keys()

    tokens = torch.randint(0, CFG.vocab_size, (2, 32))
    exact = ref(tokens)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = ref(tokens)
    out = f8(tokens)
    # Measured here: logits 0.0037 relative L2 from fp32 for float8, 0.0028 for bf16 autocast.
    assert _rel(bf16, exact) < 0.01
    assert _rel(out, exact) < 0.02
    out.float().square().mean().backward()
    exact.square().mean().backward()
    # Gradients pass through e5m2 (2 mantissa bits): measured at most 0.10 relative per tensor.
    for (name, p), q in zip(f8.named_parameters(), ref.parameters()):
        assert _rel(p.grad, q.grad) < 0.25, name


def test_trainer_path_converts_before_recompute_and_initialises_the_same(monkeypatch):
    require("torchao")
    import hlat.parallel.parallelize as parallelize

    monkeypatch.setattr(parallelize, "check_float8", lambda *args: None)  # let the CPU through
    layout, cpu = Layout(1, 0, Degrees(), None), torch.device("cpu")
    plain = build_parallel_model(
        CFG,
        parallel=ParallelConfig(activation_checkpoint="full"),
        layout=layout,
        device=cpu,
        seed=0,
        n_microbatches=1,
        precision=PrecisionConfig(mode="fp32"),
    )
    f8 = build_parallel_model(
        CFG,
        parallel=ParallelConfig(activation_checkpoint="full"),
        layout=layout,
        device=cpu,
        seed=0,
        n_microbatches=1,
        precision=PrecisionConfig(mode="fp32"),
        float8=True,
    )
    assert sum(type(m).__name__ == "Float8Linear" for m in f8.raw_parts[0].modules()) == 7 * CFG.n_layers
    for (name, a), (_, b) in zip(plain.raw_parts[0].named_parameters(), f8.raw_parts[0].named_parameters()):
        assert torch.equal(a, b), name  # same names, same seeded initialisation
    tokens = torch.randint(0, CFG.vocab_size, (2, 32))
    loss = f8.raw_parts[0](tokens).float().square().mean()
    loss.backward()  # through the recompute wrapper
    assert all(p.grad is not None and p.grad.isfinite().all() for p in f8.raw_parts[0].parameters())


def test_tensor_parallel_converts_what_each_rank_can_multiply():
    require("torchao")
    from torch.distributed.tensor.parallel import PrepareModuleInput, RowwiseParallel

    from hlat.model.spec import model_spec
    from hlat.parallel.tensor_parallel import _STYLES, _float8_styles

    with torch.device("meta"):
        model = Llama(CFG)
    # ffn_dim 176 is a multiple of 16, its tp 2 shards (88) are not, which _scaled_mm refuses on
    # GPUs: under tp 2 the feed-forward stays in the mode's dtype and the attention converts
    assert convert_to_float8(copy.deepcopy(model)) == 7 * CFG.n_layers
    assert convert_to_float8(model, tp=2) == 4 * CFG.n_layers
    block, plan = model.layers["0"], model_spec(CFG).tensor_parallel
    styles = _float8_styles(block, plan, {name: _STYLES[role](CFG, 2) for name, role in plan.items()})
    # the attention's input gathered in float8 for wq, wk and wv; the feed-forward's in the mode's dtype
    assert {name: type(styles[name]).__name__ for name in ("attention", "attention.wq", "attention.wo")} == {
        "attention": "PrepareFloat8ModuleInput",
        "attention.wq": "Float8ColwiseParallel",
        "attention.wo": "Float8RowwiseParallel",
    }
    assert type(styles["feed_forward"]) is PrepareModuleInput and type(styles["feed_forward.w2"]) is RowwiseParallel


def test_refused_without_float8_matmuls(monkeypatch):
    with pytest.raises(ConfigError, match=r"precision\.float8: .*this run is on cpu.*--precision\.float8 false"):
        check_float8(torch.device("cpu"))
    with pytest.raises(ConfigError, match=r"precision\.float8: .*on xla"):
        check_float8(torch.device("xla"))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    with pytest.raises(ConfigError, match=r"A100-SXM4-80GB has CUDA capability 8\.0, and float8 matmuls need >= 8\.9"):
        check_float8(torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    check_float8(torch.device("cuda", 0), tp=2, n_kv_heads=2)  # KV heads split over tp: torchao's float8 styles
    # more tp ranks than KV heads replicates wk and wv, which have no float8 form
    with pytest.raises(
        ConfigError,
        match=r"precision\.float8: parallel\.tp 4 > model\.n_kv_heads 2 replicates the KV projections.*"
        r"--parallel\.tp to at most 2 or --precision\.float8 false",
    ):
        check_float8(torch.device("cuda", 0), tp=4, n_kv_heads=2)
    # The trainer's path refuses before any model is built.
    with pytest.raises(ConfigError, match=r"precision\.float8"):
        build_parallel_model(
            CFG,
            parallel=ParallelConfig(),
            layout=Layout(1, 0, Degrees(), None),
            device=torch.device("cpu"),
            seed=0,
            n_microbatches=1,
            precision=PrecisionConfig(mode="fp32"),
            float8=True,
        )


def test_narrow_blocks_keep_the_modes_dtype():
    assert float8_line(4096, 4096) is None
    assert float8_line(2048, 0) is None
    assert float8_line(2048, 4096) == (
        "float8: off (model.d_model 2048 < precision.float8_min_d_model 4096: narrow blocks gain less than "
        "float8's casts cost); --precision.float8_min_d_model 0 converts them"
    )


def _trainer_start(*overrides: str) -> list[str]:
    """The trainer's start-up lines up to building the data (where this stops it)."""
    import hlat.train.build as build_module
    import hlat.train.trainer as trainer_module

    lines: list[str] = []

    def stop(*args):  # type: ignore[no-untyped-def]
        raise RuntimeError("stop")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(build_module, "_tokenizer", stop)
        cfg = load_config("tiny", overrides=["--train.device", "cpu", "--precision.float8", "true", *overrides])
        with pytest.raises(RuntimeError, match="stop"):
            trainer_module.Trainer(cfg, resume="fresh", out=lines.append)
    return lines


def test_the_trainer_applies_the_width_threshold():
    assert any(
        line.startswith("float8: off (model.d_model 256 < precision.float8_min_d_model 4096")
        for line in _trainer_start()
    )
    with pytest.raises(ConfigError, match=r"precision\.float8: .*this run is on cpu"):
        _trainer_start("--precision.float8_min_d_model", "0")  # converts: refused on the CPU


def test_a_negative_threshold_names_the_field():
    with pytest.raises(ConfigError, match=r"precision\.float8_min_d_model: must be >= 0"):
        load_config("tiny", overrides=["--precision.float8_min_d_model", "-1"])
