"""Qwen3 through hlat import, hlat eval's loader and hlat export: transformers' logits each way, on
a small random Qwen3ForCausalLM saved here (nothing downloaded)."""

import json
from pathlib import Path

import pytest
import torch

from deps import require
from hf_reference import HF_LOGIT_TOLERANCE, perturbed_model
from hlat.checkpoint.loading import load_model
from hlat.cli import main

transformers = require("transformers")


def _hf_qwen3(directory: Path, **variant) -> torch.nn.Module:
    """A tiny random Qwen3ForCausalLM (GQA, head_dim 32 != hidden / heads) saved as safetensors,
    with a WordLevel tokenizer.json ending documents with <|endoftext|>, as Qwen3's does."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    config = transformers.Qwen3Config(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=64,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        **{"tie_word_embeddings": False, **variant},
    )
    model = perturbed_model(transformers.Qwen3ForCausalLM, config)  # the QK-norms perturbed too
    model.save_pretrained(directory, safe_serialization=True)
    tk = Tokenizer(
        models.WordLevel({"<|endoftext|>": 0, "<unk>": 1, **{f"w{i}": i + 2 for i in range(94)}}, unk_token="<unk>")
    )
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.add_special_tokens(["<|endoftext|>"])
    tk.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    return model


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_import_eval_and_export_give_transformers_logits(tmp_path, tied):
    hf = _hf_qwen3(tmp_path / "hf", tie_word_embeddings=tied)
    ids = torch.randint(0, 96, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids).logits
    run = tmp_path / "run"
    assert main(["import", str(tmp_path / "hf"), str(run)]) == 0
    assert 'family = "qwen3"' in (run / "config.toml").read_text()
    for source in (run, tmp_path / "hf"):  # an imported run, and the Hugging Face directory itself
        loaded = load_model(source)
        assert loaded.model.cfg.family == "qwen3" and loaded.model.cfg.tie_embeddings == tied
        with torch.no_grad():
            assert (loaded.model(ids) - expected).abs().max().item() <= HF_LOGIT_TOLERANCE, source

    assert main(["export", str(run), str(tmp_path / "back")]) == 0
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert (config["model_type"], config["architectures"]) == ("qwen3", ["Qwen3ForCausalLM"])
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    assert type(back).__name__ == "Qwen3ForCausalLM"
    with torch.no_grad():
        assert (back(ids).logits - expected).abs().max().item() <= HF_LOGIT_TOLERANCE


def test_import_refuses_a_sliding_window(tmp_path, capsys):
    _hf_qwen3(tmp_path / "hf")
    config_file = tmp_path / "hf" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "use_sliding_window": True}))
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert str(config_file) in err and "use_sliding_window=true" in err
    assert not (tmp_path / "run").exists()
