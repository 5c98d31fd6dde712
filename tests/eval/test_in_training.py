"""Downstream tasks during training: logged at their steps, scored on the current weights (also
when they are sharded across processes), and invisible to training itself."""

from __future__ import annotations

import copy
import json
import random
import shutil
from pathlib import Path

import pytest
import torch

import runs
from hlat.checkpoint.loading import load_model
from hlat.config.eval import EvalConfig
from hlat.config.layout import Degrees
from hlat.config.load import load_config
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.errors import ConfigError
from hlat.eval import EvalOptions, LanguageModel, evaluate_task
from hlat.eval.in_training import InTrainingTasks
from hlat.eval.tasks import TASKS, DataMissing, task_name_problems
from hlat.metrics.sinks import read_metrics
from hlat.parallel.mesh import Layout
from hlat.parallel.parallelize import build_parallel_model
from hlat.train.trainer import Trainer

CPU = torch.device("cpu")
TASK_NAMES = ("arc_easy", "perplexity")


def tiny_args(corpus: Path, run_dir: Path, *extra: str) -> list[str]:
    return runs.tiny_args(
        corpus, run_dir, "--train.global_batch", "4", "--train.steps", "5", "--checkpoint.every", "100", *extra
    )


def task_args(task_dir: Path, every: int) -> list[str]:
    return [
        "--eval.tasks",
        ",".join(TASK_NAMES),
        "--eval.tasks_every",
        str(every),
        "--eval.tasks_limit",
        "4",
        "--eval.data_dir",
        str(task_dir),
    ]


def direct_scores(model: torch.nn.Module, tokenizer, task_dir: Path) -> dict[str, float]:
    """The same tasks through the harness as `hlat eval` runs them, on a copy of `model`."""
    lm = LanguageModel(copy.deepcopy(model), tokenizer, progress=False)
    scores = {}
    for name in TASK_NAMES:
        result = evaluate_task(lm, TASKS[name], EvalOptions(data_dir=task_dir, limit=4))
        scores.update({f"{name}/{metric}": v["value"] for metric, v in result.metrics.items()})
    return scores


def test_tasks_logged_at_their_steps_and_training_unchanged(small_corpus, task_dir, tmp_path) -> None:
    plain = Trainer(load_config("tiny", None, tiny_args(small_corpus, tmp_path / "plain")), out=lambda _: None).fit()
    cfg = load_config(
        "tiny",
        None,
        tiny_args(small_corpus, tmp_path / "tasks", "--train.tensorboard", "true", *task_args(task_dir, 2)),
    )
    trainer = Trainer(cfg, out=lambda _: None)
    summary = trainer.fit()
    assert summary.losses == plain.losses  # bit for bit: no training randomness was drawn
    assert trainer.model.parts[0].training

    records = [r for r in read_metrics(tmp_path / "tasks") if "eval/arc_easy/acc" in r]
    assert [(r["step"], r["tokens"]) for r in records] == [(2, 256), (4, 512), (5, 640)]  # every 2, and the last
    final = direct_scores(trainer.model.raw_parts[0], trainer.tokenizer, task_dir)
    assert {k.removeprefix("eval/"): v for k, v in records[-1].items() if k.startswith("eval/")} == pytest.approx(
        final, rel=1e-6
    )
    assert records[0]["eval/perplexity/bits_per_byte"] != records[-1]["eval/perplexity/bits_per_byte"]

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tasks" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("eval/perplexity/bits_per_byte")] == [2, 4, 5]


