import pytest
import torch

from hlat.config import load_config
from hlat.errors import ConfigError
from hlat.model import Llama, ModelConfig
from hlat.optim import OptimConfig, build_adamw
from hlat.parallel.loss import token_loss_sum
from hlat.precision import EmulatedBf16Compute, autocast, bf16_rounding, cast_parameters, compute_dtype, state_bytes_per_param
from hlat.train.trainer import Trainer
from test_trainer import quiet, tiny_cfg

CFG = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=16)
CPU = torch.device("cpu")


def test_mode_table():
    assert [bf16_rounding(m) for m in ("fp32", "mixed", "bf16-sr", "bf16")] == [None, None, "stochastic", "nearest"]
    assert compute_dtype("mixed", CPU) == torch.bfloat16
    assert compute_dtype("bf16-sr", CPU) == torch.float32  # CPUs upcast bf16 weights for the matmuls
    assert compute_dtype("bf16-sr", torch.device("cuda")) == torch.bfloat16


def test_bf16_storage_computes_in_fp32_on_cpu_with_bf16_gradients():
    torch.manual_seed(0)
    model = cast_parameters(Llama(CFG), "bf16-sr")
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    assert model.rope_cos.dtype == torch.float32  # buffers keep their precision
    reference = Llama(CFG)
    reference.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    tokens = torch.randint(0, 97, (2, 16))
    labels = torch.randint(0, 97, (2, 16))
    with autocast("bf16-sr", CPU):
        logits = model(tokens)
        token_loss_sum(logits, labels).backward()
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, reference(tokens))  # the same fp32 arithmetic on the same values
    assert all(p.grad.dtype == torch.bfloat16 for p in model.parameters())


def test_bytes_per_parameter_of_training_state():
    fp32 = Llama(CFG)
    assert state_bytes_per_param(fp32.parameters()) == 16
    bf16 = cast_parameters(Llama(CFG), "bf16-sr")
    opt = build_adamw(bf16, OptimConfig(), "stochastic", compile=False)
    assert state_bytes_per_param(bf16.parameters(), opt) == 8  # predicted before the first step
    for p in bf16.parameters():
        p.grad = torch.zeros_like(p)
    opt.step()
    assert state_bytes_per_param(bf16.parameters(), opt) == 8  # measured on the allocated moments


def test_unknown_mode_names_field_and_choices():
    with pytest.raises(ConfigError, match=r"precision\.mode.*bf16-sr"):
        load_config("tiny", None, ["--precision.mode", "fp8"])


def test_bf16_sr_resume_is_exact(small_corpus, tmp_path):
    args = ("--precision.mode", "bf16-sr", "--precision.compile_optimizer", "false")
    messages: list[str] = []
    straight = Trainer(tiny_cfg(small_corpus, tmp_path / "straight", *args), out=messages.append)
    straight_losses = straight.fit().losses
    assert any("bf16-sr precision (8 bytes/parameter" in m for m in messages)
    Trainer(tiny_cfg(small_corpus, tmp_path / "split", *args, "--train.steps", "3"), out=quiet).fit()
    resumed = Trainer(tiny_cfg(small_corpus, tmp_path / "split", *args), resume="require", out=quiet)
    assert resumed.fit().losses == straight_losses[3:]  # bit-identical: the rounding noise resumes too
    assert all(torch.equal(a, b) for a, b in zip(resumed.model.parameters(), straight.model.parameters()))
    assert all(p.dtype == torch.bfloat16 for p in resumed.model.parameters())
    fp32 = Trainer(tiny_cfg(small_corpus, tmp_path / "fp32"), out=quiet).fit()
    assert straight_losses == pytest.approx(fp32.losses, rel=0.02)  # same data and init, bf16 state


def test_emulated_bf16_compute_matches_cpu_autocast():
    """The study's stand-in for bf16 autocast on CPUs without bf16 units computes the same numbers."""
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 16, 64, generator=gen, requires_grad=True)
    w = torch.randn(96, 64, generator=gen, requires_grad=True)
    q = torch.randn(2, 4, 16, 16, generator=gen)
    results = []
    for ctx in (torch.autocast("cpu", dtype=torch.bfloat16), EmulatedBf16Compute()):
        x.grad = w.grad = None
        with ctx:
            y = F.linear(x, w)
            a = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        y.float().square().sum().backward()
        results.append((y, a, x.grad.clone(), w.grad.clone()))
    (y1, a1, gx1, gw1), (y2, a2, gx2, gw2) = results
    assert y1.dtype == y2.dtype == a2.dtype == torch.bfloat16 and gw2.dtype == torch.float32
    # Same bf16 values up to the kernels' summation order: at most 1 ulp on a few elements.
    assert (y1 != y2).float().mean() < 0.01 and torch.allclose(y1.float(), y2.float(), rtol=2 ** -7, atol=0)
    assert torch.allclose(a1.float(), a2.float(), rtol=2 ** -6, atol=2 ** -6)
    assert torch.allclose(gx1, gx2, rtol=2 ** -6, atol=1e-3) and torch.allclose(gw1, gw2, rtol=2 ** -6, atol=1e-3)
