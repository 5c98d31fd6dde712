"""hlat.parallel.init_values: the standard Threefry-2x32-20, values that depend on the global
index alone (any slice, order or chunking computes the same bits), and the distribution the docs
state. Layouts themselves: tests/model/test_init.py (bit-identical to the single-device model)."""

import math

import torch

from hlat.parallel.init_values import init_values, parameter_key, threefry2x32_, value_scale

KEY = parameter_key(0, "layers.0.attention.wq.weight")
STRIDE = 24  # a 40 x 24 parameter


def test_threefry_matches_random123_known_answers():
    """Random123's kat_vectors for threefry2x32_20: (counter, key) -> output words."""
    cases = [
        ((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
        ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
        ((0x243F6A88, 0x85A308D3), (0x13198A2E, 0x03707344), (0xC4923A9C, 0x483DF7A0)),
    ]
    for counter, key, expected in cases:
        words = [torch.tensor([w]) for w in counter]
        threefry2x32_(*words, *key)
        assert tuple(w.item() for w in words) == expected


def test_a_slice_computes_the_full_tensors_bits():
    """Element (r, c) of a 40 x 24 parameter is the same float whether computed with the whole
    tensor, in a permuted, uneven block of rows and columns, or one row at a time."""
    scale = value_scale(0.02)
    full = init_values(torch.arange(40), torch.arange(24), STRIDE, *KEY, scale)
    rows, cols = torch.tensor([39, 2, 17, 5, 6]), torch.arange(7, 20)
    assert torch.equal(init_values(rows, cols, STRIDE, *KEY, scale), full[rows][:, cols])
    assert torch.equal(
        torch.cat([init_values(torch.tensor([r]), torch.arange(24), STRIDE, *KEY, scale) for r in range(40)]), full
    )
    # The counter's high word counts too: indices past 2^32 are not those 2^32 below.
    high = init_values(torch.tensor([2**32 // 24 + 1]), torch.arange(24), STRIDE, *KEY, scale)
    assert not torch.equal(high, init_values(torch.tensor([1]), torch.arange(24) - 2**32 % 24, STRIDE, *KEY, scale))


def test_distribution_is_the_documented_irwin_hall():
    std, n = 0.02, 1 << 16
    x = init_values(torch.arange(n), torch.zeros(1, dtype=torch.long), 1, *KEY, value_scale(std)).double()
    assert abs(x.mean().item()) < 4 * std / math.sqrt(n)
    assert abs(x.std().item() - std) < 4 * std / math.sqrt(2 * n)
    assert x.abs().max().item() <= 2 * math.sqrt(3) * std
    kurtosis = ((x - x.mean()) ** 4).mean().item() / x.var().item() ** 2 - 3
    assert abs(kurtosis + 0.3) < 0.05  # a normal's 0; Irwin-Hall n = 4: -6 / (5 n)
    keys = [parameter_key(s, name) for s in (0, 1) for name in ("a.weight", "b.weight")]
    assert len(set(keys)) == 4  # every (seed, name) its own stream
