"""fp32 -> bf16 rounding, stochastic (unbiased) or to nearest, with counter-based noise.

Stochastic rounding adds 16 uniform random bits below the bf16 mantissa of the fp32 bit pattern
and truncates: the value rounds up with probability equal to the discarded fraction, so
E[round(x)] = x. The noise is a hash of (seed, element index) rather than a stateful generator's
stream, because then
- it is pure integer arithmetic that torch.compile fuses into the optimizer's update kernel (no
  noise tensor is written or read: mt19937 noise alone cost more than the whole fp32 AdamW step);
- the "generator state" is just the seed and the step count, both already in the optimizer's
  state_dict, so resumes are exact and checkpoints reshard like any other optimizer state;
- with the element's *global* index, every sharding of a tensor sees the same noise.
"""

from __future__ import annotations

import torch

# Tensors must have fewer elements than this: the element index is the hash's 32-bit counter.
MAX_ELEMENTS = 2**31


def _shr16(x: torch.Tensor) -> torch.Tensor:
    """Logical (unsigned) shift right by 16 of int32 bit patterns."""
    return (x >> 16) & 0xFFFF


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (two multiply-xorshift rounds, good avalanche) on int32 bit patterns.

    int32 rather than int64 because CPUs vectorise 32-bit multiplies (2.3x faster compiled);
    products wrap modulo 2^32 as the hash intends.
    """
    x = (x ^ _shr16(x)) * 0x45D9F3B
    x = (x ^ _shr16(x)) * 0x45D9F3B
    return x ^ _shr16(x)


def int32_seed(seed: int) -> int:
    """A 32-bit unsigned seed as the int32 with its bit pattern (the hash works on int32)."""
    return seed - 2**32 if seed >= 2**31 else seed


def random_bits(
    numel: int, offset: int | torch.Tensor, seed: int | torch.Tensor, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two independent uniform 16-bit fields (int32 in [0, 2^16)) per element of a flat range of a tensor.

    `offset` is the global flat index of the range's first element; `seed` a 32-bit value that
    must differ per tensor and per step: an int, or a 0-d int32 tensor holding int32_seed(seed).
    """
    index = torch.arange(numel, dtype=torch.int32, device=device) + offset
    word = mix32(index ^ (int32_seed(seed) if isinstance(seed, int) else seed))
    return word & 0xFFFF, _shr16(word)


def round_to_bf16(x: torch.Tensor, bits16: torch.Tensor | None) -> torch.Tensor:
    """Round fp32 `x` to bf16: stochastically with `bits16` (ints uniform in [0, 2^16)), else to nearest.

    Integer addition on the sign-magnitude bit pattern moves away from zero for negative values
    too, so the rule is symmetric; a carry out of the mantissa steps the exponent, which is the
    next bf16 value (subnormals and the largest binade included; above the largest finite bf16
    it may round to inf, as the hardware does). inf stays inf and ordinary NaNs stay NaN.
    """
    if bits16 is None:
        return x.to(torch.bfloat16)
    bits = x.view(torch.int32) + bits16
    # The low 16 bits are now zero, so the final cast is exact.
    return (bits & -65536).view(torch.float32).to(torch.bfloat16)
