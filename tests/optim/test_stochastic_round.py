import pytest
import torch

from hlat.optim.stochastic_round import random_bits, round_to_bf16

N = 400_000  # draws per value: the mean's standard error is below 1e-3 ulp


def neighbours(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The bf16 values just below and above fp32 `x` in magnitude (truncation and the next one up)."""
    down = (x.view(torch.int32) & -65536).view(torch.float32)
    up = (down.view(torch.int32) + 65536).view(torch.float32)
    return down, up


def sr(x: torch.Tensor, seed: int = 7) -> torch.Tensor:
    noise, _ = random_bits(x.numel(), 0, seed, x.device)
    return round_to_bf16(x, noise)


@pytest.mark.parametrize(
    "value",
    [
        1.0 + 1 / 3 * 2**-7,  # a third of an ulp above 1
        -(1.0 + 0.9 * 2**-7),  # negative, nearly a whole ulp
        3.1e-39,  # bf16 subnormal range
        -7.7e-41,
        3.3e38,  # near overflow, below the largest finite bf16 (3.39e38)
        1e-4,
    ],
)
def test_unbiased_and_only_neighbours(value):
    x = torch.full((N,), value, dtype=torch.float32)
    rounded = sr(x).float()
    down, up = neighbours(x[:1])
    assert set(rounded.unique().tolist()) <= {down.item(), up.item()}
    ulp = (up - down).abs().double().item()
    p = ((x[:1].double() - down.double()) / (up.double() - down.double())).item()
    stderr = ulp * (p * (1 - p) / N) ** 0.5
    assert abs(rounded.double().mean().item() - value) < 5 * stderr + 1e-12 * abs(value)


def test_exact_bf16_values_and_specials_are_unchanged():
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(-(2**15), 2**15, (100_000,), dtype=torch.int16, generator=gen)
    exact = bits.view(torch.bfloat16)
    exact = exact[torch.isfinite(exact)]
    specials = torch.tensor(
        [0.0, -0.0, float("inf"), -float("inf"), 3.3895e38, -3.3895e38, 9.2e-41], dtype=torch.bfloat16
    )
    values = torch.cat([exact, specials])
    assert torch.equal(sr(values.float()).view(torch.int16), values.view(torch.int16))
    assert sr(torch.tensor([float("nan")])).isnan().all()


def test_round_to_nearest_is_the_plain_cast():
    x = torch.randn(1000)
    assert torch.equal(round_to_bf16(x, None), x.bfloat16())


def test_noise_is_uniform_and_seeded():
    a, b = random_bits(1 << 16, 0, 123, torch.device("cpu"))
    for field in (a, b):
        assert 0 <= field.min() and field.max() < 2**16
        counts = torch.bincount(field >> 12, minlength=16).float()
        assert (counts / counts.mean() - 1).abs().max() < 0.05
    assert torch.corrcoef(torch.stack([a.double(), b.double(), a.roll(1).double()])).triu(1).abs().max() < 0.02
    again, _ = random_bits(1 << 16, 0, 123, torch.device("cpu"))
    other, _ = random_bits(1 << 16, 0, 2**32 - 5, torch.device("cpu"))  # seeds are 32-bit unsigned
    assert torch.equal(a, again) and (a != other).float().mean() > 0.99


def test_noise_depends_on_the_global_index_only():
    full, _ = random_bits(1000, 0, 5, torch.device("cpu"))
    tail, _ = random_bits(400, 600, 5, torch.device("cpu"))
    assert torch.equal(full[600:], tail)  # a row shard sees the single-device noise
