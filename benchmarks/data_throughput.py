"""Data pipeline throughput on one corpus, in one run: the plain `tokenizers` batch encode (the
reference), online packing end to end through PackedLoader, `hlat prepare`, and reading prepared
shards through PackedLoader. Prints a markdown table (recorded in benchmarks/data_throughput.md).

    python benchmarks/data_throughput.py [--mb 20] [--vocab 8192]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from hlat.config.data import DataConfig
from hlat.data import OnlineDocuments, PackedLoader, ShardDocuments, StdlibCorpus, open_entry, prepare_shards, train_bpe


def tokens_per_s(fn) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = fn()
    return n / (time.perf_counter() - t0), n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=20, help="corpus size in MB of text (standard-library files)")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--seq", type=int, default=4096)
    args = ap.parse_args()
    cores = len(os.sched_getaffinity(0))
    work = Path(tempfile.mkdtemp(prefix="hlat-bench-"))
    stdlib = StdlibCorpus()
    texts, size = [], 0
    for i in range(len(stdlib)):
        if size >= args.mb * 1e6:
            break
        texts.append(stdlib[i])
        size += len(texts[-1].encode())
    schema = pa.schema([("text", pa.large_string())])
    with ipc.new_file(str(work / "corpus.arrow"), schema) as w:
        for a in range(0, len(texts), 512):
            w.write_batch(pa.record_batch([pa.array(texts[a : a + 512], pa.large_string())], schema=schema))
    source = open_entry(str(work / "corpus.arrow"), DataConfig(cache_dir=str(work / "cache")))
    tok = train_bpe(source, args.vocab, max_chars=3_000_000)
    print(
        f"corpus: {len(texts):,} documents, {size / 1e6:.1f} MB (Python standard library, Arrow file); "
        f"byte-level BPE of {tok.vocab_size} tokens; {cores} CPU cores; seq_len {args.seq}\n"
    )

    def plain() -> int:
        n = 0
        for a in range(0, len(texts), 1024):
            n += sum(len(e.ids) for e in tok.tk.encode_batch_fast(texts[a : a + 1024], add_special_tokens=False))
        return n + len(texts)  # + one EOS per document, as packed

    ref, total = tokens_per_s(plain)

    def through_loader(docs) -> int:
        loader = PackedLoader(docs, tok, seq_len=args.seq, batch_size=8, seed=0)
        rows = total // (args.seq * 8)
        for _ in range(rows):
            loader.next_batch()
        loader.close()
        return rows * 8 * args.seq

    online, _ = tokens_per_s(lambda: through_loader(OnlineDocuments(source, tok)))
    prep, _ = tokens_per_s(
        lambda: sum(
            s["num_tokens"]
            for s in prepare_shards(OnlineDocuments(source, tok), work / "shards", docs_per_shard=2000)["shards"]
        )
    )
    shards = ShardDocuments(work / "shards", tok)
    read, _ = tokens_per_s(lambda: through_loader(shards))
    rows = [
        ("plain `tokenizers` encode_batch (reference)", ref),
        ("online packing through PackedLoader", online),
        ("`hlat prepare` (read + tokenize + write shards)", prep),
        ("reading shards through PackedLoader", read),
    ]
    print("| path | tokens/s | tokens/s per core | vs reference |\n|---|---:|---:|---:|")
    for name, v in rows:
        print(f"| {name} | {v / 1e6:,.2f}M | {v / cores / 1e6:,.2f}M | {v / ref:.2f}x |")
    print(
        f"\nonline / reference = {online / ref:.2f} (target >= 0.70); shard reading {read / 1e6:.0f}M tokens/s "
        "(target >= 50M)"
    )


if __name__ == "__main__":
    main()
