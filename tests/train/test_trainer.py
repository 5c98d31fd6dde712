import json
import math
import shutil

import pytest
import torch

from hlat.checkpoint.hf_export import export_hf
from hlat.checkpoint.manager import CheckpointManager
from hlat.config.layout import Degrees
from hlat.config.load import load_config
from hlat.config.model import ModelConfig
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.data.batch import Batch
from hlat.model import Llama
from hlat.parallel.mesh import Layout
from hlat.parallel.parallelize import build_parallel_model
from hlat.train.optimizers import Optimizers
from hlat.train.step import train_step
from hlat.train.trainer import Trainer


def tiny_cfg(corpus, run_dir, *extra: str):
    overrides = [
        "--data.source", str(corpus), "--model.vocab_size", "512", "--model.d_model", "64", "--model.n_layers", "2",
        "--model.n_heads", "4", "--model.n_kv_heads", "2", "--model.ffn_dim", "128", "--model.max_seq_len", "64",
        "--data.seq_len", "32", "--train.global_batch", "4", "--train.micro_batch", "2", "--train.steps", "6",
        "--train.log_every", "1", "--precision.mode", "fp32", "--train.run_dir", str(run_dir),
        "--checkpoint.every", "3", "--schedule.warmup_steps", "2", "--schedule.decay_steps", "6",
        "--train.tensorboard", "false", "--train.plot", "false", "--train.peak_tflops", "1", *extra,
    ]  # fmt: skip
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
        model = build_parallel_model(
            cfg,
            parallel=ParallelConfig(),
            layout=Layout(1, 0, Degrees(), None),
            device=torch.device("cpu"),
            seed=1,
            n_microbatches=8 // micro,
            precision=PrecisionConfig(mode="fp32"),
        )
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


class Stopped(Exception):
    """The process ending mid-step (a SIGKILL in a real run; here the step's frame unwinds)."""


def test_resume_is_exact(small_corpus, tmp_path, monkeypatch):
    """A run stopped between the micro-batches of step 4 (after the checkpoint of step 3) resumes
    from step 3 and redoes step 4 whole: losses, records and weights equal the uninterrupted run's."""
    straight = Trainer(tiny_cfg(small_corpus, tmp_path / "straight"), out=quiet).fit()
    split = Trainer(tiny_cfg(small_corpus, tmp_path / "split"), out=quiet)
    real = split.model.forward_backward

    def stopped_in_step_4(batches, n_targets):
        if split.step == 3:  # one of the step's two micro-batches forward and backward, then stop
            real(batches[:1], n_targets)
            raise Stopped
        return real(batches, n_targets)

    monkeypatch.setattr(split.model, "forward_backward", stopped_in_step_4)
    with pytest.raises(Stopped):
        split.fit()
    # As a run killed during step 5's record would leave metrics.jsonl: step 4 logged after the
    # checkpoint of step 3, then a torn line. The resume drops both and logs steps 4-6 once.
    metrics = tmp_path / "split" / "metrics.jsonl"
    step_3 = next(r for r in map(json.loads, metrics.read_text().splitlines()) if r["step"] == 3 and "loss" in r)
    with open(metrics, "a") as handle:
        handle.write(json.dumps({**step_3, "step": 4}) + "\n" + json.dumps({**step_3, "step": 5})[:40])
    messages = []
    second_half = Trainer(tiny_cfg(small_corpus, tmp_path / "split"), resume="require", out=messages.append).fit()
    assert any(f"resuming from {tmp_path / 'split' / 'checkpoints' / 'step_00000003'}" in m for m in messages)
    assert second_half.losses == straight.losses[3:]  # bit-identical, not merely close
    records = [json.loads(line) for line in metrics.read_text().splitlines()]  # every line is JSON again
    assert [(r["step"], r["loss"]) for r in records if "loss" in r] == list(enumerate(straight.losses, start=1))
    weights = []
    for run in ("split", "straight"):
        mgr = CheckpointManager(tmp_path / run / "checkpoints", keep_last=1)
        target = {
            "model": {
                k: torch.zeros_like(v) for k, v in Llama(tiny_cfg(small_corpus, tmp_path).model).state_dict().items()
            }
        }
        mgr.load_sharded(mgr.latest(), target)
        weights.append(target["model"])
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[1])


