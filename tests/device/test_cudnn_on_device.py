"""CUDA's cuDNN attention operator on the cuda-like profile (tests/device/profiles.py): it computes
attention within bf16's rounding of fp32 attention, forward and backward; its outputs are what
torch's meta registration gives (shapes, dtypes, strides); SDPA takes it where the priority order
and sdpa_kernel lead there and refuses what sdp_utils.cpp's can_use_cudnn_attention refuses; and
`train.attention_backend cudnn` trains the tiny model as the math backend does."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from device import profiles, simulated_device
from hlat.config.load import load_config
from hlat.train.trainer import Trainer
from runs import tiny_args

simulated_device.register()
CUDNN = "_scaled_dot_product_cudnn_attention"
DEVICE = torch.device(simulated_device.TYPE)


def _inputs(q_heads: int = 4, kv_heads: int = 2, d: int = 8, kv_len: int = 16, d_v: int | None = None) -> list:
    """Query, key and value [B, H, M, D] of bf16 values (exact in fp32 too), as fp32."""
    gen = torch.Generator().manual_seed(0)
    shapes = ((2, q_heads, 16, d), (2, kv_heads, kv_len, d), (2, kv_heads, kv_len, d_v or d))
    return [torch.randn(shape, generator=gen).bfloat16().float() for shape in shapes]


def _document_mask() -> torch.Tensor:
    """Causal within two documents of 6 and 10 tokens, [1, 1, 16, 16], as hlat's dense document mask."""
    doc = torch.tensor([0] * 6 + [1] * 10)
    return ((doc[:, None] == doc[None, :]) & torch.ones(16, 16, dtype=torch.bool).tril())[None, None]


@pytest.mark.parametrize(
    ("kv_heads", "mask"), [(2, None), (4, _document_mask())], ids=["causal-grouped-kv", "document-mask"]
)
def test_cudnn_operator_computes_fp32_attention_within_bf16_rounding(kv_heads: int, mask: torch.Tensor | None):
    """Under sdpa_kernel(CUDNN_ATTENTION), bf16 attention runs the cuDNN operator forward and
    backward (no other fused one), within bf16's rounding of fp32 attention on the same values."""
    q, k, v = _inputs(kv_heads=kv_heads)
    weights = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    gqa = kv_heads != q.size(1)
    want = [t.clone().requires_grad_() for t in (q, k, v)]
    reference = F.scaled_dot_product_attention(*want, attn_mask=mask, is_causal=mask is None, enable_gqa=gqa)
    (reference * weights).sum().backward()
    counted: Counter[str] = Counter()
    with profiles.profile(profiles.CUDA_LIKE), profiles.counted_kernels(counted):
        got = [t.to(DEVICE, torch.bfloat16).requires_grad_() for t in (q, k, v)]
        dev_mask = None if mask is None else mask.to(DEVICE)
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            out = F.scaled_dot_product_attention(*got, attn_mask=dev_mask, is_causal=mask is None, enable_gqa=gqa)
            (out.float() * weights.to(DEVICE)).sum().backward()
    assert {name: n for name, n in counted.items() if name != "sdpa"} == {CUDNN: 1, f"{CUDNN}_backward": 1}
    # one rounding to bf16's 8 bits; the backward reads the bf16 output, as CUDA's does
    torch.testing.assert_close(out.float().cpu(), reference.detach(), rtol=2**-7, atol=1e-3)
    for mine, theirs in zip(got, want):
        torch.testing.assert_close(mine.grad.float().cpu(), theirs.grad, rtol=0, atol=2**-7 * theirs.grad.abs().max())


def _described(value: object) -> object:
    return (tuple(value.shape), value.dtype, value.stride()) if isinstance(value, torch.Tensor) else value


