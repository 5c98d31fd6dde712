"""hlat export -> transformers loads it with the same logits; --checkpoint.init_from hf:DIR -> the
same weights with a new optimizer; hlat import HF_DIR RUN_DIR -> a run directory with
transformers' logits, or a refusal naming the config.json field."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from deps import require
from hf_reference import HF_LOGIT_TOLERANCE, perturbed_model
from hlat.checkpoint.hf_import import ImportRefused
from hlat.checkpoint.loading import load_model
from hlat.cli import main
from hlat.config.load import load_config
from hlat.train.trainer import Trainer
from runs import tiny_args

transformers = require("transformers")


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
        assert (hf(ids).logits - ours(ids)).abs().max().item() <= HF_LOGIT_TOLERANCE

    fresh = Trainer(
        load_config(
            "tiny",
            None,
            tiny_args(
                small_corpus, tmp_path / "continued", "--train.steps", "2", "--checkpoint.init_from", f"hf:{out}"
            ),
        ),
        out=print,
    )
    assert "initialised from Hugging Face weights" in capsys.readouterr().out
    assert fresh.step == 0 and not fresh.optimizers.optimizers[0].state  # a new optimizer
    for name, value in ours.state_dict().items():
        assert torch.equal(fresh.model.raw_parts[0].state_dict()[name], value), name


def _hf_llama(directory: Path, n_kv_heads: int, max_shard_size: str = "5GB", **variant) -> torch.nn.Module:
    """A tiny random LlamaForCausalLM saved as safetensors, with a WordLevel tokenizer.json;
    `variant`: LlamaConfig keys over the plain LLaMA's."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    config = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=n_kv_heads,
        max_position_embeddings=64,
        rope_theta=500000.0,
        rms_norm_eps=1e-6,
        **{"tie_word_embeddings": False, **variant},
    )
    config._attn_implementation = "eager"
    model = perturbed_model(transformers.LlamaForCausalLM, config)
    model.save_pretrained(directory, max_shard_size=max_shard_size, safe_serialization=True)
    tk = Tokenizer(
        models.WordLevel({"</s>": 0, "<unk>": 1, "<s>": 2, **{f"w{i}": i + 3 for i in range(93)}}, unk_token="<unk>")
    )
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.add_special_tokens(["</s>", "<s>"])
    tk.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
    return model


