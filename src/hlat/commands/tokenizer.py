"""hlat tokenizer train: train a byte-level BPE tokenizer.json on any data source."""

from __future__ import annotations

import argparse
import re

# the data settings this command takes as flags: errors from the data layer name the settings
FLAGS = {
    "data.text_field": "--text-field",
    "data.bad_documents": "--bad-documents",
    "model.vocab_size": "--vocab-size",
    "data.source": "SOURCE",
}
_SETTING = re.compile(r"(?<![\w.-])(?:--)?(" + "|".join(re.escape(s) for s in FLAGS) + r")(?!\w)")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("tokenizer", allow_abbrev=False, help="train a byte-level BPE tokenizer on a data source")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    train = actions.add_parser(
        "train",
        allow_abbrev=False,
        help="train a byte-level BPE (EOS <|endoftext|>) and write tokenizer.json",
        description="Train a byte-level BPE on SOURCE (anything data.source accepts: Arrow, Parquet, JSONL, "
        "text, a datasets directory, hf:NAME; comma-separated for several).",
        epilog="example: hlat tokenizer train corpus.parquet --vocab-size 32000 --out tokenizer.json",
    )
    train.add_argument("source", help="the documents to train on")
    train.add_argument("--vocab-size", type=int, required=True)
    train.add_argument("--out", required=True, help="where to write tokenizer.json")
    train.add_argument(
        "--max-chars", type=int, default=1_000_000_000, help="characters to train on at most (default 1e9)"
    )
    train.add_argument("--text-field", default="text", help="column / JSON field of the text (default: text)")
    train.add_argument(
        "--bad-documents",
        choices=("error", "skip"),
        default="skip",
        help="unreadable documents: skip (counted) or error (default: skip)",
    )


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    from hlat.errors import UserError

    try:
        return _train(args)
    except UserError as err:
        raise UserError(in_flags(str(err))) from err


def in_flags(message: str) -> str:
    """A data-layer message in this command's terms: `set data.text_field` -> `set --text-field`."""
    return _SETTING.sub(lambda m: FLAGS[m.group(1)], message)


def _train(args: argparse.Namespace) -> int:
    import time

    from hlat.config.data import DataConfig
    from hlat.data import tokenizer_corpus, train_bpe
    from hlat.errors import ConfigError
    from hlat.progress import progress

    cfg = DataConfig(source=args.source, text_field=args.text_field, bad_documents=args.bad_documents)
    problems = [(field, m) for field, m in cfg.validate() if field == "source"]
    if problems:
        raise ConfigError(problems)
    source = tokenizer_corpus(cfg)
    if source is None:
        raise ConfigError([("source", f"{args.source} holds token shards, not documents")])
    t0 = time.perf_counter()
    stats: dict = {}
    with progress(args.max_chars, "read", "char") as bar:
        tok = train_bpe(source, args.vocab_size, args.max_chars, _stats=stats, progress=bar.update)
        bar.total = bar.n
        bar.refresh()
    tok.save(args.out)
    print(
        f"trained a {tok.vocab_size}-token byte-level BPE on {stats['docs']:,} documents "
        f"({stats['bytes'] / 1e6:.1f} MB, {stats['bad']} unreadable skipped) of {source.name} in "
        f"{time.perf_counter() - t0:.1f} s: {args.out}"
    )
    return 0
