"""The `flex_on_cpu` fixture: hlat's FlexAttention path (the CUDA one) on the CPU, backward included.

torch 2.13 refuses FlexAttention gradients on CPU in one input check, yet its eager reference
(the flex_attention higher-order operator's dense forward and backward) computes them. With that
check off and dynamo on (eager flex_attention traces itself with dynamo's eager backend, no
inductor), hlat.model.attention.sdpa sends a BlockMask through the reference instead of the
compiled kernel: CPU tests reach the operator a GPU run reaches, under recompute policies too.
"""

import warnings
from collections.abc import Iterator

import pytest
import torch.nn.attention.flex_attention as flex

from hlat.model import attention


@pytest.fixture
def flex_on_cpu(monkeypatch: pytest.MonkeyPatch, compiling: None) -> Iterator[None]:
    assert callable(flex._validate_device)  # the check this removes (if torch renames it, this is stale)
    monkeypatch.setattr(flex, "_validate_device", lambda query, key, value: None)
    monkeypatch.setattr(attention, "_compiled_flex", lambda: flex.flex_attention)
    with warnings.catch_warnings():  # "called without torch.compile": the unfused reference is the point
        warnings.filterwarnings("ignore", "flex_attention called without torch.compile", UserWarning)
        yield