@pytest.mark.parametrize("n_kv_heads,max_shard_size", [(2, "5GB"), (8, "60KB")], ids=["gqa-single-file", "mha-sharded"])
def test_import_gives_transformers_logits(tmp_path, capsys, n_kv_heads, max_shard_size):
    hf = _hf_llama(tmp_path / "hf", n_kv_heads, max_shard_size)
    assert ((tmp_path / "hf" / "model.safetensors.index.json").is_file()) == (max_shard_size != "5GB")
    run = tmp_path / "run"
    assert main(["import", str(tmp_path / "hf"), str(run)]) == 0
    out = capsys.readouterr().out
    assert "parameters" in out and f"hlat eval --checkpoint {run}" in out
    assert (run / "tokenizer.json").read_bytes() == (tmp_path / "hf" / "tokenizer.json").read_bytes()
    loaded = load_model(run)  # as hlat eval reads a run directory
    assert loaded.model.cfg.n_kv_heads == n_kv_heads and loaded.step == 0
    assert loaded.prefix_token == 2 == load_model(tmp_path / "hf").prefix_token  # the BOS, as lm-eval conditions
    ids = torch.randint(0, 96, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (loaded.model(ids) - hf(ids).logits).abs().max().item() <= HF_LOGIT_TOLERANCE
    # hlat export writes it back: transformers reads the same model
    assert main(["export", str(run), str(tmp_path / "back")]) == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        assert (back(ids).logits - hf(ids).logits).abs().max().item() <= HF_LOGIT_TOLERANCE


def test_import_sets_up_continued_pretraining_on_the_users_data(tmp_path, capsys, monkeypatch):
    """The imported config trains briefly with validation at the model's context, not with the 7B
    defaults; the suggested command names a data source, and `hlat train` without one warns."""
    _hf_llama(tmp_path / "hf", 2)
    run = tmp_path / "run"
    assert main(["import", str(tmp_path / "hf"), str(run)]) == 0
    out = capsys.readouterr().out
    assert f"hlat train --config {run / 'config.toml'} --data.source YOUR_DATA" in out
    assert "1000 steps of 64 x 64 tokens, validation every 100" in out
    cfg = load_config(None, run / "config.toml", ["--data.source", str(tmp_path / "hf")])
    assert (cfg.train.steps, cfg.train.global_batch, cfg.schedule.decay_steps, cfg.optim.lr) == (1000, 64, 1000, 1e-4)
    assert (cfg.data.seq_len, cfg.data.val_source, cfg.eval.every) == (64, "holdout", 100)

    class Started:  # the run itself is not needed: only what `hlat train` prints before it
        def __init__(self, cfg, resume):
            pass

        def fit(self):
            pass

    monkeypatch.setattr("hlat.train.trainer.Trainer", Started)
    assert main(["train", "--config", str(run / "config.toml")]) == 0
    assert "warning: no data.source: this 0.1M-parameter model trains on the embedded corpus" in capsys.readouterr().out
    assert main(["train"]) == 0  # the tiny preset on the embedded corpus is what that corpus is for
    assert "warning" not in capsys.readouterr().out


# The LLaMA variants hlat represents, each as its model family's config.json says it (tiny sizes).
VARIANTS = {
    "smollm2-tied": dict(tie_word_embeddings=True),
    # Llama 3.1's rope_scaling, pre-trained length scaled down so 40 positions span all three bands
    "llama3.1-rope": dict(
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        }
    ),
    "head_dim-bias-linear": dict(
        head_dim=16, attention_bias=True, mlp_bias=True, rope_scaling={"rope_type": "linear", "factor": 2.0}
    ),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variants_import_init_from_and_export(tmp_path, small_corpus, capsys, variant):
    """A variant's logits agree with transformers' through hlat import, --checkpoint.init_from hf:DIR
    and hlat export back into transformers."""
    hf = _hf_llama(tmp_path / "hf", 2, **VARIANTS[variant])
    if variant == "smollm2-tied":  # some tied checkpoints also save the head: an equal copy is accepted
        from safetensors.torch import load_file, save_file

        file = tmp_path / "hf" / "model.safetensors"
        weights = load_file(file)
        save_file({**weights, "lm_head.weight": weights["model.embed_tokens.weight"].clone()}, str(file))
    ids = torch.randint(0, 96, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(ids).logits
    run = tmp_path / "run"
    assert main(["import", str(tmp_path / "hf"), str(run)]) == 0
    loaded = load_model(run)
    with torch.no_grad():
        assert (loaded.model(ids) - expected).abs().max().item() <= HF_LOGIT_TOLERANCE
    assert sum(p.numel() for p in loaded.model.parameters()) == sum(p.numel() for p in hf.parameters())

    args = [
        "--data.source", str(small_corpus), "--data.seq_len", "32", "--train.global_batch", "2",
        "--train.micro_batch", "2", "--train.steps", "1", "--precision.mode", "fp32", "--eval.every", "0",
        "--train.tensorboard", "false", "--train.plot", "false", "--train.run_dir", str(tmp_path / "continued"),
        "--checkpoint.init_from", f"hf:{tmp_path / 'hf'}",
    ]  # fmt: skip
    trainer = Trainer(load_config("tiny", run / "config.toml", args), out=print)
    assert "initialised from Hugging Face weights" in capsys.readouterr().out
    model = trainer.model.raw_parts[0]
    with torch.no_grad():
        assert (model(ids) - expected).abs().max().item() <= HF_LOGIT_TOLERANCE
    assert model.cfg == loaded.model.cfg

    assert main(["export", str(run), str(tmp_path / "back")]) == 0
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    with torch.no_grad():
        assert (back(ids).logits - expected).abs().max().item() <= HF_LOGIT_TOLERANCE


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("rope_scaling", {"rope_type": "yarn", "factor": 2.0}, "rope_scaling={'rope_type': 'yarn', 'factor': 2.0}"),
        ("head_dim", 7, "head_dim=7 is odd"),
        ("hidden_act", "gelu", "hidden_act='gelu'"),
        ("model_type", "mistral", "model_type='mistral': hlat loads the model types 'llama' and 'qwen3'"),
    ],
)
def test_import_refuses_what_hlat_cannot_represent(tmp_path, capsys, field, value, message):
    _hf_llama(tmp_path / "hf", 2)
    config_file = tmp_path / "hf" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), field: value}))
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert str(config_file) in err and message in err
    assert not (tmp_path / "run").exists()  # nothing written


@pytest.fixture(scope="module")
def hf_source(tmp_path_factory) -> Path:
    """One tiny Hugging Face LLaMA directory (safetensors), which a test copies and alters."""
    directory = tmp_path_factory.mktemp("hf-source") / "hf"
    _hf_llama(directory, 2)
    return directory


