"""A model + tokenizer that answers the request types, batched and length-sorted, with progress bars.

Tokenization and windowing follow lm-evaluation-harness's Hugging Face backend, so per-example
log-likelihoods agree with it on the same weights: a context's trailing spaces move to the
continuation, the continuation's tokens are those of encode(context + continuation) after the
context's, an empty context is replaced by the prefix token (BOS, else EOS), and inputs longer
than the model are cut from the left. A model that expects BOS in front (``bos``: trained with
data.bos, or a Hugging Face tokenizer that adds it, as Llama 3's does) gets it in front of every
non-empty context and prompt, as lm-eval's tokenizer call adds it; its prefix token is BOS.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch
from torch import nn

from hlat.data.tokenizer import Tokenizer
from hlat.errors import UserError
from hlat.eval.requests import GenerateRequest, LoglikelihoodRequest, RollingRequest
from hlat.model import KVCache
from hlat.precision import autocast
from hlat.progress import progress

TokenPair = tuple[list[int], list[int]]  # (context ids, continuation ids)
Stream = Callable[[int, str], None]  # (request index, its text so far) after each generated token


def rolling_windows(tokens: list[int], prefix: int, max_len: int) -> Iterator[TokenPair]:
    """Disjoint windows covering every token once (lm-eval's get_rolling_token_windows with
    context_len=1, then make_disjoint_window): each predicts max_len tokens conditioned on the one
    token before them; the last, shorter window on as many earlier tokens as fit."""
    if not tokens:
        return
    first = min(max_len, len(tokens))
    yield [prefix], tokens[:first]  # [prefix] + tokens[:first-1] predicts tokens[:first]
    done = first
    while done < len(tokens):
        end = min(len(tokens), done + max_len)
        yield tokens[max(0, end - max_len - 1) : done], tokens[done:end]
        done = end


class LanguageModel:
    def __init__(
        self,
        model: nn.Module,
        tokenizer: Tokenizer,
        device: torch.device | str = "cpu",
        batch_size: int = 16,
        max_length: int | None = None,
        precision: str = "fp32",
        prefix_token: int | None = None,
        seed: int = 0,
        progress: bool = True,
        bos: bool = False,
    ) -> None:
        self.model = model.to(device).eval()
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.batch_size = batch_size
        self.max_length = max_length or model.cfg.max_seq_len
        self.precision = precision
        if bos and tokenizer.bos_id is None:
            raise UserError(f"the model expects a BOS token but the tokenizer {tokenizer.origin} has none")
        self.bos: list[int] = [tokenizer.bos_id] if bos else []  # put in front of every context
        default = tokenizer.bos_id if bos else tokenizer.eos_id
        self.prefix_token = default if prefix_token is None else prefix_token
        self.seed = seed
        self.progress = progress

    # --- log-likelihood -------------------------------------------------------------------------
    def encode_pair(self, context: str, continuation: str) -> TokenPair:
        if not context:
            cont = self.tokenizer.encode(continuation)
            if cont and cont[0] == self.prefix_token:
                return cont[:1], cont[1:]
            return [self.prefix_token], cont
        spaces = len(context) - len(context.rstrip())
        if spaces:  # "Answer: " + "Paris" is scored as "Answer:" + " Paris"
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole, ctx = self.tokenizer.encode_batch([context + continuation, context])
        return self.bos + ctx, whole[len(ctx) :]

    def loglikelihood(self, requests: Sequence[LoglikelihoodRequest]) -> list[tuple[float, bool]]:
        """(log-likelihood, whether greedy decoding would produce the continuation) per request."""
        pairs = [self.encode_pair(r.context, r.continuation) for r in requests]
        return self.score_tokens(pairs, "loglikelihood")

    def loglikelihood_rolling(self, requests: Sequence[RollingRequest]) -> list[float]:
        """Total log-likelihood of each text (natural log)."""
        windows: list[TokenPair] = []
        owner: list[int] = []
        encoded = self.tokenizer.encode_batch([r.text for r in requests])
        for i, ids in enumerate(encoded):
            for window in rolling_windows(ids, self.prefix_token, self.max_length):
                windows.append(window)
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (ll, _) in zip(owner, self.score_tokens(windows, "rolling loglikelihood")):
            totals[i] += ll
        return totals

    @torch.no_grad()
    def score_tokens(self, pairs: Sequence[TokenPair], desc: str = "score") -> list[tuple[float, bool]]:
        # Longest first: a batch that does not fit in memory fails at once, not at the end.
        order = sorted(range(len(pairs)), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
        results: list[tuple[float, bool]] = [(0.0, False)] * len(pairs)
        bar = progress(len(pairs), desc, "request", enabled=self.progress, leave=False)
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            inputs = [(pairs[i][0] + pairs[i][1])[-(self.max_length + 1) :][:-1] for i in batch]
            logits = self._forward(_pad_right(inputs, self.device))
            for row, i in enumerate(batch):
                cont = pairs[i][1]
                if not cont:
                    results[i] = (0.0, True)
                    continue
                end = len(inputs[row])
                logprobs = logits[row, end - len(cont) : end].float().log_softmax(-1)
                target = torch.tensor(cont, device=logprobs.device)
                ll = logprobs.gather(-1, target[:, None]).sum().item()
                results[i] = (ll, bool((logprobs.argmax(-1) == target).all()))
            bar.update(len(batch))
        bar.close()
        return results

    def _forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        cache: KVCache | None = None,
    ) -> torch.Tensor:
        with autocast(self.precision, self.device):
            return self.model(tokens, positions=positions, attn_mask=attn_mask, cache=cache)

    # --- generation -----------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, requests: Sequence[GenerateRequest], stream: Stream | None = None) -> list[str]:
        """The continuation of each request (see GenerateRequest), batched longest context first.
        `stream(i, text)` is called each time request i's text grows by a token (uncut)."""
        contexts = [self.bos + c if c else c for c in self.tokenizer.encode_batch([r.context for r in requests])]
        order = sorted(range(len(requests)), key=lambda i: -len(contexts[i]))
        out: list[str] = [""] * len(requests)
        # only where a request samples: a backend without generator objects (a PrivateUse1 backend
        # registered from Python) still decodes greedily
        sampling = any(r.temperature > 0 for r in requests)
        generator = torch.Generator(device=self.device).manual_seed(self.seed) if sampling else None
        bar = progress(len(requests), "generate", "request", enabled=self.progress, leave=False)
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            on_token = None if stream is None else (lambda row, text, batch=batch: stream(batch[row], text))
            texts = self._generate_batch(
                [requests[i] for i in batch], [contexts[i] for i in batch], generator, on_token
            )
            for i, text in zip(batch, texts):
                out[i] = text
            bar.update(len(batch))
        bar.close()
        return out

    def _generate_batch(
        self,
        reqs: list[GenerateRequest],
        contexts: list[list[int]],
        generator: torch.Generator | None,
        on_token: Stream | None,
    ) -> list[str]:
        """Prefill the left-padded prompts once, then one position per generated token (KV cache)."""
        # Within the model's context: prompt + generation <= max_length, the prompt cut from the
        # left (as lm-eval does) and the generation capped at max_length - 1 tokens.
        steps = min(max(r.max_tokens for r in reqs), self.max_length - 1)
        keep = self.max_length - steps
        prompts = [(c[-keep:] if c else [self.prefix_token]) for c in contexts]
        width = max(map(len, prompts))
        tokens = torch.zeros(len(reqs), width, dtype=torch.long, device=self.device)
        valid = torch.zeros(len(reqs), width, dtype=torch.bool, device=self.device)
        for row, p in enumerate(prompts):  # left padding: every row's next token is at the end
            tokens[row, width - len(p) :] = torch.tensor(p, device=self.device)
            valid[row, width - len(p) :] = True
        temps = torch.tensor([r.temperature for r in reqs], device=self.device)
        top_ps = torch.tensor([r.top_p for r in reqs], device=self.device)
        cache = KVCache(width + steps)
        positions, mask = _positions(valid), _padded_causal_mask(valid)
        generated: list[list[int]] = [[] for _ in reqs]
        texts = [""] * len(reqs)
        done = [False] * len(reqs)
        for _ in range(steps):
            logits = self._forward(tokens, positions, mask, cache)[:, -1].float()
            next_ids = _pick(logits, temps, top_ps, generator)
            # The next call feeds only the new token: at the next position, seeing every real one.
            tokens, positions = next_ids[:, None], positions[:, -1:] + 1
            valid = torch.cat([valid, torch.ones_like(valid[:, :1])], dim=1)
            mask = valid[:, None, None, :]
            for row, token in enumerate(next_ids.tolist()):
                if done[row]:
                    continue
                if token == self.tokenizer.eos_id:
                    done[row] = True
                    continue
                generated[row].append(token)
                texts[row] = self.tokenizer.decode(generated[row])
                if on_token is not None:
                    on_token(row, texts[row])
                r = reqs[row]
                done[row] = len(generated[row]) >= r.max_tokens or any(s in texts[row] for s in r.until)
            if all(done):
                break
        return [_cut(text, r.until) for text, r in zip(texts, reqs)]


