"""Two torchrun "nodes" on this machine rendezvous over 127.0.0.1 (c10d) and train together."""

import os
import socket
import subprocess
from pathlib import Path

import runs

SCRIPT = Path(__file__).parents[2] / "scripts" / "two_nodes_local.sh"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_rendezvous_and_train(small_corpus, tmp_path):
    env = {
        **os.environ,
        "HLAT_CACHE": str(tmp_path / "cache"),
        "HLAT_RDZV_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
    }
    overrides = [
        "--data.source", str(small_corpus), "--model.vocab_size", "512", "--model.d_model", "64",
        "--model.n_layers", "2", "--model.n_heads", "4", "--model.n_kv_heads", "2", "--model.ffn_dim", "128",
        "--model.max_seq_len", "64", "--data.seq_len", "32", "--train.global_batch", "4", "--train.micro_batch", "2",
        "--train.steps", "2", "--train.log_every", "1", "--train.tensorboard", "false", "--train.plot", "false",
        "--data.val_source", "", "--eval.every", "0", "--train.run_dir", str(tmp_path / "run"),
    ]  # fmt: skip
    runs.wait_for_shared_launch()
    done = subprocess.run(["bash", str(SCRIPT), "1", *overrides], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "on 2 x cpu (pp 1 x dp 2 x tp 1" in done.stdout and "done: step 2" in done.stdout
