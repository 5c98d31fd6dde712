"""Expected user errors end an `hlat` command with one message and exit code 2, no traceback;
HLAT_DEBUG=1 (or --debug) adds the traceback. One case per kind of bad input, through hlat.cli.main;
under torchrun, a bad layout is reported once, by rank 0, before any process group starts."""

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from hlat import cli
from hlat.checkpoint.manager import CheckpointManager
from hlat.cli import USER_ERROR_EXIT, main
from hlat.config.model import ModelConfig
from hlat.model import Llama
from hlat.model.hf import hf_config_dict
from hlat.toml_value import toml_value
from llama3_tokenizer import write_llama3_tokenizer
from runs import Scenario, ScenarioResults, tiny_args

TINY = ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=64)


def _weights_checkpoint(run: Path, drop: str | None = None) -> Path:
    """A weights-only checkpoint of TINY in a run directory (as hlat import writes one)."""
    weights = {k: v for k, v in Llama(TINY).state_dict().items() if k != drop}
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.toml").write_text("[model]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in vars(TINY).items()))
    return (
        CheckpointManager(run / "checkpoints", keep_last=None)
        .save(0, {"model": weights}, None, {"progress": {"step": 0}})
        .path
    )


def bad_data_row(tmp: Path, corpus: Path) -> tuple[list[str], str]:
    rows = [{"text": (corpus / name).read_text()} for name in sorted(p.name for p in corpus.iterdir())[:20]]
    rows[3] = {"body": "no text field"}
    (tmp / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = tiny_args(tmp / "data.jsonl", tmp / "run", "--data.bad_documents", "error", "--train.steps", "2")
    return ["train", *args], f"{tmp / 'data.jsonl'}, line 4: no field 'text'"


def refused_hf_config(tmp: Path, corpus: Path) -> tuple[list[str], str]:
    (tmp / "hf").mkdir()
    config = {"model_type": "llama", **hf_config_dict(TINY), "rope_scaling": {"rope_type": "yarn", "factor": 2.0}}
    (tmp / "hf" / "config.json").write_text(json.dumps(config))
    return ["import", str(tmp / "hf"), str(tmp / "run")], "hlat implements the RoPE types linear, llama3 (not 'yarn')"


def corrupt_checkpoint(tmp: Path, corpus: Path) -> tuple[list[str], str]:
    checkpoint = _weights_checkpoint(tmp / "run")
    shard = next((checkpoint / "dcp").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    return ["export", str(checkpoint), str(tmp / "hf")], "fails its SHA-256 check"


def incomplete_weights(tmp: Path, corpus: Path) -> tuple[list[str], str]:
    checkpoint = _weights_checkpoint(tmp / "source", drop="layers.1.feed_forward.w2.weight")
    args = tiny_args(corpus, tmp / "run", "--checkpoint.init_from", str(tmp / "source"), "--train.steps", "1")
    return ["train", *args], f"init_from {checkpoint}: missing tensors layers.1.feed_forward.w2.weight"


def missing_file(tmp: Path, corpus: Path) -> tuple[list[str], str]:
    return ["export", str(tmp / "nowhere"), str(tmp / "hf")], f"{tmp / 'nowhere'} is neither an hlat checkpoint"


_TRAINED: dict[Path, Path] = {}  # corpus -> a run directory trained 1 step on it, copied by each case


def _trained_run(tmp: Path, corpus: Path) -> Path:
    """tmp/run: `hlat train` 1 step with a checkpoint, on tiny_args' default data settings."""
    if corpus not in _TRAINED:
        assert main(["train", *tiny_args(corpus, tmp / "run", "--train.steps", "1", "--checkpoint.every", "1")]) == 0
        _TRAINED[corpus] = tmp / "trained"
        shutil.copytree(tmp / "run", _TRAINED[corpus])
    else:
        shutil.copytree(_TRAINED[corpus], tmp / "run")
    return tmp / "run"


def _refused_resume(run: Path, values: str) -> str:
    """The message of a run directory this configuration cannot resume, found before anything is built."""
    return (
        f"{run} holds a run this configuration cannot resume (step_00000001): {values}; resume it with the "
        "saved values, or start over with --fresh (deletes its checkpoints) or another --train.run_dir"
    )


def resume_with_other_data(tmp: Path, corpus: Path) -> tuple[list[str], str]:
    run = _trained_run(tmp, corpus)
    args = tiny_args(corpus, run, "--train.steps", "2", "--data.seq_len", "16")
    return ["train", *args], _refused_resume(run, "data.seq_len = 32, now 16")


def resume_with_another_model(tmp: Path, corpus: Path) -> tuple[list[str], str]:
    """Another preset's shape in the same run directory: named before the model is built."""
    run = _trained_run(tmp, corpus)
    args = tiny_args(corpus, run, "--train.steps", "2", "--model.d_model", "128", "--model.n_layers", "3")
    return ["train", *args], _refused_resume(run, "model.d_model = 64, now 128; model.n_layers = 2, now 3")


def resume_with_other_tokenizer(tmp: Path, corpus: Path) -> tuple[list[str], str]:
    """The same source, another tokenizer.json (that fits the model's vocabulary): named by its
    setting, not by a fingerprint."""
    run = _trained_run(tmp, corpus)
    other = write_llama3_tokenizer(tmp / "other.json")
    args = tiny_args(corpus, run, "--train.steps", "2", "--data.tokenizer", str(other))
    return ["train", *args], _refused_resume(run, f'data.tokenizer = "", now "{other}"')


def resume_with_a_changed_tokenizer_file(tmp: Path, corpus: Path) -> tuple[list[str], str]:
    """The same data.tokenizer path, another tokenizer in it: found when the data position is restored,
    and named without the data's internal fingerprints."""
    tokenizer = write_llama3_tokenizer(tmp / "tok.json")
    args = tiny_args(corpus, tmp / "run", "--data.tokenizer", str(tokenizer), "--checkpoint.every", "1")
    assert main(["train", *args, "--train.steps", "1"]) == 0
    write_llama3_tokenizer(tokenizer, vocab_size=300)
    return ["train", *args, "--train.steps", "2"], (
        f"{tmp / 'run' / 'checkpoints' / 'step_00000001'}: cannot resume the data loader: the checkpoint was "
        "made with a different tokenizer (its vocabulary or merges differ from the tokenizer the checkpoint "
        "was made with); resume with that data.tokenizer (the run directory keeps a copy: tokenizer.json)"
    )


def resume_with_other_max_doc_chars(tmp: Path, corpus: Path) -> tuple[list[str], str]:
    run = _trained_run(tmp, corpus)
    args = tiny_args(corpus, run, "--train.steps", "2", "--data.max_doc_chars", "5000")
    return ["train", *args], _refused_resume(run, "data.max_doc_chars = 100000, now 5000")


def _parquet(tmp: Path, corpus: Path, column: str = "content") -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [(corpus / name).read_text() for name in sorted(p.name for p in corpus.iterdir())[:20]]
    pq.write_table(pa.table({column: texts}), tmp / "data.parquet")
    return tmp / "data.parquet"


def train_on_a_missing_column(tmp: Path, corpus: Path) -> tuple[list[str], str]:
    data = _parquet(tmp, corpus)
    return ["train", *tiny_args(data, tmp / "run", "--train.steps", "1")], (
        f"{data} has no column 'text' (columns: content); set data.text_field to the column that holds the documents"
    )


def prepare_a_missing_column(tmp: Path, corpus: Path) -> tuple[list[str], str]:
    data = _parquet(tmp, corpus)
    return ["prepare", "--data.source", str(data), "--out", str(tmp / "run")], f"{data} has no column 'text'"


def tokenizer_on_a_missing_column(tmp: Path, corpus: Path) -> tuple[list[str], str]:
    """The tokenizer command names its own flag, not the config field."""
    data = _parquet(tmp, corpus)
    args = ["tokenizer", "train", str(data), "--vocab-size", "300", "--out", str(tmp / "run" / "t.json")]
    return args, "set --text-field to the column that holds the documents"


def tokenizer_vocabulary_too_small(tmp: Path, corpus: Path) -> tuple[list[str], str]:
    args = ["tokenizer", "train", str(corpus), "--vocab-size", "100", "--out", str(tmp / "run" / "t.json")]
    return args, "it needs at least 257 (256 bytes + EOS); set --vocab-size 257 or more"


def corrupt_parquet(tmp: Path, corpus: Path) -> tuple[list[str], str]:
    data = _parquet(tmp, corpus, column="text")
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    return ["train", *tiny_args(data, tmp / "run", "--train.steps", "1")], f"cannot read {data} as Parquet"


def no_documents(tmp: Path, corpus: Path) -> tuple[list[str], str]:
    (tmp / "empty.jsonl").write_text("")
    args = tiny_args(tmp / "empty.jsonl", tmp / "run", "--train.steps", "1")
    return ["train", *args], "has no documents; give a source with at least one row"


def tokenizer_without_eos(tmp: Path, corpus: Path) -> tuple[list[str], str]:
    import tokenizers

    tokenizers.Tokenizer(tokenizers.models.WordLevel({"a": 0, "b": 1}, unk_token="a")).save(str(tmp / "tok.json"))
    args = tiny_args(corpus, tmp / "run", "--train.steps", "1", "--data.tokenizer", str(tmp / "tok.json"))
    return ["train", *args], f"tokenizer {tmp / 'tok.json'} has no end-of-document token"


def shards_made_differently(tmp: Path, corpus: Path) -> tuple[list[str], str]:
    """`hlat prepare` into a directory that holds shards of other settings."""
    args = ["prepare", "--data.source", str(corpus), "--model.vocab_size", "512", "--out", str(tmp / "run")]
    assert main([*args, "--data.max_doc_chars", "5000"]) == 0
    return args, f"{tmp / 'run'} holds shards made differently"


def invalid_config(tmp: Path, corpus: Path) -> tuple[list[str], str]:
    return ["train", "--train.steps", "0"], "train.steps: must be >= 1"


def _files(run: Path) -> dict[str, bytes]:
    return (
        {str(f.relative_to(run)): f.read_bytes() for f in sorted(run.rglob("*")) if f.is_file()} if run.is_dir() else {}
    )


CASES: list[Callable[[Path, Path], tuple[list[str], str]]] = [
    bad_data_row,
    refused_hf_config,
    corrupt_checkpoint,
    incomplete_weights,
    missing_file,
    resume_with_other_data,
    resume_with_another_model,
    resume_with_other_tokenizer,
    resume_with_a_changed_tokenizer_file,
    resume_with_other_max_doc_chars,
    invalid_config,
    train_on_a_missing_column,
    prepare_a_missing_column,
    tokenizer_on_a_missing_column,
    tokenizer_vocabulary_too_small,
    corrupt_parquet,
    no_documents,
    tokenizer_without_eos,
    shards_made_differently,
]


@pytest.mark.parametrize("case", CASES, ids=[c.__name__ for c in CASES])
def test_expected_errors_print_one_message_and_exit_2(case, tmp_path, small_corpus, capsys, monkeypatch):
    argv, message = case(tmp_path, small_corpus)
    run = tmp_path / "run"
    before, existed = _files(run), run.exists()
    monkeypatch.delenv("HLAT_DEBUG", raising=False)
    capsys.readouterr()
    assert main(argv) == USER_ERROR_EXIT
    err = capsys.readouterr().err
    assert f"hlat {argv[0]}: " in err and message in err, err
    assert "Traceback" not in err
    # a refused command leaves the run as it was (a refused resume: its config and tokenizer), or creates none
    assert _files(run) == before and run.exists() == existed
    # the debug switch: the same message and code, with the traceback
    monkeypatch.setenv("HLAT_DEBUG", "1")
    assert main(argv) == USER_ERROR_EXIT
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and message in err


def test_debug_flag_and_other_ranks(capsys, monkeypatch):
    monkeypatch.delenv("HLAT_DEBUG", raising=False)
    assert main(["--debug", "config", "--train.steps", "0"]) == USER_ERROR_EXIT
    assert "Traceback" in capsys.readouterr().err
    assert main(["config", "--debug", "--train.steps", "0"]) == USER_ERROR_EXIT
    assert "Traceback" in capsys.readouterr().err
    # under torchrun, before the process group starts, every rank has the same error: rank 0 says it
    monkeypatch.setenv("RANK", "1")
    assert main(["config", "--train.steps", "0"]) == USER_ERROR_EXIT
    assert capsys.readouterr().err == ""
    # once the group has started an error may concern one rank: each rank that meets it says so, then
    # leaves without interpreter teardown (os._exit, replaced here so that pytest survives it)
    monkeypatch.setattr(cli, "_process_group_started", lambda: True)

    def leave(code: int) -> None:
        raise SystemExit(code)

    monkeypatch.setattr(cli.os, "_exit", leave)
    with pytest.raises(SystemExit) as left:
        main(["config", "--train.steps", "0"])
    assert left.value.code == USER_ERROR_EXIT
    assert (
        capsys.readouterr().err == "hlat config (rank 1): invalid configuration:\n  train.steps: must be >= 1, got 0\n"
    )


# a launch of its own (torchrun's report of a failed rank), started from the shared launch (tests/launch_runs.py)
BAD_LAYOUT = ["-m", "hlat", "train", "--parallel.tp", "3", "--train.run_dir", "{out}/run"]
SCENARIOS = [Scenario("bad-layout-torchrun", "launch_runs.py:command", kwargs={"nproc": 2, "target": BAD_LAYOUT})]


def test_a_bad_layout_is_reported_once_under_torchrun(scenarios: ScenarioResults):
    """The layout is checked before any process group starts; rank 0 alone prints it."""
    out = scenarios.path("bad-layout-torchrun")
    done = SimpleNamespace(**scenarios.json("bad-layout-torchrun", "result.json"))
    assert done.returncode != 0
    assert done.stderr.count("hlat train: invalid configuration") == 1, done.stderr[-3000:]
    assert "parallel.tp: tp=3 x pp=1 = 3 does not divide the world size 2" in done.stderr
    assert "exitcode  : 2" in done.stderr and "hlat/cli.py" not in done.stderr  # torchrun's own report only
    assert not (out / "run").exists()  # nothing started
