import json
import math

import pytest
import torch

from hlat.config import load_config
from hlat.checkpoint import CheckpointManager
from hlat.data.packing import Batch
from hlat.model import Llama, ModelConfig
from hlat.parallel.config import ParallelConfig
from hlat.parallel.mesh import Layout
from hlat.parallel.parallelize import build_parallel_model
from hlat.train.optimizers import Optimizers
from hlat.train.step import train_step
from hlat.train.trainer import Trainer


def tiny_cfg(corpus, run_dir, *extra: str):
    overrides = [
        "--data.source", str(corpus), "--model.vocab_size", "512", "--model.d_model", "64",
        "--model.n_layers", "2", "--model.n_heads", "4", "--model.n_kv_heads", "2", "--model.ffn_dim", "128",
        "--model.max_seq_len", "64", "--data.seq_len", "32", "--train.global_batch", "4",
        "--train.micro_batch", "2", "--train.steps", "6", "--train.log_every", "1",
        "--precision.mode", "fp32", "--train.run_dir", str(run_dir), "--checkpoint.every", "3",
        "--schedule.warmup_steps", "2", "--schedule.decay_steps", "6", "--train.tensorboard", "false", "--train.plot", "false",
        "--train.peak_tflops", "1", *extra,
    ]
    return load_config("tiny", None, overrides)


def quiet(_: str) -> None:
    pass


def test_loss_is_independent_of_micro_batch_split():
    cfg = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=16)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 97, (8, 16), generator=gen)
    labels = torch.cat([tokens[:, 1:], torch.full((8, 1), -100)], dim=1)
    labels[0, :5] = -100  # uneven target counts per row: the mean must be over the global batch
    results = []
    for micro in (8, 4, 1):
        model = build_parallel_model(cfg, ParallelConfig(), Layout(1, 0, 1, 1, 1, None), torch.device("cpu"), 1, 8 // micro, "fp32")
        # SGD with lr 1: the update is the gradient, so weights compare gradients exactly.
        opt = Optimizers(model.parts, lambda part: torch.optim.SGD(part.parameters(), lr=1.0))
        batches = [Batch(tokens[i : i + micro], labels[i : i + micro]) for i in range(0, 8, micro)]
        loss, norm = train_step(model, opt, batches, grad_clip=1.0)
        results.append((loss.item(), norm.item(), [p.detach().clone() for p in model.parameters()]))
    ref_loss, ref_norm, ref_params = results[0]
    for loss, norm, params in results[1:]:
        assert loss == pytest.approx(ref_loss, rel=1e-6)
        assert norm == pytest.approx(ref_norm, rel=1e-5)
        for a, b in zip(params, ref_params):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_same_seed_same_losses(small_corpus, tmp_path):
    first = Trainer(tiny_cfg(small_corpus, tmp_path / "a"), out=quiet).fit()
    second = Trainer(tiny_cfg(small_corpus, tmp_path / "b"), out=quiet).fit()
    assert first.losses == second.losses and len(first.losses) == 6
    other = Trainer(tiny_cfg(small_corpus, tmp_path / "c", "--train.seed", "1"), out=quiet).fit()
    assert other.losses != first.losses


def test_resume_is_exact(small_corpus, tmp_path):
    straight = Trainer(tiny_cfg(small_corpus, tmp_path / "straight"), out=quiet).fit()
    first_half = Trainer(tiny_cfg(small_corpus, tmp_path / "split", "--train.steps", "3"), out=quiet).fit()
    assert first_half.losses == straight.losses[:3]
    # As a run killed during step 5's record would leave metrics.jsonl: step 4 logged after the
    # checkpoint of step 3, then a torn line. The resume drops both and logs steps 4-6 once.
    metrics = tmp_path / "split" / "metrics.jsonl"
    step_3 = next(r for r in map(json.loads, metrics.read_text().splitlines()) if r["step"] == 3 and "loss" in r)
    with open(metrics, "a") as handle:
        handle.write(json.dumps({**step_3, "step": 4}) + "\n" + json.dumps({**step_3, "step": 5})[:40])
    messages = []
    second_half = Trainer(tiny_cfg(small_corpus, tmp_path / "split"), resume="require", out=messages.append).fit()
    assert any("resuming from" in m for m in messages)
    assert second_half.losses == straight.losses[3:]  # bit-identical, not merely close
    records = [json.loads(line) for line in metrics.read_text().splitlines()]  # every line is JSON again
    assert [(r["step"], r["loss"]) for r in records if "loss" in r] == list(enumerate(straight.losses, start=1))
    weights = []
    for run in ("split", "straight"):
        mgr = CheckpointManager(tmp_path / run / "checkpoints", keep_last=1)
        target = {"model": {k: torch.zeros_like(v) for k, v in Llama(tiny_cfg(small_corpus, tmp_path).model).state_dict().items()}}
        mgr.load_sharded(mgr.latest(), target)
        weights.append(target["model"])
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[1])


def test_run_directory_contents_and_learning(small_corpus, tmp_path):
    cfg = tiny_cfg(small_corpus, tmp_path / "run", "--train.steps", "40", "--train.log_every", "10",
                   "--optim.lr", "3e-3", "--schedule.decay_steps", "40", "--train.tensorboard", "true",
                   "--train.plot", "true", "--checkpoint.every", "20")
    summary = Trainer(cfg, out=quiet).fit()
    run = tmp_path / "run"
    assert (run / "config.toml").is_file() and (run / "loss.png").stat().st_size > 1000
    assert any((run / "tensorboard").iterdir())
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["step_00000020", "step_00000040"]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [10, 20, 30, 40]
    assert [r["step"] for r in records if "val_loss" in r] == [40]  # the tiny preset validates at the end
    assert summary.final_loss < math.log(512) - 1.0  # it learns, well below the uniform baseline


def test_resume_modes(small_corpus, tmp_path):
    with pytest.raises(FileNotFoundError, match="no valid checkpoint"):
        Trainer(tiny_cfg(small_corpus, tmp_path / "none"), resume="require", out=quiet)
    Trainer(tiny_cfg(small_corpus, tmp_path / "r", "--train.steps", "3"), out=quiet).fit()
    messages = []
    done = Trainer(tiny_cfg(small_corpus, tmp_path / "r", "--train.steps", "3"), out=messages.append).fit()
    assert done.losses == [] and any("already complete" in m for m in messages)
    fresh = Trainer(tiny_cfg(small_corpus, tmp_path / "r", "--train.steps", "3"), resume="fresh", out=quiet).fit()
    assert len(fresh.losses) == 3
