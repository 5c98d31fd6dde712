"""`hlat train` is the same command under torchrun: 4 gloo processes, 2-D layouts, resume."""

import json
import os
import subprocess
import sys

import pytest


def torchrun_train(run_dir, corpus, cache, *extra):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4", "-m", "hlat", "train",
           "--data.source", str(corpus), "--model.vocab_size", "512", "--model.d_model", "64", "--model.n_layers", "4",
           "--model.n_heads", "4", "--model.n_kv_heads", "2", "--model.ffn_dim", "128", "--model.max_seq_len", "64",
           "--data.seq_len", "32", "--train.global_batch", "8", "--train.micro_batch", "2", "--train.log_every", "1",
           "--train.tensorboard", "false", "--train.run_dir", str(run_dir), "--checkpoint.every", "2", *extra]
    env = {**os.environ, "HLAT_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


@pytest.mark.parametrize("layout", [["--parallel.tp", "2", "--parallel.dp_sharding", "zero2"],
                                    ["--parallel.pp", "2", "--parallel.dp_sharding", "fsdp"]], ids=["tp2xdp2", "pp2xdp2"])
def test_train_and_resume_under_torchrun(small_corpus, tmp_path, layout):
    run = tmp_path / "run"
    out = torchrun_train(run, small_corpus, tmp_path / "cache", "--train.steps", "2", *layout)
    assert "dp 2 x tp 2" in out or "pp 2 x dp 2" in out
    out = torchrun_train(run, small_corpus, tmp_path / "cache", "--train.steps", "4", *layout)
    assert "resuming from" in out and "done: step 4" in out
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "loss" in r]
    assert steps == [1, 2, 3, 4]
