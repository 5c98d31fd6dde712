"""Every weights-only start refuses a source whose tensors are not exactly the model's, naming
them: --checkpoint.init_from of an hlat checkpoint, of a run directory (what hlat import writes),
of hf:DIR, and hlat import itself (hlat.checkpoint.completeness)."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hlat.checkpoint.completeness import IncompleteWeights
from hlat.checkpoint.hf_import import ImportRefused, import_hf
from hlat.checkpoint.manager import CheckpointManager
from hlat.checkpoint.restore import init_weights
from hlat.config.model import ModelConfig
from hlat.model import Llama
from hlat.model.hf import hf_config_dict, hlat_to_hf

CFG = ModelConfig(vocab_size=96, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32)
DROPPED = "layers.2.attention.wq.weight"


def _weights(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: v.clone() for k, v in Llama(CFG).state_dict().items()}


def _hlat_checkpoint(run: Path, weights: dict[str, torch.Tensor]) -> Path:
    """A weights-only checkpoint, as hlat import and archives write it."""
    manager = CheckpointManager(run / "checkpoints", keep_last=None)
    return manager.save(0, {"model": weights}, None, {"progress": {"step": 0, "tokens": 0}}).path


def _hf_dir(directory: Path, weights: dict[str, torch.Tensor]) -> Path:
    directory.mkdir()
    save_file(hlat_to_hf(weights), str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps({"model_type": "llama", **hf_config_dict(CFG)}))
    return directory


def _incomplete(seed: int = 1) -> dict[str, torch.Tensor]:
    weights = _weights(seed)
    del weights[DROPPED]
    return weights


def test_complete_sources_load_exactly(tmp_path):
    source = _weights(1)
    for spec in (
        str(_hlat_checkpoint(tmp_path / "run", source)),
        str(tmp_path / "run"),
        f"hf:{_hf_dir(tmp_path / 'hf', source)}",
    ):
        model = Llama(CFG)
        init_weights(spec, [model])
        for name, value in source.items():
            assert torch.equal(model.state_dict()[name], value), (spec, name)


@pytest.mark.parametrize("kind", ["checkpoint", "run-directory"])
def test_init_from_an_incomplete_hlat_checkpoint_names_the_tensors(tmp_path, kind):
    weights = {**_incomplete(), "extra.bias": torch.zeros(3)}
    checkpoint = _hlat_checkpoint(tmp_path / "run", weights)
    model = Llama(CFG)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(IncompleteWeights) as info:
        init_weights(str(checkpoint if kind == "checkpoint" else tmp_path / "run"), [model])
    message = str(info.value)
    assert f"init_from {checkpoint}" in message
    assert f"missing tensors {DROPPED}" in message and "unexpected extra.bias" in message
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # nothing loaded


def test_init_from_a_mis_shaped_checkpoint_names_the_shapes(tmp_path):
    weights = _weights(1)
    weights["norm.weight"] = torch.ones(CFG.d_model + 1)
    checkpoint = _hlat_checkpoint(tmp_path / "run", weights)
    with pytest.raises(IncompleteWeights, match=r"wrong shapes norm.weight \(33,\) \(the model's is \(32,\)\)"):
        init_weights(str(checkpoint), [Llama(CFG)])


def test_init_from_an_incomplete_hf_directory_names_the_tensors(tmp_path):
    weights = _incomplete()
    directory = _hf_dir(tmp_path / "hf", weights)
    hf = hlat_to_hf(weights)
    save_file({**hf, "lm_head.bias": torch.zeros(CFG.vocab_size)}, str(directory / "model.safetensors"))
    with pytest.raises(IncompleteWeights) as info:
        init_weights(f"hf:{directory}", [Llama(CFG)])
    assert str(info.value).startswith(f"init_from hf:{directory}: missing tensors {DROPPED}; unexpected lm_head.bias")


def test_import_refuses_an_incomplete_hf_directory(tmp_path):
    from tokenizers import Tokenizer, models

    directory = _hf_dir(tmp_path / "hf", _incomplete())
    Tokenizer(models.WordLevel({"</s>": 0, "<unk>": 1}, unk_token="<unk>")).save(str(directory / "tokenizer.json"))
    with pytest.raises(ImportRefused, match=f"missing tensors {DROPPED}"):
        import_hf(directory, tmp_path / "run")
    assert not (tmp_path / "run").exists()  # nothing written
