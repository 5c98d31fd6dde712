import pytest
import torch

from hlat.config.load import load_config
from hlat.config.model import ModelConfig
from hlat.config.optim import OptimConfig
from hlat.errors import ConfigError
from hlat.model import Llama
from hlat.optim import build_adamw
from hlat.parallel.loss import token_loss_sum
from hlat.precision import (
    autocast,
    bf16_rounding,
    cast_parameters,
    compute_dtype,
    emulated_mixed,
    state_bytes_per_param,
)
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


def test_emulated_mixed_matches_mixed():
    """The study's stand-in for `mixed` on CPUs without bf16 units computes what `mixed` computes:
    linear layers bit for bit, forward and backward; the whole model up to the attention kernel's
    internals (CPU bf16 SDPA differs by 1 ulp on ~10% of its outputs), much closer than fp32."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 48, bias=False)
    x = torch.randn(8, 64, requires_grad=True)
    linear = []
    for ctx in (autocast("mixed", CPU), emulated_mixed(CPU)):
        x.grad = layer.weight.grad = None
        with ctx:
            y = layer(x)
            y.float().square().sum().backward()
        linear.append((y, x.grad.clone(), layer.weight.grad.clone()))
    assert linear[0][0].dtype == torch.bfloat16
    for real, emulated in zip(*linear):
        assert torch.equal(real, emulated)

    torch.manual_seed(0)
    model = Llama(CFG)
    tokens = torch.randint(0, 97, (2, 16))
    labels = torch.randint(0, 97, (2, 16))
    results = []
    for ctx in (autocast("mixed", CPU), emulated_mixed(CPU), autocast("fp32", CPU)):
        model.zero_grad()
        with ctx:
            logits = model(tokens)
            token_loss_sum(logits, labels).backward()
        results.append((logits.detach().float(), torch.cat([p.grad.flatten() for p in model.parameters()])))
    (real, real_grad), (emulated, emulated_grad), (fp32, fp32_grad) = results
    torch.testing.assert_close(emulated, real, rtol=2**-6, atol=2**-7)
    assert (emulated - real).abs().mean() < 0.6 * (fp32 - real).abs().mean()
    assert (emulated_grad - real_grad).norm() < 0.7 * (fp32_grad - real_grad).norm()
