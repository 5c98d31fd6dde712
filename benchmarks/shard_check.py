"""What verifying token shards costs when a run opens them (hlat.data.shard_check): one pass of
SHA-256 and the largest token id over a 1 GB tokens file, and a cached verdict's cost.

    python benchmarks/shard_check.py [--gib 1] [--dir /tmp]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from hlat.data.shard_check import check_shard_file
from hlat.digests import sha256_file


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the tokens file")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where to write it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        path, cache = Path(scratch) / "tokens-00000.bin", Path(scratch) / "cache"
        n = int(args.gib * 2**30) // 4
        rng = np.random.default_rng(0)
        with open(path, "wb") as f:
            for a in range(0, n, 1 << 24):
                f.write(rng.integers(0, 128_256, min(1 << 24, n - a), dtype=np.uint32).tobytes())
        digest = sha256_file(path)  # also warms the page cache: the figures are of hashing, not the disk
        for label, full in (("first open (full check)", True), ("full check again", True), ("cached verdict", False)):
            started = time.perf_counter()
            check_shard_file(path, digest, cache, dtype=np.dtype(np.uint32), vocab=128_256, full=full)
            seconds = time.perf_counter() - started
            print(f"{label:24s} {seconds:8.3f} s  {path.stat().st_size / 2**30 / seconds:8.2f} GiB/s")
        started = time.perf_counter()
        sha256_file(path)
        seconds = time.perf_counter() - started
        print(f"{'sha256 alone':24s} {seconds:8.3f} s  {path.stat().st_size / 2**30 / seconds:8.2f} GiB/s")


if __name__ == "__main__":
    main()
