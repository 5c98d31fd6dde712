"""Evaluation of models that expect BOS first: a Llama-3-style Hugging Face directory (its
tokenizer.json adds BOS) agrees with lm-evaluation-harness's HF backend, and an hlat run trained
with data.bos is evaluated, exported and imported with its BOS."""

from __future__ import annotations

import json

import pytest
import torch

from deps import require
from export import save_hf, save_run
from hlat.checkpoint.hf_export import export_hf
from hlat.checkpoint.hf_import import import_hf
from hlat.checkpoint.loading import load_model
from hlat.config.model import ModelConfig
from hlat.data import Tokenizer
from hlat.eval import GenerateRequest, LanguageModel
from hlat.eval.requests import LoglikelihoodRequest, RollingRequest
from hlat.model import Llama
from llama3_tokenizer import BOS, EOS, write_llama3_tokenizer

PAIRS = [
    ("Question: what jumps?\nAnswer:", " the fox"),
    ("", "The quick brown fox"),
    ("def add(a, b): ", "return a + b"),
]
TEXT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def llama3(tmp_path_factory):
    """(tokenizer file, tokenizer, a tiny model over its vocabulary, its Hugging Face directory)."""
    tmp = tmp_path_factory.mktemp("llama3-eval")
    file = write_llama3_tokenizer(tmp / "tok" / "tokenizer.json")
    tok = Tokenizer.from_file(file)
    torch.manual_seed(0)
    model = Llama(
        ModelConfig(
            vocab_size=tok.vocab_size,
            d_model=32,
            n_layers=2,
            n_heads=4,
            n_kv_heads=2,
            ffn_dim=64,
            max_seq_len=96,
            norm_eps=1e-6,
        )
    ).eval()
    with torch.no_grad():  # larger weights than init, so scores differ clearly
        for p in model.parameters():
            p.mul_(4.0)
    return file, tok, model, save_hf(tmp / "hf", model, file, eos_token=EOS, bos_token=BOS)


def test_llama3_hf_directory_agrees_with_lm_eval(llama3):
    require("lm_eval")
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    _, tok, _, hf_dir = llama3
    loaded = load_model(hf_dir)
    assert loaded.bos and loaded.prefix_token == tok.bos_id
    lm = LanguageModel(
        loaded.model, loaded.tokenizer, batch_size=4, prefix_token=loaded.prefix_token, bos=loaded.bos, progress=False
    )
    theirs = HFLM(pretrained=str(hf_dir), batch_size=4, device="cpu", dtype="float32")
    for pair in PAIRS[::2]:
        assert lm.encode_pair(*pair) == theirs._encode_pair(*pair)
        assert lm.encode_pair(*pair)[0][0] == tok.bos_id
    ours = lm.loglikelihood([LoglikelihoodRequest(c, x) for c, x in PAIRS])
    their_lls = theirs.loglikelihood(
        [Instance("loglikelihood", {}, p, i) for i, p in enumerate(PAIRS)], disable_tqdm=True
    )
    assert [ll for ll, _ in ours] == pytest.approx([ll for ll, _ in their_lls], abs=1e-4)
    (said,) = lm.generate([GenerateRequest("Q: what jumps?\nA:", ("\n",), 4)])
    (their_said,) = theirs.generate_until(
        [Instance("generate_until", {}, ("Q: what jumps?\nA:", {"until": ["\n"], "max_gen_toks": 4}), 0)],
        disable_tqdm=True,
    )
    assert said == their_said
    # rolling: hlat scores the text after one BOS (the prefix), as the model was trained; lm-eval
    # puts its tokenizer's BOS in front of the text too, and scores that BOS and the text after two
    (rolling,) = lm.loglikelihood_rolling([RollingRequest(TEXT)])
    (their_rolling,) = theirs.loglikelihood_rolling(
        [Instance("loglikelihood_rolling", {}, (TEXT,), 0)], disable_tqdm=True
    )
    ids = tok.encode(TEXT)
    ((after_one, _), (after_two, _)) = lm.score_tokens([([tok.bos_id], ids), ([tok.bos_id], [tok.bos_id, *ids])])
    assert rolling == pytest.approx(after_one, abs=1e-4) and their_rolling == pytest.approx(after_two, abs=1e-4)


def test_run_trained_with_bos_evaluates_exports_and_imports_with_it(llama3, tmp_path):
    file, tok, model, hf_dir = llama3
    run = save_run(tmp_path / "run", model, file, [1])
    assert not load_model(run).bos and load_model(run).prefix_token == tok.eos_id  # HLAT's default
    (run / "config.toml").write_text((run / "config.toml").read_text() + "bos = true\n")  # [data] is last
    loaded = load_model(run)
    assert loaded.bos and loaded.prefix_token == tok.bos_id
    lm = LanguageModel(loaded.model, loaded.tokenizer, prefix_token=loaded.prefix_token, bos=True, progress=False)
    context, continuation = lm.encode_pair("a fox", " jumps")
    assert context == [tok.bos_id, *tok.encode("a fox")] and continuation == tok.encode(" jumps")
    out = export_hf(run, tmp_path / "exported").out
    assert json.loads((out / "config.json").read_text())["bos_token_id"] == tok.bos_id
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["add_bos_token"] is True and config["bos_token"] == BOS
    exported = load_model(out)
    assert exported.bos and exported.prefix_token == tok.bos_id
    # importing a model whose tokenizer adds BOS keeps it for continued training and evaluation
    imported = import_hf(hf_dir, tmp_path / "imported").run_dir
    assert "bos = true" in (imported / "config.toml").read_text()
    assert load_model(imported).bos