@pytest.mark.parametrize("d_v", [8, 16], ids=["dv-equal", "dv-smaller"])
def test_cudnn_outputs_are_the_meta_registrations(d_v: int):
    """Forward and backward outputs on the profile against the same call on the meta device
    (torch/_meta_registrations.py): None where it gives None, the sequence lengths, and each
    tensor's shape, dtype and strides, with the query laid out [B, M, H, D] in memory as hlat's is."""
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in _inputs(d=16, d_v=d_v))
    args = (None, True, 0.0, True)
    with profiles.profile(profiles.CUDA_LIKE):
        host = [t.to(DEVICE, torch.bfloat16) for t in (q, k, v)]
        got = torch.ops.aten._scaled_dot_product_cudnn_attention(*host, *args)
        grads = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            torch.ones_like(got[0]), *host, got[0], got[1], got[6], got[7], None, None, None, 16, 16, 0.0, True
        )
    meta = [t.to("meta", torch.bfloat16) for t in (q, k, v)]
    want = torch.ops.aten._scaled_dot_product_cudnn_attention(*meta, *args)
    want_grads = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
        torch.empty_like(want[0]), *meta, want[0], want[1], want[6], want[7], None, None, None, 16, 16, 0.0, True
    )
    assert [_described(t) for t in (*got, *grads)] == [_described(t) for t in (*want, *want_grads)]
    assert got[1].shape == (2, 4, 16, 1) and got[6].dtype == torch.int64  # CUDA's softmax stats and philox


@contextlib.contextmanager
def _deterministic() -> Iterator[None]:
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before, warn_only=warn_only)


