import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from hlat.cli import main


def test_params_reports_llama2_counts(capsys):
    assert main(["params", "hlat-7b"]) == 0
    assert "6,738,415,616 parameters" in capsys.readouterr().out
    assert main(["params", "hlat-70b"]) == 0
    assert "68,976,648,192 parameters" in capsys.readouterr().out


def test_params_states_the_flop_formula_of_its_family(capsys):
    """Qwen3's attention is n_heads x head_dim wide, not d_model (hlat.model.qwen3)."""
    assert main(["params", "hlat-7b"]) == 0
    assert "4.609e+10 (6N + 12·L·d·T)" in capsys.readouterr().out
    assert main(["params", "qwen3-0.6b"]) == 0
    assert "6.395e+09 (6N + 12·L·(n_heads·head_dim)·T)" in capsys.readouterr().out


def test_config_errors_exit_2_with_the_field(capsys):
    assert main(["train", "--model.n_heads", "7"]) == 2
    err = capsys.readouterr().err
    assert "model.n_heads" in err or "model.d_model" in err


def test_help_texts_stand_alone():
    for args in ([], ["train"], ["params"], ["config"]):
        out = subprocess.run(
            [sys.executable, "-m", "hlat", *args, "--help"], capture_output=True, text=True, check=True
        ).stdout
        assert "usage: hlat" in out
    train_help = subprocess.run(
        [sys.executable, "-m", "hlat", "train", "--help"], capture_output=True, text=True
    ).stdout
    assert "--optim.lr" in train_help and "--resume" in train_help
    import_help = " ".join(
        subprocess.run(
            [sys.executable, "-m", "hlat", "import", "--help"], capture_output=True, text=True
        ).stdout.split()
    )
    (refused,) = [s for s in import_help.split(". ") if "refused" in s]
    assert "Tied embeddings, RoPE scaling" in import_help and not any(w in refused for w in ("tied", "bias", "scaling"))


def test_train_end_to_end_on_the_embedded_corpus(tmp_path):
    """The README's first command, shortened: the default corpus, tokenizer and tiny preset."""
    run = tmp_path / "run"
    env = {**os.environ, "HLAT_CACHE": str(tmp_path / "cache")}
    cmd = [
        sys.executable, "-m", "hlat", "train", "--train.steps", "4", "--train.log_every", "2",
        "--data.tokenizer_train_chars", "300000", "--train.run_dir", str(run),
    ]  # fmt: skip
    started = time.time()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr
    assert "tokenizer:" in out.stdout and "standard library" in out.stdout
    assert "done: step 4" in out.stdout
    # the long start-up phases say what they are doing before they start
    for phase in (
        "tokenizer: loading or training a byte-level BPE ...",
        "data: opening data.source",
        "model: building",
    ):
        assert phase in out.stdout, out.stdout
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert [r["step"] for r in train] == [2, 4]
    assert {"loss", "ppl", "lr", "grad_norm", "param_norm", "tokens_per_s", "tokens", "mfu"} <= set(train[0])
    # wall time in the records, elapsed time and ETA to train.steps on the lines
    assert started < train[0]["time"] < train[1]["time"] < time.time()
    assert 0 < train[0]["elapsed_s"] < train[1]["elapsed_s"] and train[0]["eta_s"] > 0 and train[1]["eta_s"] == 0
    assert re.search(r"^step +2 \|.*\| elapsed \d+:\d\d \| eta \d+:\d\d$", out.stdout, re.M), out.stdout
    (source_tokens,) = train[-1]["source_tokens"].values()  # one source: its count is every token read
    assert source_tokens == train[-1]["tokens"]
    # the tiny preset validates on its held-out files at the end of the run
    assert [r["step"] for r in records if "val_loss" in r] == [4]
    assert (run / "tokenizer.json").is_file()
    assert (run / "checkpoints" / "step_00000004" / "manifest.json").is_file()
    # the README's table of what the run directory holds is what this run left, no more, no less
    held = {p.name + ("/" if p.is_dir() else "") for p in run.iterdir()}
    assert held == readme_run_directory(), "README.md's run-directory table and a real run differ"


def readme_run_directory() -> set[str]:
    """The first path of each row of README.md's table under "The run directory ... then holds:",
    as a name in the run directory (`checkpoints/step_NNNNNNNN/` is `checkpoints/`)."""
    text = (Path(__file__).parents[2] / "README.md").read_text()
    table = text.split("then holds:", 1)[1].split("\n\n", 2)[1]
    names = re.findall(r"^\| `([^`]+)` \|", table, re.M)
    return {name.split("/", 1)[0] + "/" if "/" in name else name for name in names}


CONFIG_ERRORS_WITHOUT_TORCH = """
import json, sys
from hlat.cli import main
codes = [
    main(["train", "--trian.steps", "5"]),
    main(["train", "--train.steps", "five"]),
    main(["plan", "--world", "8", "--trian.steps", "5"]),
    main(["params", "tiny", "--trian.steps", "5"]),
    main(["doctor", "--trian.steps", "5"]),
]
print(json.dumps({"codes": codes, "torch": "torch" in sys.modules}))
"""


def test_config_errors_are_reported_before_torch_is_imported():
    """A typo costs a fraction of a second, not the seconds torch's import takes (one process:
    the first command to import torch would hide the others')."""
    done = subprocess.run(
        [sys.executable, "-c", CONFIG_ERRORS_WITHOUT_TORCH], capture_output=True, text=True, timeout=120
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"codes": [2] * 5, "torch": False}, done.stderr
    assert done.stderr.count("trian.steps: unknown section 'trian'; did you mean 'train'?") == 4
    assert "hlat train: invalid configuration:\n  train.steps: expected int, got 'five'" in done.stderr


def test_a_mistyped_flag_names_the_flag_it_is_close_to(capsys):
    assert main(["eval", "--checkpoint", "run", "--out", "results", "--task", "boolq"]) == 2
    err = capsys.readouterr().err
    assert "--out: did you mean --output?; --task: did you mean --tasks?; see hlat eval --help" in err
    # a command that takes config overrides: an undotted --x close to its flag is that flag
    assert main(["plan", "--world", "8", "--devcie", "trn1"]) == 2
    assert "unrecognized arguments: --devcie; --devcie: did you mean --device?" in capsys.readouterr().err
    assert main(["train", "--fersh=1"]) == 2
    assert "unrecognized arguments: --fersh=1; --fersh: did you mean --fresh?" in capsys.readouterr().err
