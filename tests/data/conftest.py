"""Shared fixtures for the data tests: a tiny local text corpus and a small BPE trained on it."""

from __future__ import annotations

import random

import pytest

from hlat.data import TextFiles, train_bpe

WORDS = (
    "the of and to in is that for it as with was on be by at this from or an are which "
    "def return class import self None True False if else elif while for yield lambda "
    "café naïve über straße 日本 語 données Ωμέγα 🙂 résumé"
).split()


def make_corpus(root, n_docs: int = 40, seed: int = 0, long_chars: int = 6000) -> list[str]:
    """Write a corpus of small documents (plus one long, one empty, one blank) under root.
    Returns the documents in the source's (sorted path) order."""
    rng = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    docs: dict[str, str] = {}
    for i in range(n_docs):
        n_lines = rng.randint(1, 12)
        lines = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12))) for _ in range(n_lines)]
        docs[f"doc{i:03d}.txt"] = f"document {i}\n" + "\n".join(lines) + "\n"
    long_lines = []
    while sum(map(len, long_lines)) < long_chars:
        long_lines.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 15))) + "\n")
    docs["sub/long.md"] = "".join(long_lines)
    docs["sub/empty.txt"] = ""
    docs["sub/blank.txt"] = "  \n\t \n"
    for rel, text in docs.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode("utf-8"))
    return [docs[k] for k in sorted(docs)]


@pytest.fixture(scope="session")
def corpus_factory():
    """make_corpus, for tests that need another corpus."""
    return make_corpus


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    make_corpus(root)
    return root


@pytest.fixture(scope="session")
def source(corpus_dir):
    return TextFiles(corpus_dir)


@pytest.fixture(scope="session")
def tok(source):
    return train_bpe(source, vocab_size=400, max_chars=200_000)
