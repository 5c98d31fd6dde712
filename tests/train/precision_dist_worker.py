"""Train bf16-sr runs under several layouts, one after another on 2 processes: the scenario
`layouts` of test_precision_dist.py (tests/runs.py). Every run goes through what `hlat train`
does (hlat.config.load_config on command-line overrides, then Trainer(...).fit()). Each rank
writes OUT/<run>.rank<r>.json: the losses of the invocation and the dtypes of its local
parameters, gradients and optimizer state.
"""

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import torch

from hlat.config.load import load_config
from hlat.dtensor import local_tensor
from hlat.train.trainer import Trainer

STEPS = 6
LAYOUTS = {
    "ddp": ["--parallel.dp_sharding", "ddp"],
    "zero1": ["--parallel.dp_sharding", "zero1"],
    "fsdp": ["--parallel.dp_sharding", "fsdp"],
    "tp2": ["--parallel.tp", "2"],
    # tied embeddings under PP 2: a copy of the matrix on each stage's rank, each updated by its
    # stage's optimizer; 3 layers split unevenly, so the copies sit at different optimizer positions
    "pp2-tied": ["--parallel.pp", "2", "--model.tie_embeddings", "true", "--model.n_layers", "3"],
}


def base(corpus: str, run_dir: Path, steps: int, every: int = 2) -> list[str]:
    """Arguments of a run saving every `every` steps and at its last."""
    return [
        "--data.source", corpus, "--model.vocab_size", "512", "--model.d_model", "64", "--model.n_layers", "2",
        "--model.n_heads", "4", "--model.n_kv_heads", "2", "--model.ffn_dim", "128", "--model.max_seq_len", "64",
        "--data.seq_len", "32", "--train.global_batch", "8", "--train.micro_batch", "2", "--train.log_every", "1",
        "--train.tensorboard", "false", "--train.plot", "false", "--train.peak_tflops", "1",
        "--train.run_dir", str(run_dir), "--checkpoint.every", str(every), "--optim.lr", "1e-2",
        "--schedule.warmup_steps", "1", "--schedule.decay_steps", "100", "--eval.every", "0",
        "--precision.mode", "bf16-sr", "--train.steps", str(steps), "--parallel.compile", "false",
    ]  # fmt: skip


def dtypes(trainer: Trainer) -> dict[str, list[str]]:
    params = list(trainer.model.parameters())
    state = [
        t
        for opt in trainer.optimizers.optimizers
        for s in getattr(opt, "optim", opt).state.values()
        for t in s.values()
        if isinstance(t, torch.Tensor) and t.ndim > 0
    ]
    return {
        "params": sorted({str(local_tensor(p).dtype) for p in params}),
        "grads": sorted({str(local_tensor(p.grad).dtype) for p in params if p.grad is not None}),
        "optim_state": sorted({str(local_tensor(t).dtype) for t in state}),
        "n_state": [len(state)],
        # Replicas (DDP, ZeRO-1 after its broadcast) must hold bit-identical weights: their rounding
        # noise is shared. Under FSDP/TP each rank's digest is of its own shard.
        "digest": [_digest(params)],
        # the tied matrix alone: the pipeline's two copies must hold the same bits
        "tied_digest": [
            _digest(
                [
                    p
                    for part in trainer.model.parts
                    for n, p in part.named_parameters()
                    if n.endswith("tok_embeddings.weight")
                ]
            )
        ],
    }


def _digest(params: list[torch.Tensor]) -> str:
    return hashlib.sha256(
        b"".join(local_tensor(p).detach().contiguous().view(torch.int16).numpy().tobytes() for p in params)
    ).hexdigest()


def train(name: str, args: list[str], out: Path, resume: str = "auto") -> None:
    trainer = Trainer(load_config(None, None, args), resume=resume, out=lambda line: None)
    summary = trainer.fit()
    trainer.checkpoints.wait()
    record = {"losses": summary.losses, "step": summary.step, **dtypes(trainer)}
    (out / f"{name}.rank{trainer.layout.rank}.json").write_text(json.dumps(record))


def layouts(ctx) -> None:
    out, corpus = ctx.out, str(ctx.corpus)
    for name, layout in LAYOUTS.items():
        with optimizer_compiled(name == "fsdp"):
            # nothing reads these runs' checkpoints: one save, at the end
            train(name, base(corpus, out / name, STEPS, every=STEPS) + layout, out, resume="fresh")
    # Exact resume under FSDP2: stop at step 2, resume in a new Trainer to 4, against 4 straight
    # (which also saves at step 2: a save that disturbed the live run would show).
    fsdp = LAYOUTS["fsdp"]
    with optimizer_compiled(True):
        train("straight", base(corpus, out / "straight", 4) + fsdp, out, resume="fresh")
        train("first", base(corpus, out / "resumed", 2) + fsdp, out, resume="fresh")
        train("second", base(corpus, out / "resumed", 4) + fsdp, out, resume="require")


@contextlib.contextmanager
def optimizer_compiled(on: bool) -> Iterator[None]:
    """The suite runs eager (tests/conftest.py). The FSDP2 runs keep the compiled optimizer update
    that bf16-sr uses by default, on the sharded (DTensor) parameters, with eager transformer
    blocks (--parallel.compile false in base()); the others run its eager twin (the same
    arithmetic, tests/optim/test_bf16_adamw.py), sparing a compile per layout (~20 s here)."""
    with torch._dynamo.config.patch(disable=not on):
        yield