REFUSED = {  # inputs (bf16 unless fp32), sdpa's keywords, the setting around, the reason sdp_utils.cpp gives
    "fp32": (_inputs(), {"enable_gqa": True}, contextlib.nullcontext, "dtype {Half, BFloat16}"),
    "head-dim-136": (_inputs(d=136), {"enable_gqa": True}, contextlib.nullcontext, "head_dim no more than 128"),
    # cuDNN 9.20 on sm90 takes 192 x 128 (query and key x value) but not 192 throughout, nor 256
    "head-dim-192": (_inputs(d=192), {"enable_gqa": True}, contextlib.nullcontext, "head_dim no more than 128"),
    "head-dim-256": (_inputs(d=256), {"enable_gqa": True}, contextlib.nullcontext, "head_dim no more than 128"),
    "head-dim-12": (_inputs(d=12), {"enable_gqa": True}, contextlib.nullcontext, "head_dim a multiple of 8"),
    "key-length-1": (_inputs(kv_len=1), {"enable_gqa": True}, contextlib.nullcontext, "sequence longer than 1"),
    "grouped-kv-without-enable-gqa": (_inputs(), {}, contextlib.nullcontext, "without enable_gqa"),
    "mask-with-gradient": (
        _inputs(kv_heads=4),
        {"attn_mask": torch.zeros(16, 16, requires_grad=True)},
        contextlib.nullcontext,
        "attn_mask of no gradient",
    ),
    "deterministic": (_inputs(), {"enable_gqa": True}, _deterministic, "not deterministic"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_inputs_cudnn_refuses_are_refused_as_on_cuda(case: str):
    """Restricted to cuDNN (train.attention_backend cudnn), inputs can_use_cudnn_attention refuses
    end in select_sdp_backend's "No available kernel" after a warning that says why; the operator
    called on its own refuses fp32 too."""
    inputs, keywords, setting, reason = REFUSED[case]
    dtype = torch.float32 if case == "fp32" else torch.bfloat16
    with profiles.profile(profiles.CUDA_LIKE), setting(), sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        q, k, v = (t.to(DEVICE, dtype) for t in inputs)
        keywords = {key: t.to(DEVICE, dtype) if key == "attn_mask" else t for key, t in keywords.items()}
        with pytest.warns(UserWarning, match=f"cuDNN attention kernel not used because: .*{reason}"):
            with pytest.raises(RuntimeError, match="No available kernel. Aborting execution."):
                F.scaled_dot_product_attention(q, k, v, **keywords)
        if case == "fp32":
            with pytest.raises(RuntimeError, match=r"dtype \{Half, BFloat16\}, got torch.float32"):
                torch.ops.aten._scaled_dot_product_cudnn_attention(q, k, v, None, True, 0.0, True)


def _first_kernel(inputs: list[torch.Tensor]) -> str:
    """The fused operator one bf16 grouped-query SDPA call on the profile runs."""
    counted: Counter[str] = Counter()
    with profiles.counted_kernels(counted):
        F.scaled_dot_product_attention(*inputs, is_causal=True, enable_gqa=True)
    (name,) = (name for name in counted if name != "sdpa")
    return name


def test_cudnn_comes_first_on_the_profiles_h100_unless_deprioritized(monkeypatch: pytest.MonkeyPatch):
    """torch 2.13.0's Linux wheel brings cuDNN 9.20: on an H100 the first SDPA call puts cuDNN
    first (sdp_utils.cpp's priority_order, once a process), so bf16 grouped-query attention with
    every backend enabled runs cuDNN's operator; sdpa_kernel(..., set_priority=True) reorders it;
    with TORCH_CUDNN_SDPA_DEPRIORITIZED=1 the build's default order stands and flash runs. A
    process's order does not outlive it."""
    default = torch._C._get_sdp_priority_order()
    q, k, v = _inputs()
    flash_first = [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH]
    with profiles.profile(profiles.CUDA_LIKE):
        inputs = [t.to(DEVICE, torch.bfloat16) for t in (q, k, v)]
        assert _first_kernel(inputs) == CUDNN
        with sdpa_kernel(flash_first, set_priority=True):
            assert _first_kernel(inputs) == "_scaled_dot_product_flash_attention"
        assert _first_kernel(inputs) == CUDNN
    assert torch._C._get_sdp_priority_order() == default
    monkeypatch.setenv("TORCH_CUDNN_SDPA_DEPRIORITIZED", "1")
    with profiles.profile(profiles.CUDA_LIKE):
        assert _first_kernel([t.to(DEVICE, torch.bfloat16) for t in (q, k, v)]) == "_scaled_dot_product_flash_attention"
        assert torch._C._get_sdp_priority_order() == default


def test_cudnn_takes_a_192_query_head_with_a_128_value_head():
    """The one head-dim pair above 128 cuDNN 9.20 takes on sm90 (check_cudnn_tensor_shapes): a
    query and key of 192 with a value of 128, forward and backward through its operator."""
    q, k, v = _inputs(d=192, d_v=128)
    counted: Counter[str] = Counter()
    with profiles.profile(profiles.CUDA_LIKE), profiles.counted_kernels(counted):
        got = [t.to(DEVICE, torch.bfloat16).requires_grad_() for t in (q, k, v)]
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            out = F.scaled_dot_product_attention(*got, is_causal=True, enable_gqa=True)
            out.float().sum().backward()
    assert out.shape == (2, 4, 16, 128) and got[0].grad.shape == q.shape
    assert counted[CUDNN] == counted[f"{CUDNN}_backward"] == 1


def _train(corpus: Path, run: Path, backend: str, counted: Counter[str]) -> list[float]:
    args = tiny_args(corpus, run, "--train.steps", "2", "--train.global_batch", "2", "--train.device",
                     simulated_device.TYPE, "--parallel.compile", "false", "--precision.mode", "mixed",
                     "--data.document_masking", "true", "--train.attention_backend", backend)  # fmt: skip
    with profiles.profile(profiles.CUDA_LIKE), profiles.counted_kernels(counted):
        Trainer(load_config("tiny", None, args), out=lambda _: None).fit()
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def test_training_with_the_cudnn_backend_equals_the_math_backend(small_corpus: Path, tmp_path: Path):
    """The tiny model (grouped K/V heads, document masking, `mixed`) for two steps on the cuda-like
    profile with train.attention_backend cudnn: every attention call goes to the cuDNN operator,
    and the losses are the math backend's within bf16 attention's rounding."""
    counted: Counter[str] = Counter()
    cudnn = _train(small_corpus, tmp_path / "cudnn", "cudnn", counted)
    math = _train(small_corpus, tmp_path / "math", "math", Counter())
    assert counted[CUDNN] == counted[f"{CUDNN}_backward"] == 2 * 2  # steps x layers (one micro-batch a step)
    assert counted["_scaled_dot_product_flash_attention"] == counted["_scaled_dot_product_efficient_attention"] == 0
    assert len(cudnn) == 2 and cudnn == pytest.approx(math, rel=2**-8)  # bf16 attention: 8 bits
