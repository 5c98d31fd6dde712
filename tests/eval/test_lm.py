"""The request types against direct computation on the same tiny model."""

from __future__ import annotations

import torch

from hlat.eval import GenerateRequest, LanguageModel, LoglikelihoodRequest, RollingRequest
from hlat.eval.lm import rolling_windows


def direct_ll(model, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    tokens = torch.tensor([context + continuation])
    with torch.no_grad():
        logprobs = model(tokens[:, :-1]).float().log_softmax(-1)[0, -len(continuation) :]
    target = torch.tensor(continuation)
    return logprobs.gather(-1, target[:, None]).sum().item(), bool((logprobs.argmax(-1) == target).all())


def test_loglikelihood_matches_direct_and_is_batch_invariant(lm, model, tokenizer) -> None:
    reqs = [
        LoglikelihoodRequest("Question: What is the capital of France?\nAnswer:", " Paris"),
        LoglikelihoodRequest("The quick brown fox ", "jumps"),  # trailing space moves
        LoglikelihoodRequest("", "A saw."),  # empty context: the prefix token (EOS)
        LoglikelihoodRequest("def add(a, b):", "\n    return a + b\n"),
    ]
    got = lm.loglikelihood(reqs)
    single = LanguageModel(model, tokenizer, batch_size=1, progress=False).loglikelihood(reqs)
    for (ll, greedy), (ll1, greedy1), r in zip(got, single, reqs):
        ctx, cont = lm.encode_pair(r.context, r.continuation)
        ref, ref_greedy = direct_ll(model, ctx, cont)
        assert abs(ll - ref) < 1e-4 and abs(ll1 - ref) < 1e-4
        assert greedy == ref_greedy == greedy1
    assert lm.encode_pair("The quick brown fox ", "jumps")[1] == tokenizer.encode(" jumps")
    assert lm.encode_pair("", "A saw.")[0] == [tokenizer.eos_id]


def test_rolling_windows_cover_every_token_once() -> None:
    tokens = list(range(100, 137))
    windows = list(rolling_windows(tokens, prefix=0, max_len=8))
    assert [t for _, cont in windows for t in cont] == tokens
    for ctx, cont in windows:  # the model never sees more than max_len tokens
        assert len((ctx + cont)[:-1]) <= 8
    assert windows[0] == ([0], tokens[:8])
    assert windows[1] == ([107], tokens[8:16])  # a full window conditions on one token
    assert windows[-1] == (tokens[28:32], tokens[32:])  # a partial one on as many as fit


def test_rolling_loglikelihood_sums_the_windows(model, tokenizer) -> None:
    text = " ".join(["The quick brown fox jumps over the lazy dog."] * 2)
    ids = tokenizer.encode(text)
    assert 40 < len(ids) < 96
    short = LanguageModel(model, tokenizer, batch_size=2, max_length=16, progress=False)
    (total,) = short.loglikelihood_rolling([RollingRequest(text)])
    expected = sum(direct_ll(model, c, t)[0] for c, t in rolling_windows(ids, tokenizer.eos_id, 16))
    assert abs(total - expected) < 1e-3
    (full,) = LanguageModel(model, tokenizer, progress=False).loglikelihood_rolling([RollingRequest(text)])
    assert abs(full - direct_ll(model, [tokenizer.eos_id], ids)[0]) < 1e-3


def greedy_reference(model, tokenizer, context: str, steps: int) -> list[int]:
    ids = tokenizer.encode(context)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(steps):
            nxt = int(model(torch.tensor([ids + out]))[0, -1].argmax())
            if nxt == tokenizer.eos_id:
                break
            out.append(nxt)
    return out


def test_greedy_generation_batched_with_left_padding(lm, model, tokenizer) -> None:
    contexts = ["Question: Which tool cuts wood?\nAnswer:", "def", "The quick brown fox jumps over"]
    got = lm.generate([GenerateRequest(c, max_tokens=6) for c in contexts])
    for context, text in zip(contexts, got):
        assert text == tokenizer.decode(greedy_reference(model, tokenizer, context, 6))


def test_generation_stops_at_stop_sequences(lm, model, tokenizer) -> None:
    context = "Question: What is the capital of France?\nAnswer:"
    full = tokenizer.decode(greedy_reference(model, tokenizer, context, 12))
    stop = full[3:5]
    assert stop and stop in full
    (cut,) = lm.generate([GenerateRequest(context, until=(stop,), max_tokens=12)])
    assert cut == full.split(stop)[0]


def test_sampling_is_seeded(model, tokenizer) -> None:
    reqs = [GenerateRequest("def add", max_tokens=5, temperature=1.0)] * 3
    a = LanguageModel(model, tokenizer, seed=7, progress=False).generate(reqs)
    b = LanguageModel(model, tokenizer, seed=7, progress=False).generate(reqs)
    assert a == b
