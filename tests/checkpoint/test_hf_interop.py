"""hlat export -> transformers loads it with the same logits; --checkpoint.init_from hf:DIR -> the
same weights with a new optimizer."""

import json
import sys
from pathlib import Path

import pytest
import torch

from hlat.cli import main
from hlat.config import load_config
from hlat.eval import load_model
from hlat.train.trainer import Trainer

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
from runs import tiny_args  # noqa: E402

transformers = pytest.importorskip("transformers")


def test_export_loads_in_transformers_and_imports_back(small_corpus, tmp_path, capsys):
    run = tmp_path / "run"
    Trainer(load_config("tiny", None, tiny_args(small_corpus, run, "--train.steps", "2")), out=lambda _: None).fit()
    out = tmp_path / "hf"
    # a small shard size forces several safetensors files and an index
    assert main(["export", str(run), str(out), "--shard-gb", str(200_000 / 2**30)]) == 0
    assert len(json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]) > 0
    ours = load_model(run).model
    hf = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    text = "def main():\n    return 0\n"
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert ids[0].tolist() == load_model(run).tokenizer.encode(text)  # no BOS added
    with torch.no_grad():
        assert (hf(ids).logits - ours(ids)).abs().max().item() < 1e-4

    fresh = Trainer(load_config("tiny", None, tiny_args(small_corpus, tmp_path / "continued", "--train.steps", "2",
                                                        "--checkpoint.init_from", f"hf:{out}")), out=print)
    assert "initialised from Hugging Face weights" in capsys.readouterr().out
    assert fresh.step == 0 and not fresh.optimizers.optimizers[0].state  # a new optimizer
    for name, value in ours.state_dict().items():
        assert torch.equal(fresh.model.raw_parts[0].state_dict()[name], value), name