def test_run_reads_documents_once_and_draws_no_randomness(model_config, tokenizer, task_dir) -> None:
    layout = Layout(1, 0, Degrees(), None)
    model = build_parallel_model(
        model_config,
        parallel=ParallelConfig(),
        layout=layout,
        device=CPU,
        seed=0,
        n_microbatches=1,
        precision=PrecisionConfig(mode="fp32"),
    )
    cfg = EvalConfig(tasks=",".join(TASK_NAMES), tasks_every=1, tasks_limit=4, data_dir=str(task_dir))
    probe = InTrainingTasks(cfg, model_config, tokenizer, layout, CPU, "fp32")
    expected = direct_scores(model.raw_parts[0], tokenizer, task_dir)
    shutil.rmtree(task_dir)  # read when built: evaluating needs no files
    model.train()
    torch_rng, python_rng = torch.get_rng_state(), random.getstate()
    for _ in range(2):
        scores, seconds = probe.run(model.parts)
        assert scores == pytest.approx(expected, rel=1e-6) and seconds > 0
    assert torch.equal(torch.get_rng_state(), torch_rng) and random.getstate() == python_rng
    assert model.parts[0].training

    with pytest.raises(DataMissing, match="eval.data_dir"):  # a missing file fails before training starts
        InTrainingTasks(
            EvalConfig(tasks="perplexity", tasks_every=1, data_dir=str(task_dir.parent)),
            model_config,
            tokenizer,
            layout,
            CPU,
            "fp32",
        )


def test_bad_settings_name_the_field(tmp_path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(
            "tiny",
            None,
            [
                "--eval.tasks",
                "arc_esy",
                "--eval.tasks_every",
                "-1",
                "--eval.tasks_limit",
                "0",
                "--eval.tasks_shots",
                "-2",
                "--eval.data_dir",
                str(tmp_path / "none"),
            ],
            checks=(task_name_problems,),  # as every command loads it (hlat.commands.common)
        )
    assert [field for field, _ in err.value.problems] == [  # the registry's check comes after the sections'
        "eval.tasks_every",
        "eval.tasks_limit",
        "eval.tasks_shots",
        "eval.data_dir",
        "eval.tasks",
    ]
    with pytest.raises(ConfigError, match="eval.tasks_every: is 10 but eval.tasks is empty"):
        load_config("tiny", None, ["--eval.tasks_every", "10"])
    with pytest.raises(ConfigError, match="eval.tasks: 'piqa' would never run"):
        load_config("tiny", None, ["--eval.tasks", "piqa"])
    cfg = load_config("tiny", None, ["--eval.tasks", "piqa, boolq", "--eval.tasks_every", "100"])
    assert cfg.eval.task_names() == ["piqa", "boolq"] and cfg.eval.tasks_due(200, 250) and cfg.eval.tasks_due(250, 250)
    assert not EvalConfig().tasks_due(100, 100)


# pp2 takes the path that sends pipeline stages to rank 0; fsdp2 gathers DTensors through DCP.
SHARDED = {"fsdp2": ["--parallel.dp_sharding", "fsdp"], "pp2": ["--parallel.pp", "2"]}
SCENARIOS = [runs.Scenario("in-training-tasks", "eval/task_files.py:tiny_tasks_scenario")] + [
    runs.Scenario(
        f"in-training-{name}",
        "train/layout_runs.py:train",
        2,
        {
            "steps": 2,
            "extra": [
                "--train.global_batch",
                "4",
                "--checkpoint.every",
                "2",
                *task_args(Path("{root}/in-training-tasks/tasks"), 2),
                *layout,
            ],
        },
    )
    for name, layout in SHARDED.items()
]


@pytest.mark.parametrize("layout", SHARDED)
def test_sharded_weights_are_gathered_under_torchrun(scenarios: runs.ScenarioResults, layout: str) -> None:
    out, task_dir = scenarios.path(f"in-training-{layout}"), scenarios.path("in-training-tasks") / "tasks"
    record = [r for r in read_metrics(out / "run") if "eval/arc_easy/acc" in r]
    assert [r["step"] for r in record] == [2]
    logged = {k.removeprefix("eval/"): v for k, v in record[0].items() if k.startswith("eval/")}
    saved = load_model(out / "run" / "checkpoints" / "step_00000002")  # the weights that were evaluated
    assert logged == pytest.approx(direct_scores(saved.model, saved.tokenizer, task_dir), rel=1e-5)
    assert "tasks took" in json.loads((out / "summary.rank0.json").read_text())["console"]
