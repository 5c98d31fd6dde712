"""Hostile Hugging Face model directories, on each of the three paths that read one (`hlat import`,
`--checkpoint.init_from hf:DIR`, `hlat eval --checkpoint HF_DIR`): every config.json field is
type- and range-checked, absurd sizes are refused against the machine's memory before anything is
allocated, weights are checked by name and shape from their headers before any is read, and a
corrupt safetensors file is one line naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import hlat.checkpoint.hf_import as hf_import
from containment import run_bounded
from hlat.checkpoint.completeness import IncompleteWeights
from hlat.checkpoint.hf_import import ImportRefused, import_hf
from hlat.checkpoint.loading import load_model
from hlat.checkpoint.restore import init_weights
from hlat.config.model import ModelConfig
from hlat.errors import UserError
from hlat.model import Llama
from hlat.model.hf import hf_config_dict, hlat_to_hf

CFG = ModelConfig(vocab_size=96, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32)


def _hf_dir(directory: Path, config: object = None, weights: dict[str, torch.Tensor] | None = None) -> Path:
    """A tiny LLaMA directory: config.json (`config`, else CFG's), safetensors and a tokenizer."""
    from tokenizers import Tokenizer, models

    directory.mkdir()
    torch.manual_seed(0)
    weights = weights if weights is not None else Llama(CFG).state_dict()
    save_file({k: v.contiguous() for k, v in hlat_to_hf(weights).items()}, str(directory / "model.safetensors"))
    config = {"model_type": "llama", **hf_config_dict(CFG)} if config is None else config
    (directory / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    vocab = {"</s>": 0, "<unk>": 1, **{f"w{i}": i + 2 for i in range(90)}}
    Tokenizer(models.WordLevel(vocab, unk_token="<unk>")).save(str(directory / "tokenizer.json"))
    return directory


def _refusals(hf: Path, tmp_path: Path) -> list[str]:
    """The message of each of the three paths' refusal (each must be an ImportRefused)."""
    messages = []
    for path in ("import", "init_from", "eval"):
        with pytest.raises(ImportRefused) as err:
            if path == "import":
                import_hf(hf, tmp_path / "run")
            elif path == "init_from":
                init_weights(f"hf:{hf}", [Llama(CFG)])
            else:
                load_model(hf)
        messages.append(str(err.value))
    return messages


def _with(**changes: object) -> dict[str, object]:
    return {"model_type": "llama", **hf_config_dict(CFG), **changes}


BAD_FIELDS = {
    "zero heads": (_with(num_attention_heads=0), "num_attention_heads=0 must be a positive integer"),
    "heads as text": (_with(num_attention_heads="4"), "num_attention_heads='4' must be a positive integer"),
    "fractional width": (_with(hidden_size=32.5), "hidden_size=32.5 must be a positive integer"),
    "bool layers": (_with(num_hidden_layers=True), "num_hidden_layers=True must be a positive integer"),
    "NaN eps": (_with(rms_norm_eps=float("nan")), "rms_norm_eps=nan must be a finite number"),
    "infinite theta": (_with(rope_theta=float("inf")), "rope_theta=inf must be a finite number"),
    "tie as text": (_with(tie_word_embeddings="yes"), "tie_word_embeddings='yes' must be true or false"),
    "scaling a list": (_with(rope_scaling=[1]), "rope_scaling=[1] must be an object or null"),
    "scaling factor text": (
        _with(rope_scaling={"rope_type": "linear", "factor": "8"}),
        "rope_scaling.factor='8' must be a finite number",
    ),
    "activation a number": (_with(hidden_act=3), "hidden_act=3 must be a string"),
    "a JSON list": ([1, 2], "holds a JSON list, not an object"),
    "deep nesting": ('{"a": ' + "[" * 100_000 + "]" * 100_000 + "}", "nested too deeply"),
    "not JSON": ("{", "cannot read"),
}


@pytest.mark.parametrize("config,words", BAD_FIELDS.values(), ids=BAD_FIELDS.keys())
def test_every_path_refuses_a_bad_config_field_in_one_line(tmp_path, config, words):
    hf = _hf_dir(tmp_path / "hf", config)
    for message in _refusals(hf, tmp_path):
        assert str(hf / "config.json") in message and words in message and "\n" not in message, message
    assert not (tmp_path / "run").exists()


def test_an_oversized_config_json_is_refused_unread(tmp_path):
    hf = _hf_dir(tmp_path / "hf", json.dumps(_with(padding="x" * (2 << 20))))
    for message in _refusals(hf, tmp_path):
        assert message == f"{hf / 'config.json'} is over 1 MiB, not a model's config.json"


ABSURD = """
import sys
from pathlib import Path
from hlat.checkpoint.hf_import import import_hf
from hlat.checkpoint.loading import load_model
from hlat.errors import UserError
for hf in sys.argv[1:]:
    for load in (lambda: import_hf(Path(hf), Path(hf + "-run")), lambda: load_model(hf)):
        try:
            load()
            print("loaded")
        except UserError as e:
            print("refused", e)
"""


def test_absurd_sizes_are_refused_before_anything_is_allocated(tmp_path):
    # a billion layers used to build (and hang) for hours; 2**31 positions ask for 550 GB of RoPE
    # tables at head_dim 64: both far past any machine, refused from the figures alone
    layers = _hf_dir(tmp_path / "layers", _with(num_hidden_layers=10**9))
    positions = _hf_dir(
        tmp_path / "positions", _with(max_position_embeddings=2**31, hidden_size=256, num_attention_heads=4)
    )
    proc = run_bounded(ABSURD.replace("sys.argv[1:]", repr([str(layers), str(positions)])), timeout=90)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 4 and all(line.startswith("refused") for line in lines), proc.stdout
    figures = ["9,280,000,006,176 parameters"] * 2 + ["RoPE tables for 2,147,483,648 positions"] * 2
    for line, hf, figure in zip(lines, [layers, layers, positions, positions], figures):
        assert str(hf / "config.json") in line and "more than this machine's" in line and figure in line, line


def test_weights_are_checked_by_name_and_shape_before_any_is_read(tmp_path, monkeypatch):
    weights = Llama(CFG).state_dict()
    weights["layers.1.feed_forward.w2.weight"] = torch.zeros(32, 63)  # the model's is (32, 64)
    hf = _hf_dir(tmp_path / "hf", weights=weights)

    def no_read(*args, **kwargs):
        raise AssertionError("a tensor was read before the shapes were checked")

    monkeypatch.setattr(hf_import, "hf_weights", no_read)
    shape = "wrong shapes layers.1.feed_forward.w2.weight (32, 63) (the model's is (32, 64))"
    with pytest.raises(ImportRefused, match=rf"{hf}: {shape.replace('(', '[(]').replace(')', '[)]')}"):
        import_hf(hf, tmp_path / "run")
    with pytest.raises(IncompleteWeights, match=r"init_from hf:.*wrong shapes layers\.1\.feed_forward\.w2\.weight"):
        init_weights(f"hf:{hf}", [Llama(CFG)])
    with pytest.raises(IncompleteWeights, match=r"wrong shapes layers\.1\.feed_forward\.w2\.weight"):
        load_model(hf)


def test_a_corrupt_safetensors_file_is_one_line_naming_it(tmp_path):
    hf = _hf_dir(tmp_path / "hf")
    data = (hf / "model.safetensors").read_bytes()
    (hf / "model.safetensors").write_bytes(data[:8] + b"{not json" + data[17:])  # a broken header
    for message in _refusals(hf, tmp_path):
        assert message.startswith(f"{hf / 'model.safetensors'}: not a readable safetensors file (")
        assert message.endswith("re-download it") and "\n" not in message, message


def test_a_shard_index_naming_files_outside_the_directory_is_refused(tmp_path):
    outside = _hf_dir(tmp_path / "outside")  # a readable model the index points into
    hf = _hf_dir(tmp_path / "hf")
    (hf / "model.safetensors").unlink()
    names = hlat_to_hf(Llama(CFG).state_dict())
    index = hf / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": dict.fromkeys(names, "../outside/model.safetensors")}))
    for message in _refusals(hf, tmp_path):
        assert message == f"{index}: not a shard index with a weight_map (its files must be names in the directory)"
    assert (outside / "model.safetensors").is_file()


def test_hlat_import_prints_the_refusal_alone_and_exits_2(tmp_path, capsys):
    from hlat.cli import main

    hf = _hf_dir(tmp_path / "hf", _with(rope_theta=float("nan")))
    assert main(["import", str(hf), str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(f"{hf / 'config.json'}: rope_theta=nan must be a finite number") and "\n" not in err, err


BAD_TOKENIZER_CONFIGS = {
    "a JSON list": ("[1, 2]", "holds a JSON list, not an object"),
    "not JSON": ("{", "cannot read"),
    "oversized": (json.dumps({"padding": "x" * (2 << 20)}), "is over 1 MiB, not a tokenizer_config.json"),
}


@pytest.mark.parametrize("text,words", BAD_TOKENIZER_CONFIGS.values(), ids=BAD_TOKENIZER_CONFIGS.keys())
def test_a_malformed_tokenizer_config_is_refused_naming_it(tmp_path, text, words):
    """tokenizer_config.json is read for the BOS of an empty context (eval, generate) and copied by
    hlat import: a list, a non-JSON or a huge file is one line naming it on both paths."""
    hf = _hf_dir(tmp_path / "hf")
    (hf / "tokenizer_config.json").write_text(text)
    for load in (lambda: load_model(hf), lambda: import_hf(hf, tmp_path / "run")):
        with pytest.raises(UserError) as err:
            load()
        message = str(err.value)
        assert str(hf / "tokenizer_config.json") in message and words in message and "\n" not in message, message
    assert not (tmp_path / "run").exists()


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(tmp_path, capsys):
    """`hlat generate --tokenizer T` with ids past the embedding: one line naming T, exit 2, instead
    of an IndexError once the prompt holds such an id."""
    from tokenizers import Tokenizer, models

    from hlat.cli import main

    hf = _hf_dir(tmp_path / "hf")
    big = tmp_path / "big.json"
    vocab = {"</s>": 0, **{f"w{i}": i + 1 for i in range(CFG.vocab_size + 10)}}
    Tokenizer(models.WordLevel(vocab, unk_token="</s>")).save(str(big))
    argv = ["generate", "--checkpoint", str(hf), "--tokenizer", str(big), "--prompt", f"w{CFG.vocab_size + 5}"]
    assert main([*argv, "--device", "cpu", "--max-new-tokens", "1"]) == 2
    assert capsys.readouterr().err == (
        f"hlat generate: tokenizer {big} has {CFG.vocab_size + 11} tokens but the model's vocabulary has "
        f"{CFG.vocab_size}; pass the tokenizer the model was trained with (--tokenizer PATH)\n"
    )