def test_run_directory_contents_and_learning(small_corpus, tmp_path):
    cfg = tiny_cfg(
        small_corpus,
        tmp_path / "run",
        "--train.steps",
        "40",
        "--train.log_every",
        "10",
        "--optim.lr",
        "3e-3",
        "--schedule.decay_steps",
        "40",
        "--train.tensorboard",
        "true",
        "--train.plot",
        "true",
        "--checkpoint.every",
        "20",
    )
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


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.model.raw_parts[0].state_dict().items()}


def _checkpoint_weights(path, model_cfg) -> dict[str, torch.Tensor]:
    target = {"model": {k: torch.zeros_like(v) for k, v in Llama(model_cfg).state_dict().items()}}
    CheckpointManager(path.parent, keep_last=None).load_sharded(path, target)
    return target["model"]


def test_init_from_is_ignored_once_the_run_has_a_checkpoint(small_corpus, tmp_path):
    """A job restarted with --checkpoint.init_from (an hlat run, or hf:DIR) resumes its own
    checkpoint: "resuming from", the next step, the checkpoint's weights and optimizer state."""
    one = (
        "--train.global_batch",
        "2",
        "--checkpoint.every",
        "1",
        "--schedule.warmup_steps",
        "0",  # step 1 at a real LR
        "--eval.every",
        "0",
        "--train.steps",
    )
    Trainer(tiny_cfg(small_corpus, tmp_path / "source", *one, "1"), out=quiet).fit()
    hf = export_hf(tmp_path / "source", tmp_path / "hf").out
    source = _checkpoint_weights(
        tmp_path / "source" / "checkpoints" / "step_00000001", tiny_cfg(small_corpus, tmp_path).model
    )
    for name, spec in (("from-hlat", str(tmp_path / "source")), ("from-hf", f"hf:{hf}")):
        run, init = tmp_path / name, ("--checkpoint.init_from", spec)
        messages = []
        first = Trainer(tiny_cfg(small_corpus, run, *init, *one, "1"), out=messages.append)
        assert any(m.startswith("initialised from") for m in messages), messages
        assert all(torch.equal(w, source[k]) for k, w in _weights(first).items())
        first.fit()
        messages = []
        again = Trainer(tiny_cfg(small_corpus, run, *init, *one, "2"), out=messages.append)
        assert any(m.startswith(f"resuming from {run / 'checkpoints' / 'step_00000001'} (step 1,") for m in messages), (
            messages
        )
        assert not any("initialised from" in m for m in messages), messages
        assert again.step == 1 and again.optimizers.optimizers[0].state  # the checkpoint's optimizer, not a new one
        saved, now = _checkpoint_weights(run / "checkpoints" / "step_00000001", again.cfg.model), _weights(again)
        assert all(torch.equal(now[k], saved[k]) for k in saved)
        assert any(not torch.equal(now[k], source[k]) for k in source)  # one step away from the init source
        summary = again.fit()
        assert summary.step == 2 and len(summary.losses) == 1
        records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records if "loss" in r] == [1, 2]


def test_resume_drops_metrics_and_events_written_after_the_checkpoint(small_corpus, tmp_path):
    """A run with TensorBoard logs steps 1-3 with checkpoints at 2 and 3; losing the one at 3 (as a
    kill before its commit would) makes the next run resume from 2 and redo step 3: every scalar
    and every metrics.jsonl record holds each step once, with the resumed run's values."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    args = ("--train.global_batch", "2", "--train.steps", "3", "--checkpoint.every", "2", "--train.tensorboard", "true")
    Trainer(tiny_cfg(small_corpus, run, *args), out=quiet).fit()
    shutil.rmtree(run / "checkpoints" / "step_00000003")
    first = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if "loss" in r}
    messages = []
    Trainer(tiny_cfg(small_corpus, run, *args), out=messages.append).fit()
    assert any(m.startswith(f"resuming from {run / 'checkpoints' / 'step_00000002'}") for m in messages), messages
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3]
    assert [r["step"] for r in records if "val_loss" in r] == [3]  # the tiny preset validates at the end
    logged = {r["step"]: r for r in records if "loss" in r}
    assert logged[3]["tokens_per_s"] != first[3]["tokens_per_s"]  # step 3's record is the resumed run's
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    assert "train/loss" in tags and "val/loss" in tags
    for tag in tags:
        steps = [e.step for e in events.Scalars(tag)]
        assert steps == ([3] if tag == "val/loss" else [1, 2, 3]), (tag, steps)
    for key in ("loss", "tokens_per_s"):
        kept = {e.step: e.value for e in events.Scalars(f"train/{key}")}
        assert kept == {step: pytest.approx(r[key], rel=1e-6) for step, r in logged.items()}, key