def _pad_right(rows: list[list[int]], device: torch.device) -> torch.Tensor:
    # Causal attention never looks right, so right padding changes no scored logit.
    tokens = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(row, dtype=torch.long)
    return tokens.to(device)


def _positions(valid: torch.Tensor) -> torch.Tensor:
    return (valid.long().cumsum(-1) - 1).clamp_min(0)


def _padded_causal_mask(valid: torch.Tensor) -> torch.Tensor:
    """[B, 1, T, T]: causal, never attending to padding. Padding rows attend to themselves, since
    a row with nothing to attend to gives NaN, which would reach real rows through its values."""
    T = valid.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=valid.device).tril()
    eye = torch.eye(T, dtype=torch.bool, device=valid.device)
    return (causal & valid[:, None, None, :]) | eye


def _pick(
    logits: torch.Tensor, temps: torch.Tensor, top_ps: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """Greedy where the temperature is 0; elsewhere sampled from the nucleus: the most probable
    tokens up to and including the one that takes their total to top_p (always at least one)."""
    greedy = logits.argmax(-1)
    if not bool((temps > 0).any()):
        return greedy
    probs = (logits / temps.clamp_min(1e-6)[:, None]).softmax(-1)
    # stable: among equal probabilities the lowest id comes first, as in argmax
    sorted_probs, ids = probs.sort(dim=-1, descending=True, stable=True)
    before = sorted_probs.cumsum(-1) - sorted_probs  # the mass of the more probable tokens
    sorted_probs = sorted_probs.masked_fill(before >= top_ps[:, None], 0.0)
    picked = torch.multinomial(sorted_probs, 1, generator=generator)
    sampled = ids.gather(-1, picked)[:, 0]
    return torch.where(temps > 0, sampled, greedy)


def _cut(text: str, until: Sequence[str]) -> str:
    for stop in until:
        if stop:
            text = text.split(stop)[0]
    return text
