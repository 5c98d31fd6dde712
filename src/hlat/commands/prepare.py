"""hlat prepare: tokenize a source once into memory-mapped token shards (resumable)."""

from __future__ import annotations

import argparse

from hlat.commands.common import OVERRIDES_HELP, add_config_args, load_run_config


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "prepare",
        allow_abbrev=False,
        help="tokenize data.source once into token shards for training",
        description="Tokenize every document of --data.source with the run's tokenizer into token shards "
        "(uint16/uint32 memmaps + document offsets + a manifest with checksums). Re-running the same "
        "command resumes an interrupted run. Train from them with --data.source OUT. " + OVERRIDES_HELP,
        epilog="example: hlat prepare --data.source corpus.jsonl.zst --data.tokenizer tokenizer.json --out shards/",
    )
    add_config_args(parser)
    parser.add_argument("--out", required=True, help="directory for the shards: new, empty, or an earlier prepare's")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="start over in --out, removing an earlier prepare's files there (any other file refuses)",
    )
    parser.add_argument("--docs-per-shard", type=int, default=100_000, help="documents per shard (default 100000)")


def run(args: argparse.Namespace, overrides: list[str]) -> int:
    from pathlib import Path

    from hlat.config.data_paths import source_entries
    from hlat.data import OnlineDocuments, build_data_tokenizer, open_entry, prepare_shards
    from hlat.errors import UserError
    from hlat.progress import progress

    cfg = load_run_config(args, overrides)
    entries = source_entries(cfg.data.source)
    if len(entries) != 1:
        raise UserError("give one data.source (prepare each source of a mixture into its own directory)")
    tokenizer, line = build_data_tokenizer(cfg.data, cfg.model.vocab_size)
    print(line)
    docs = OnlineDocuments(open_entry(entries[0], cfg.data), tokenizer, cfg.data.max_doc_chars)
    with progress(len(docs), "prepare", "doc") as bar:
        written = [0]  # tokens so far

        def advance(n_docs: int, n_tokens: int) -> None:
            written[0] += n_tokens
            bar.set_postfix(tokens=f"{written[0]:,}")
            bar.update(n_docs)

        manifest = prepare_shards(
            docs,
            Path(args.out),
            args.docs_per_shard,
            skip_bad=cfg.data.bad_documents == "skip",
            progress=advance,
            overwrite=args.overwrite,
        )
    tokens = sum(s["num_tokens"] for s in manifest["shards"])
    print(
        f"prepared {manifest['num_docs']:,} documents, {tokens:,} tokens ({manifest['dtype']}) in "
        f"{len(manifest['shards'])} shards under {args.out}; {len(manifest['bad'])} bad documents skipped. "
        f"Train with --data.source {args.out}"
    )
    return 0
