"""The in-training validation hook, and `hlat eval` on a checkpoint, a HF directory and a run."""

from __future__ import annotations

import json
import re

import pytest
import torch
import torch.nn.functional as F

from deps import require
from export import save_hf, save_run
from hlat.cli import main
from hlat.config.eval import EvalConfig
from hlat.config.layout import Degrees
from hlat.config.model import ModelConfig
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.data.batch import Batch, labels_for
from hlat.parallel.mesh import Layout
from hlat.parallel.parallelize import build_parallel_model
from task_files import ARC_ROWS, write_jsonl


def test_validation_loss_is_the_mean_target_loss() -> None:
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=16)
    model = build_parallel_model(
        cfg,
        parallel=ParallelConfig(),
        layout=Layout(1, 0, Degrees(), None),
        device=torch.device("cpu"),
        seed=0,
        n_microbatches=1,
        precision=PrecisionConfig(mode="fp32"),
    )
    gen = torch.Generator().manual_seed(0)
    tokens = [torch.randint(0, 64, (2, 16), generator=gen) for _ in range(3)]
    batches = [Batch(t, labels_for(t)) for t in tokens]
    loss = model.validation_loss(batches)
    assert model.parts[0].training  # restored
    with torch.no_grad():
        parts = [
            F.cross_entropy(
                model.parts[0](b.tokens).flatten(0, 1), b.labels.flatten(), ignore_index=-100, reduction="sum"
            )
            for b in batches
        ]
    assert loss == pytest.approx(sum(p.item() for p in parts) / (3 * 2 * 15), rel=1e-6)
    assert model.validation_loss(batches) == loss  # fixed data: the same number
    assert EvalConfig(every=100).due(200) and not EvalConfig().due(200)
    assert [f for f, _ in EvalConfig(every=-1, batches=0).validate()] == ["every", "batches"]


def test_cli_on_hf_dir_and_run_sweep(model, tokenizer_file, tmp_path, capsys) -> None:
    require("transformers")
    write_jsonl(tmp_path / "data" / "arc_easy" / "test.jsonl", ARC_ROWS)
    hf = save_hf(tmp_path / "hf", model, tokenizer_file)
    capsys.readouterr()  # transformers' own bars, writing the model
    out = tmp_path / "out"
    assert (
        main(
            [
                "eval",
                "--checkpoint",
                str(hf),
                "--tasks",
                "arc_easy,mmlu",
                "--data-dir",
                str(tmp_path / "data"),
                "--output",
                str(out),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    results = json.loads((out / "results.json").read_text())
    assert results["tasks"]["arc_easy"]["n"] == 6 and "mmlu" in results["skipped"]
    shown = capsys.readouterr()
    assert "| arc_easy | commonsense | acc |" in shown.out
    # progress in a log (not a terminal): plain lines, no carriage-return redraws
    assert "\r" not in shown.err and re.search(r"^loglikelihood: \d+/\d+ request \(100%\)", shown.err, re.M), shown.err

    run = save_run(tmp_path / "run", model, tokenizer_file, [10, 20, 30])
    assert (
        main(
            [
                "eval",
                "--checkpoint",
                str(run),
                "--tasks",
                "arc_easy",
                "--data-dir",
                str(tmp_path / "data"),
                "--limit",
                "3",
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    rows = json.loads((run / "eval" / "sweep.json").read_text())
    assert [r["tokens"] for r in rows] == [5120, 10240, 15360]
    assert (run / "eval" / "sweep.png").stat().st_size > 1000
    assert main(["eval", "--checkpoint", str(tmp_path / "nowhere"), "--tasks", "arc_easy"]) == 2
    assert "neither an hlat checkpoint" in capsys.readouterr().err
