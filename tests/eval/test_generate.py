"""hlat generate and the sample at the end of hlat train: the one generation loop (KV cache) against
recomputing the whole forward, seeded sampling and top-p, streaming, and the command itself."""

from __future__ import annotations

import torch

from hlat.cli import main
from hlat.eval import GenerateRequest, LanguageModel
from hlat.eval.stream import TextStream
from runs import tiny_args


def full_forward_greedy(model, ids: list[int], steps: int, eos: int) -> list[int]:
    """Greedy decoding without a cache: the whole sequence's forward pass for every token."""
    out: list[int] = []
    with torch.no_grad():
        for _ in range(steps):
            nxt = int(model(torch.tensor([ids + out]))[0, -1].argmax())
            if nxt == eos:
                break
            out.append(nxt)
    return out


def test_cached_greedy_generation_equals_the_full_forward_and_streams_it(model, tokenizer) -> None:
    prompt = "def add(a, b):"
    expected = full_forward_greedy(model, tokenizer.encode(prompt), 12, tokenizer.eos_id)
    shown: list[str] = []
    stream = TextStream(write=shown.append)
    lm = LanguageModel(model, tokenizer, batch_size=1, progress=False)
    (text,) = lm.generate([GenerateRequest(prompt, max_tokens=12)], stream)
    stream.finish(text)
    assert text == tokenizer.decode(expected)
    assert "".join(shown) == text and stream.tokens == len(expected)


def test_sampling_is_seeded_and_a_tiny_top_p_is_greedy(model, tokenizer) -> None:
    def run(seed: int, **kw) -> str:
        lm = LanguageModel(model, tokenizer, batch_size=1, seed=seed, progress=False)
        return lm.generate([GenerateRequest("The quick brown", max_tokens=10, **kw)])[0]

    hot = {"temperature": 2.0, "top_p": 0.95}
    assert run(3, **hot) == run(3, **hot)
    assert len({run(seed, **hot) for seed in range(4)}) > 1  # it does sample
    assert run(3, temperature=2.0, top_p=1e-9) == run(0)


def test_stream_prints_whole_characters_and_holds_back_a_possible_stop() -> None:
    shown: list[str] = []
    stream = TextStream(until=["\n\n"], write=shown.append)
    for text in ["a", "a\ufffd", "aé", "aé\n", "aé\nb", "aé\nb\n\nc"]:
        stream(0, text)
    stream.finish("aé\nb")
    assert shown == ["a", "é", "\nb"] and stream.tokens == 6


def test_generate_command_and_the_end_of_training_sample(small_corpus, tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    assert (
        main(
            [
                "train",
                *tiny_args(
                    small_corpus,
                    run_dir,
                    "--train.steps",
                    "2",
                    "--train.sample_prompt",
                    "auto",
                    "--train.sample_tokens",
                    "4",
                ),
            ]
        )
        == 0
    )
    trained = capsys.readouterr().out
    assert "sample (greedy," in trained.split("done: step 2")[1]
    assert main(["generate", "--checkpoint", str(run_dir), "--prompt", "import os", "--max-new-tokens", "5"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("import os") and "tokens/s]" in out.splitlines()[-1]
    assert main(["generate", "--checkpoint", str(tmp_path / "missing"), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hlat generate: --checkpoint") and err.count("\n") == 1
