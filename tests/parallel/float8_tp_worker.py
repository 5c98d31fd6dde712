"""Train a tiny model with float8 blocks (torchao's Float8Linear, `precision.float8`) a few steps
under tensor parallelism and in one process (the scenarios of test_float8_tp.py, see tests/runs.py):
the same seed and global batches, so the runs must record the same losses and gradient norms.

The CPU has no float8 hardware, so hlat refuses float8 on it (hlat.float8); here the refusal is
lifted and torch's CPU `_scaled_mm` runs the float8 matmuls (the same float8 operands and scales
as on a GPU, slowly). gloo has no float8 dtype, so the float8 all-gathers of torchao's TP
styles travel as their bytes (`float8_gathers_as_bytes`), which leaves every value unchanged.
"""

import contextlib
import json
from collections.abc import Iterator
from unittest import mock

import torch

import hlat.parallel.parallelize as parallelize
from hlat.config.layout import Degrees
from hlat.config.model import ModelConfig
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.data.batch import Batch, labels_for
from hlat.float8 import is_float8_linear
from hlat.parallel.mesh import Layout, make_layout
from parallel.parity_worker import LR, fp32_module, train_steps

# d_model and every tp 2 shard of the block linears multiples of 16 (`_scaled_mm`'s rule); vocabulary
# 127: the embedding and the head (never float8) shard unevenly under tp 2, as hlat does it
MODEL = ModelConfig(vocab_size=127, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=16)
# the CPU's float8 matmul is slow (~10 ms for 64 x 64 x 64): 2 micro-batches of 16 tokens a step keep both
# scenarios at about 8 CPU-seconds
GLOBAL_BATCH, SEQ, MICRO, STEPS, DATA_SEED = 2, 16, 1, 4, 1234
CPU = torch.device("cpu")


@contextlib.contextmanager
def float8_gathers_as_bytes() -> Iterator[list[int]]:
    """torchao all-gathers a Float8TrainingTensor's float8 data, which gloo refuses ("Invalid scalar
    type"; NCCL carries float8): gather its bytes as uint8 and view them back. Yields the count of
    float8 all-gathers (torchao's styles gather the blocks' inputs and row outputs' gradients in float8)."""
    from torchao.float8 import float8_ops
    from torchao.float8.float8_training_tensor import Float8TrainingTensor

    count = [0]

    def all_gather(op, args, kwargs=None):  # type: ignore[no-untyped-def]
        count[0] += 1
        fp8 = args[0]
        gathered = op(fp8._data.contiguous().view(torch.uint8), *args[1:], **(kwargs or {}))
        # the view shares the output's storage, by which the collective's wait finds it
        data = gathered.view(fp8._data.dtype)
        return Float8TrainingTensor(data, fp8._scale, fp8._orig_dtype, fp8._linear_mm_config, fp8._gemm_input_role)

    ops = (
        torch.ops.c10d_functional.all_gather_into_tensor.default,
        torch.ops._c10d_functional.all_gather_into_tensor.default,
    )
    with mock.patch.dict(float8_ops.FLOAT8_OPS_TABLE, {op: all_gather for op in ops}):
        yield count


def run(layout: Layout, float8: bool) -> dict:
    """STEPS optimizer steps over this layout; losses, gradient norms, the Float8Linears of this
    rank and the float8 all-gathers it ran."""
    tp = layout.tp
    with mock.patch.object(parallelize, "check_float8", lambda *args: None), float8_gathers_as_bytes() as gathers:
        model = parallelize.build_parallel_model(
            MODEL,
            parallel=ParallelConfig(tp=tp),
            layout=layout,
            device=CPU,
            seed=7,
            n_microbatches=GLOBAL_BATCH // MICRO,
            precision=PrecisionConfig(mode="fp32"),
            float8=float8,
        )
        module = fp32_module(model, "ddp")
        gen = torch.Generator().manual_seed(DATA_SEED)
        steps = (
            [Batch(rows, labels_for(rows)) for rows in tokens.split(MICRO)]
            for tokens in (torch.randint(0, MODEL.vocab_size, (GLOBAL_BATCH, SEQ), generator=gen) for _ in range(STEPS))
        )
        losses, norms = train_steps(module, steps, LR, f"tp {tp}")
    float8_linears = sum(is_float8_linear(m) for m in model.raw_parts[0].modules())
    return {"losses": losses, "grad_norms": norms, "float8_linears": float8_linears, "float8_gathers": gathers[0]}


def train(ctx, runs: list[str]) -> None:
    """Scenario: each of `runs` ("float8", "fp32") over this scenario's ranks as tensor parallelism
    (one rank: the reference); rank 0 writes OUT/<run>.json."""
    layout = Layout(1, 0, Degrees(), None) if ctx.world == 1 else make_layout(Degrees(tp=ctx.world), CPU)
    for name in runs:
        record = run(layout, float8=name == "float8")
        if ctx.rank == 0:
            (ctx.out / f"{name}.json").write_text(json.dumps(record))
