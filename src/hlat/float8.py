"""Float8 training of the transformer blocks' linear layers (`--precision.float8 true`), via torchao.

torchao's `convert_to_float8_training` swaps each selected `nn.Linear` for a `Float8Linear`: the
weight stays in its storage dtype (the optimizer and checkpoints see the same parameters and
names), and each matmul casts its inputs to float8 with dynamic per-tensor scales (e4m3 forward,
e5m2 for the output gradient) and runs `torch._scaled_mm`. Only the blocks' linears convert: the
output head (vocabulary logits, where precision matters most for the loss) and the embeddings stay
in the mode's compute dtype, as torchao's own recipes do. Blocks narrower than
precision.float8_min_d_model (4096 by default) do not convert (`float8_line`).

float8 matmuls exist on CUDA devices of capability 8.9 or higher (Ada, Hopper, Blackwell); other
devices are refused before any model is built. torchao is an optional extra (`hlat[float8]`).
Under tensor parallelism the float8 blocks take torchao's float8 styles
(hlat.parallel.tensor_parallel), except with more tp ranks than KV heads (refused: `float8_problem`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from hlat.device.record import device_record
from hlat.device.runtime import capability, device_name
from hlat.errors import ConfigError
from hlat.model.spec import model_spec

FIELD = "precision.float8"
MIN_CAPABILITY = (8, 9)
_FIX = "use a CUDA GPU of capability 8.9 or higher (L4, L40S, H100, H200, B200) or set --precision.float8 false"


def float8_problem(device: torch.device, tp: int = 1, n_kv_heads: int | None = None) -> str | None:
    """Why float8 training cannot run on `device` with tensor parallelism `tp` over a model of
    `n_kv_heads` KV heads (None: not checked), or None when it can."""
    found = capability(device) if device_record(device.type).float8 else None
    if found is None:
        return f"float8 matmuls need a CUDA GPU of capability >= 8.9; this run is on {device}; {_FIX}"
    major, minor = found
    if (major, minor) < MIN_CAPABILITY:
        return f"{device_name(device)} has CUDA capability {major}.{minor}, and float8 matmuls need >= 8.9; {_FIX}"
    if n_kv_heads is not None and tp > n_kv_heads:
        # ReplicatedKV computes its head's rows of wk and wv outside the Float8Linear, and each rank
        # holds a partial sum of their output gradient: no float8 scale of the whole tensor there.
        return (
            f"parallel.tp {tp} > model.n_kv_heads {n_kv_heads} replicates the KV projections, which have no "
            f"float8 form (each rank computes its own KV head's rows of wk and wv outside torchao's Float8Linear); "
            f"set --parallel.tp to at most {n_kv_heads} or --precision.float8 false"
        )
    try:
        import torchao.float8  # noqa: F401
    except ImportError as err:
        return f"needs torchao ({err}); install it with pip install 'hlat[float8]' (or pip install torchao), or set --precision.float8 false"
    return None


def float8_line(d_model: int, min_d_model: int) -> str | None:
    """The start-up line when precision.float8 is on but the blocks are narrower than
    precision.float8_min_d_model (then nothing converts); None when they convert."""
    if d_model >= min_d_model:
        return None
    return (
        f"float8: off (model.d_model {d_model} < precision.float8_min_d_model {min_d_model}: "
        "narrow blocks gain less than float8's casts cost); --precision.float8_min_d_model 0 converts them"
    )


def check_float8(device: torch.device, tp: int = 1, n_kv_heads: int | None = None) -> None:
    """Refuse float8 training where it cannot run, naming the field, the device and the fix."""
    problem = float8_problem(device, tp, n_kv_heads)
    if problem:
        raise ConfigError([(FIELD, problem)])


def _block_linear(model: nn.Module, tp: int) -> Callable[[nn.Module, str], bool]:
    """torchao's module filter: linears inside the transformer blocks whose matmul on each of `tp`
    ranks `_scaled_mm` accepts (both dimensions of the rank's share of the weight multiples of 16:
    a column or KV linear's output features are split over tp, a row linear's input features);
    the output head and anything else stay as they are."""
    plan = model_spec(model.cfg).tensor_parallel

    def convert(module: nn.Module, fqn: str) -> bool:
        if not (isinstance(module, nn.Linear) and fqn.startswith("layers.")):
            return False
        role = plan.get(fqn.split(".", 2)[2])  # the name inside its block: layers.<i>.<name>
        out_features = module.out_features // tp if role in ("column", "kv") else module.out_features
        in_features = module.in_features // tp if role == "row" else module.in_features
        return out_features % 16 == 0 and in_features % 16 == 0

    return convert


def is_float8_linear(module: nn.Module) -> bool:
    """Whether `module` is torchao's Float8Linear (by name: torchao need not be installed)."""
    return type(module).__name__ == "Float8Linear"


def convert_to_float8(model: nn.Module, tp: int = 1) -> int:
    """Swap the transformer blocks' linears of `model` (a Llama or a pipeline stage of one, to be
    split over `tp` ranks) for torchao Float8Linear, in place; returns how many were converted.
    Call it before tensor parallelism (which picks the float8 styles for them), activation
    checkpointing, torch.compile and data-parallel wrapping (on the meta model is fine)."""
    from torchao.float8 import convert_to_float8_training

    convert_to_float8_training(model, module_filter_fn=_block_linear(model, tp))
    return sum(is_float8_linear(m) for m in model.modules())