def _word_level(file: Path, specials: list[str], words: int) -> None:
    """A WordLevel tokenizer.json: "<unk>", then `specials`, then w0, w1, ... (`words` of them)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(["<unk>", *specials, *(f"w{i}" for i in range(words))])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.add_special_tokens(specials)
    tk.save(str(file))


@pytest.mark.parametrize(
    "specials,words,message",
    [
        (["<s>"], 94, "has no end-of-document token: looked for </s>, <|endoftext|>, <|end_of_text|>, <eos>"),
        (["</s>", "<s>"], 197, "has 200 tokens but config.json vocab_size=96"),
    ],
    ids=["no-eos", "more-tokens-than-vocab_size"],
)
def test_import_refuses_a_tokenizer_hlat_cannot_use(hf_source, tmp_path, capsys, specials, words, message):
    hf = tmp_path / "hf"
    shutil.copytree(hf_source, hf)
    _word_level(hf / "tokenizer.json", specials, words)
    assert main(["import", str(hf), str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert f"tokenizer {hf / 'tokenizer.json'}" in err and message in err and "--tokenizer" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # nothing written


class _Payload:
    """Pickles as a call of `function(argument)`: what a crafted pytorch_model.bin runs when unpickled."""

    def __init__(self, function, argument: str):
        self.function, self.argument = function, argument

    def __reduce__(self):
        return (self.function, (self.argument,))


@pytest.mark.parametrize(
    "layout,function,named",
    [("single", os.system, f"{os.system.__module__}.system"), ("sharded", exec, "exec")],
    ids=["bin-os.system", "sharded-bin-builtins.exec"],
)
def test_crafted_pytorch_model_bin_runs_nothing(hf_source, tmp_path, small_corpus, capsys, layout, function, named):
    """A pytorch_model.bin (or the last shard of a pytorch_model.bin.index.json) whose pickle
    calls os.system or exec, saved by torch.save like a real checkpoint: hlat import,
    --checkpoint.init_from hf:DIR and hlat eval's loader refuse it, naming the file, and the
    payload never runs (it would create a marker file)."""
    from safetensors.torch import load_file

    hf, marker = tmp_path / "hf", tmp_path / "payload-ran"
    shutil.copytree(hf_source, hf)
    weights = load_file(hf / "model.safetensors")
    (hf / "model.safetensors").unlink()
    payload = _Payload(function, f"touch {marker}" if function is os.system else f"open({str(marker)!r}, 'w').close()")
    if layout == "single":
        crafted = hf / "pytorch_model.bin"
        torch.save({**weights, "payload": payload}, crafted)
    else:
        names = sorted(weights)
        shards = {
            "pytorch_model-00001-of-00002.bin": names[: len(names) // 2],
            "pytorch_model-00002-of-00002.bin": names[len(names) // 2 :],
        }
        for shard, members in shards.items():
            torch.save({name: weights[name] for name in members}, hf / shard)
        crafted = hf / "pytorch_model-00002-of-00002.bin"
        torch.save({**{name: weights[name] for name in shards[crafted.name]}, "payload": payload}, crafted)
        (hf / "pytorch_model.bin.index.json").write_text(
            json.dumps({"weight_map": {name: shard for shard, members in shards.items() for name in members}})
        )
    refused = f"{crafted}: refused, its pickle asks for {named}, which no weights file needs"

    assert main(["import", str(hf), str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert refused in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "run").exists()  # nothing written
    args = [
        "--data.source", str(small_corpus), "--data.tokenizer", str(hf / "tokenizer.json"),
        "--model.vocab_size", "96", "--model.d_model", "64", "--model.n_heads", "8", "--model.n_kv_heads", "2",
        "--model.ffn_dim", "160", "--model.max_seq_len", "64", "--data.seq_len", "32", "--train.global_batch", "2",
        "--train.micro_batch", "2", "--train.steps", "1", "--precision.mode", "fp32", "--eval.every", "0",
        "--train.tensorboard", "false", "--train.plot", "false", "--train.run_dir", str(tmp_path / "continued"),
        "--checkpoint.init_from", f"hf:{hf}",
    ]  # fmt: skip
    with pytest.raises(ImportRefused, match=refused):
        Trainer(load_config("tiny", None, args), out=lambda _: None)
    with pytest.raises(ImportRefused, match=refused):
        load_model(hf)  # hlat eval / hlat generate on a Hugging Face directory
    assert not marker.exists()
    torch.load(crafted, weights_only=False)  # the control: full unpickling runs the payload
    assert marker.exists()


def test_train_in_an_imported_sentencepiece_run(small_corpus, tmp_path):
    """The run's tokenizer.model is the tokenizer it trains with: saving it into the run directory
    writes the file over itself (once a SameFileError)."""
    import sentencepiece as spm

    texts = [line for file in sorted(small_corpus.iterdir()) for line in file.read_text().splitlines() if line.strip()][
        :5000
    ]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_prefix=str(tmp_path / "sp"), vocab_size=512, model_type="bpe",
        byte_fallback=True, character_coverage=0.99, minloglevel=2,
    )  # fmt: skip
    config = transformers.LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
    )  # fmt: skip
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "hf", safe_serialization=True)
    shutil.copyfile(tmp_path / "sp.model", tmp_path / "hf" / "tokenizer.model")
    run = tmp_path / "imported"
    assert main(["import", str(tmp_path / "hf"), str(run)]) == 0
    saved = (run / "tokenizer.model").read_bytes()
    args = [
        "--data.source", str(small_corpus), "--data.seq_len", "32", "--train.global_batch", "2",
        "--train.micro_batch", "2", "--train.steps", "1", "--precision.mode", "fp32", "--eval.every", "0",
        "--train.tensorboard", "false", "--train.plot", "false", "--train.peak_tflops", "1",
        "--train.sample_prompt", "", "--train.run_dir", str(run),
    ]  # fmt: skip
    assert main(["train", "--config", str(run / "config.toml"), *args]) == 0
    assert (run / "tokenizer.model").read_bytes() == saved and (run / "checkpoints" / "step_00000001").is_dir()


def test_import_then_continue_training(small_corpus, tmp_path, capsys):
    _hf_llama(tmp_path / "hf", 2)
    run = tmp_path / "imported"
    assert main(["import", str(tmp_path / "hf"), str(run)]) == 0
    imported = load_model(run).model.state_dict()
    args = [
        "--data.source", str(small_corpus), "--data.seq_len", "32", "--train.global_batch", "4",
        "--train.micro_batch", "2", "--train.steps", "2", "--train.log_every", "1", "--precision.mode", "fp32",
        "--train.tensorboard", "false", "--train.plot", "false", "--train.peak_tflops", "1", "--eval.every", "0",
        "--train.run_dir", str(tmp_path / "continued"),
    ]  # fmt: skip
    cfg = load_config("tiny", run / "config.toml", args)  # the imported architecture, tokenizer and weights
    assert cfg.checkpoint.init_from == str(run.resolve()) and cfg.name == "imported-continued"
    trainer = Trainer(cfg, out=print)
    assert "initialised from weights of" in capsys.readouterr().out
    assert trainer.tokenizer.vocab_size == 96 and trainer.step == 0
    for name, value in imported.items():
        assert torch.equal(trainer.model.raw_parts[0].state_dict()[name], value), name
    assert trainer.fit().step == 2
    # In the imported directory itself: its weights-only checkpoint starts the run, it is not resumed.
    in_place = Trainer(load_config("tiny", run / "config.toml", [*args[:-1], str(run)]), out=print)
    assert "weights only: new optimizer, step 0" in capsys.readouterr().out and in_place.step == 0
    for name, value in imported.items():
        assert torch.equal(in_place.model.raw_parts[0].state_dict()[name], value), name
    assert in_place.fit().step == 2


def test_continued_pretraining_lowers_held_out_loss(tmp_path):
    """Continued pre-training as docs/checkpoints.md walks through it: import, train on a new corpus
    (documents counting through the tokenizer's words, which the random model has never seen),
    and the held-out loss of that corpus falls within a few steps."""
    _hf_llama(tmp_path / "hf", 2)
    run = tmp_path / "imported"
    assert main(["import", str(tmp_path / "hf"), str(run)]) == 0
    corpus = tmp_path / "counting"
    corpus.mkdir()
    for doc in range(40):
        (corpus / f"{doc:02d}.txt").write_text(" ".join(f"w{(doc * 7 + i) % 93}" for i in range(120)))
    args = [
        "--data.source", str(corpus), "--data.val_source", "holdout", "--data.val_fraction", "0.1",
        "--data.seq_len", "32", "--train.global_batch", "8", "--train.micro_batch", "4", "--train.steps", "6",
        "--optim.lr", "3e-3", "--schedule.warmup_steps", "1", "--schedule.decay_steps", "6",
        "--precision.mode", "fp32", "--train.tensorboard", "false", "--train.plot", "false",
        "--train.peak_tflops", "1", "--eval.every", "6", "--eval.batches", "2", "--train.sample_prompt", "",
        "--train.run_dir", str(tmp_path / "continued"),
    ]  # fmt: skip
    trainer = Trainer(load_config("tiny", run / "config.toml", args), out=lambda _: None)
    before = trainer.model.validation_loss(trainer.val_batches)
    trainer.fit()
    records = [json.loads(line) for line in (tmp_path / "continued" / "metrics.jsonl").read_text().splitlines()]
    after = [r["val_loss"] for r in records if "val_loss" in r][-1]
    print(f"held-out loss {before:.3f} -> {after:.3f}")
    assert after < before - 0.5, (before, after)
