"""What a peer group sends is checked before use (hlat.train.elastic.positions): the data-position
exchange of a step with a peer that sends a huge length, a share it does not hold or a position
the loader could not load is refused naming the peer, before anything is allocated for it, and the
group keeps its positions; and the fingerprint that a rejoining group is compared by covers the
data's content wherever it lies (the rejoin itself: tests/train/test_elastic.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from hlat.config.run import RunConfig
from hlat.data.shards import FORMAT, VERSION
from hlat.train.elastic.fingerprint import fingerprint
from hlat.train.elastic.positions import MAX_POSITION_BYTES
from hlat.train.elastic.shares import ElasticData

SHARES = 2


class Loader:
    """A stand-in for PackedLoader: share `share`'s position, `reads` micro-batches along."""

    def __init__(self, share: int):
        self.share, self.reads, self.docs = share, 0, [SimpleNamespace(name="docs")]

    def state_dict(self) -> dict:
        return {
            "version": 2, "seed": 0, "dp_rank": self.share, "dp_size": SHARES, "seq_len": 8, "virtual_shards": 4,
            "sources": ["docs"], "weights": [1.0], "shards": [{str(self.share): [0, self.reads, 0]}],
            "tokens_emitted": [8 * self.reads], "current": -1, "empty_skipped": 0, "bad_skipped": 0,
        }  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        self.reads = state["shards"][0][str(self.share)][1]

    def next_batch(self) -> SimpleNamespace:
        self.reads += 1
        return SimpleNamespace(tokens=torch.zeros(1, 8, dtype=torch.int64))

    def close(self) -> None:
        pass


class Peers:
    """The step's collectives as this group (replica rank 0 of two) sees them when replica rank 1
    sends `lengths` (its row of the length exchange) and `blob` (its share's position)."""

    def __init__(self, lengths: list[int], blob: bytes):
        self.lengths, self.blob, self.sums, self.refused = lengths, blob, [], []

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        self.sums.append(tensor.numel())
        if tensor.dtype == torch.int64:
            tensor[1] += torch.tensor(self.lengths)
        else:
            tensor[-len(self.blob) :] += torch.frombuffer(bytearray(self.blob), dtype=torch.uint8)
        return tensor

    def failed(self) -> bool:
        return False

    def refuse(self, sender: int, what: str) -> None:
        self.refused.append((sender, what))


def _step(tmp_path: Path, peers: Peers) -> ElasticData:
    data = ElasticData(Loader, SHARES, 1, tmp_path / "tokens.jsonl")
    data.batches(0, 2, peers)
    data.finish(committed=not peers.refused, step=1, group="0")
    return data


def _position(**change) -> bytes:
    loader = Loader(1)
    loader.reads = 1
    return json.dumps({**loader.state_dict(), **change}).encode()


def test_a_good_peer_position_is_kept(tmp_path):
    blob = _position()
    data = _step(tmp_path, peers := Peers([0, len(blob)], blob))
    assert peers.refused == [] and data.table[1] == json.loads(blob) and data.table[0]["shards"] == [{"0": [0, 1, 0]}]


@pytest.mark.parametrize(
    "lengths, blob, refusal",
    [
        ([0, 1 << 45], b"", f"sent share 1's position as 35,184,372,088,832 bytes (1 to {MAX_POSITION_BYTES:,})"),
        ([0, -5], b"", "sent share 1's position as -5 bytes"),
        ([7, 0], b"", "sent a position of share 0, which another group holds"),
        (None, b"{not json", "sent share 1's position is not JSON"),
        (None, _position(seed=1), "sent share 1's position has seed=1, not 0"),
        (None, _position(shards=[{"1": [0, -1, 0]}]), "sent share 1's position shards[0].1[1]=-1 is not a count"),
        (None, _position(extra=1), "sent share 1's position has other keys than the loader's"),
    ],
)
def test_a_bad_peer_value_is_refused_naming_the_peer(tmp_path, lengths, blob, refusal):
    peers = Peers(lengths or [0, len(blob)], blob)
    data = _step(tmp_path, peers)
    assert len(peers.refused) == 1 and peers.refused[0][0] == 1 and peers.refused[0][1].startswith(refusal)
    assert len(peers.sums) == (1 if lengths else 2)  # a bad length: nothing allocated for the payload
    assert data.table == [None, None]  # the step did not commit: the positions stay


def _manifest(root: Path, digest: str) -> Path:
    root.mkdir()
    shard = {"tokens": "tokens-00000.bin", "offsets": "offsets-00000.npy", "sha256": {"tokens-00000.bin": digest}}
    (root / "manifest.json").write_text(json.dumps({"format": FORMAT, "version": VERSION, "shards": [shard]}))
    return root


def test_the_fingerprint_follows_the_data_content_not_its_location(tmp_path):
    data = SimpleNamespace(docs=[SimpleNamespace(fingerprint=lambda: "text-60-abc|tok=t|split=100000")])
    cfg = RunConfig()
    cfg.data.source = str(_manifest(tmp_path / "a", "1" * 64))
    first = fingerprint(cfg, data, 1)
    cfg.data.source, cfg.data.cache_dir = str(shutil.copytree(tmp_path / "a", tmp_path / "b")), str(tmp_path)
    assert fingerprint(cfg, data, 1) == first  # the same shards mounted elsewhere
    cfg.data.source = str(_manifest(tmp_path / "c", "2" * 64))
    assert fingerprint(cfg, data, 1) != first  # other shard files
    cfg.data.source = str(tmp_path / "a")
    other = SimpleNamespace(docs=[SimpleNamespace(fingerprint=lambda: "text-60-abd|tok=t|split=100000")])
    assert fingerprint(cfg, other, 1) != first  # other documents
    assert fingerprint(cfg, data, 2) != first
    cfg.optim.lr *= 2
    assert fingerprint(cfg, data, 1) != first
