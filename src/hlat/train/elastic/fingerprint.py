"""What every replica group of one elastic run must agree on, as one short digest: the shared
configuration, the data (by content, wherever it is mounted), the tokenizer, the number of ranks,
and the hlat and torch versions. A rejoining group whose fingerprint differs from its peer's is
refused; a member whose fingerprint differs never commits a step with the others."""

from __future__ import annotations

from pathlib import Path

import torch

import hlat
from hlat.config.data_paths import entry_kind, source_entries
from hlat.config.run import RunConfig
from hlat.data.shards import read_shard_manifest
from hlat.digests import short_sha256
from hlat.train.elastic.shares import ElasticData

# what every group must agree on (the rest names one group's files, devices and logging)
_SHARED_SECTIONS = ("model", "data", "optim", "schedule", "precision", "parallel", "recovery")
_SHARED_KEYS = ("train.seed", "train.global_batch", "train.micro_batch", "train.steps", "elastic.max_groups")
# where the data and tokenizer lie on one node: their content is fingerprinted instead
_LOCATIONS = ("data.source", "data.val_source", "data.tokenizer", "data.cache_dir")


def fingerprint(cfg: RunConfig, data: ElasticData, ranks: int) -> str:
    """`ranks`: the group's processes (a rank heals from the same rank of a peer, shard for shard).
    The documents' fingerprints hold the tokenizer's; token shards add the SHA-256 of every file
    that `hlat prepare` recorded (the files were checked against them when opened: nothing is
    hashed here)."""
    keys = {f"{name}.{key}" for name in _SHARED_SECTIONS for key in vars(cfg.sections()[name])}
    shared = cfg.to_toml((keys | set(_SHARED_KEYS)) - set(_LOCATIONS))
    documents = "\n".join(d.fingerprint() for d in data.docs)
    versions = f"hlat={hlat.__version__} torch={torch.__version__}"
    return short_sha256(f"{shared}\n{documents}\n{shard_digests(cfg.data.source)}\n{versions}\nranks={ranks}")


def shard_digests(source: str) -> str:
    """The recorded SHA-256 of every token shard file of data.source's shard directories."""
    digests = []
    for entry in source_entries(source):
        if entry_kind(entry) == "shards":
            for shard in read_shard_manifest(Path(entry))["shards"]:
                digests += [shard["sha256"][name] for name in sorted(shard["sha256"])]
    return short_sha256(" ".join(digests))
