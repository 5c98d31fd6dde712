import math

import pytest
import torch

from hlat.config.model import ModelConfig
from hlat.model import KVCache, Llama

SMALL = ModelConfig(vocab_size=97, d_model=64, n_layers=2, n_heads=8, n_kv_heads=2, ffn_dim=128, max_seq_len=32)
# Big enough for ~0.1-0.5% standard-error std estimates, small enough to build in well under 1 s.
MEDIUM = ModelConfig(
    vocab_size=1000, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4, ffn_dim=688, max_seq_len=64, init_std=0.021
)


def tokens(cfg: ModelConfig, T: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (2, T), generator=torch.Generator().manual_seed(seed))


def test_module_names() -> None:
    names = set(Llama(SMALL).state_dict())
    assert {"tok_embeddings.weight", "norm.weight", "output.weight"} <= names
    for part in (
        "attention.wq",
        "attention.wk",
        "attention.wv",
        "attention.wo",
        "feed_forward.w1",
        "feed_forward.w2",
        "feed_forward.w3",
        "attention_norm",
        "ffn_norm",
    ):
        assert f"layers.1.{part}.weight" in names
    assert len(names) == 3 + 2 * 9  # no biases, and the RoPE tables are not persistent
    assert not any("bias" in n or "rope" in n for n in names)


def check_init_stats(model: Llama, cfg: ModelConfig) -> None:
    std, out_std = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.n_layers)
    expected = {"tok_embeddings.weight": std, "output.weight": std}
    for i in range(cfg.n_layers):
        for name in ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1", "feed_forward.w3"):
            expected[f"layers.{i}.{name}.weight"] = std
        expected[f"layers.{i}.attention.wo.weight"] = out_std
        expected[f"layers.{i}.feed_forward.w2.weight"] = out_std
    for name, p in model.named_parameters():
        if "norm" in name:
            assert torch.equal(p, torch.ones_like(p)), name
        else:
            assert p.mean().abs().item() < 0.05 * expected[name], name
            assert p.std().item() == pytest.approx(expected[name], rel=0.05), name


def test_init_statistics() -> None:
    torch.manual_seed(0)
    check_init_stats(Llama(MEDIUM), MEDIUM)


def test_meta_construction_then_init() -> None:
    with torch.device("meta"):
        model = Llama(MEDIUM)
    assert all(p.is_meta for p in model.parameters())
    model.to_empty(device="cpu")
    torch.manual_seed(1)
    model.init_weights()
    check_init_stats(model, MEDIUM)
    torch.manual_seed(0)
    reference = Llama(MEDIUM)
    assert torch.equal(model.rope_cos, reference.rope_cos)
    assert torch.equal(model.rope_sin, reference.rope_sin)
    with torch.no_grad():
        assert torch.isfinite(model(tokens(MEDIUM, 16))).all()


def test_rope_tables_stay_fp32_under_dtype_cast() -> None:
    model = Llama(SMALL)
    cos = model.rope_cos.clone()
    model.to(torch.bfloat16)
    assert model.rope_cos.dtype == torch.float32 and torch.equal(model.rope_cos, cos)
    assert model.output.weight.dtype == torch.bfloat16
    with torch.no_grad():
        assert model(tokens(SMALL, 8)).dtype == torch.bfloat16  # logits in the compute dtype


def test_causality() -> None:
    torch.manual_seed(0)
    model = Llama(SMALL).eval()
    x = tokens(SMALL, 16)
    t = 9
    y = x.clone()
    y[:, t] = (y[:, t] + 1) % SMALL.vocab_size
    with torch.no_grad():
        a, b = model(x), model(y)
    torch.testing.assert_close(a[:, :t], b[:, :t], rtol=0, atol=1e-6)
    assert (a[:, t:] - b[:, t:]).abs().max() > 1e-3


def test_document_mask_isolates_documents() -> None:
    torch.manual_seed(0)
    model = Llama(SMALL).eval()
    T, split = 16, 6
    doc = torch.tensor([0] * split + [1] * (T - split))
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    mask = (causal & (doc[:, None] == doc[None, :]))[None, None]  # [1, 1, T, T]
    positions = torch.cat([torch.arange(split), torch.arange(T - split)]).expand(2, T)
    x = tokens(SMALL, T)
    y = x.clone()
    y[:, :split] = (y[:, :split] + 1) % SMALL.vocab_size  # change document 1 only
    with torch.no_grad():
        a = model(x, positions=positions, attn_mask=mask)
        b = model(y, positions=positions, attn_mask=mask)
        alone = model(x[:, split:])  # document 2 on its own, default causal mask and positions
    torch.testing.assert_close(a[:, split:], b[:, split:], rtol=0, atol=1e-6)
    torch.testing.assert_close(a[:, split:], alone, rtol=0, atol=1e-5)
    with pytest.raises(TypeError, match="bool"):
        model(x, attn_mask=mask.float())


def test_backward_reaches_every_parameter() -> None:
    torch.manual_seed(0)
    model = Llama(SMALL)
    x = tokens(SMALL, 12)
    logits = model(x[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())
    assert loss.item() == pytest.approx(math.log(SMALL.vocab_size), rel=0.05)  # small init
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_kv_cache_decoding_matches_the_full_forward() -> None:
    """Prefill 5 positions, then feed 3 one at a time: the logits equal one forward over all 8."""
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, max_seq_len=16)
    model = Llama(cfg).eval()
    x = tokens(cfg, 8)
    causal = torch.ones(8, 8, dtype=torch.bool).tril()[None, None]
    positions = torch.arange(8)[None]
    with torch.no_grad():
        full = model(x)
        cache = KVCache(8)
        parts = [model(x[:, :5], positions[:, :5], causal[..., :5, :5], cache)]
        for t in range(5, 8):
            parts.append(model(x[:, t : t + 1], positions[:, t : t + 1], causal[..., t : t + 1, : t + 1], cache))
    torch.testing.assert_close(torch.cat(parts, dim=1), full, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="holds 8 positions"):
        model(x[:, :1], positions[:, :1], causal[..., :1, :1], cache)
    with pytest.raises(ValueError, match="pass positions and an attn_mask"):
        model(x, cache=KVCache(8))
