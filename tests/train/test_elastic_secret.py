"""The run secret of an elastic run (hlat.train.elastic.secret) and the state transfer it guards
(hlat.train.elastic.transport), in this process on loopback: `hlat elastic-secret` writes a file
only its owner reads, a readable one is refused naming the chmod, and a state is served only to a
receiver that proves the secret and loaded only when its MAC proves the source knew it too (a
replayed challenge, a forged source and an oversized payload are refused; the whole rejoin:
tests/train/test_elastic_rogue.py)."""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from datetime import timedelta

import pytest
import torch

from hlat.cli import main
from hlat.config.elastic import ElasticConfig
from hlat.errors import UserError
from hlat.train.elastic.secret import mac, run_key
from hlat.train.elastic.transport import AuthenticatedTransport, StateRefused

STEP = 7


def test_the_secret_command_writes_a_private_file_and_never_replaces_one(tmp_path, capsys):
    path = tmp_path / "run.secret"
    assert main(["elastic-secret", str(path)]) == 0
    assert path.stat().st_mode & 0o777 == 0o600 and len(path.read_text().strip()) == 64
    assert main(["elastic-secret", str(path)]) == 2
    assert f"{path} exists" in capsys.readouterr().err
    cfg = ElasticConfig(enabled=True, secret_file=str(path))
    assert len(run_key(cfg)) == 32 and path.read_text().strip() not in repr(cfg)
    path.chmod(0o644)
    with pytest.raises(
        UserError, match=rf"elastic.secret_file={path} can be read by other users; run `chmod 600 {path}`"
    ):
        run_key(cfg)


def test_a_short_or_missing_secret_is_one_line(monkeypatch):
    monkeypatch.setenv("RUN_SECRET", "short")
    with pytest.raises(UserError, match="elastic.secret_env=RUN_SECRET: the secret has fewer than 32 characters"):
        run_key(ElasticConfig(enabled=True, secret_env="RUN_SECRET"))
    assert [f for f, _ in ElasticConfig(enabled=True, lighthouse="http://h:1", group="0").validate()] == ["secret_file"]


def _transport(key: bytes, say=lambda line, key: None, own=None) -> AuthenticatedTransport:
    state = own if own is not None else {"w": torch.zeros(4)}
    return AuthenticatedTransport(
        key=key, fingerprint="f" * 16, host="127.0.0.1", timeout=timedelta(seconds=10), own_state=lambda: state, say=say
    )


def test_the_state_goes_only_to_a_receiver_that_proves_the_secret(tmp_path):
    said = []
    source = _transport(b"k" * 32, say=lambda line, key: said.append(line))
    state = {"user": {"default": {"w": torch.arange(4.0)}}, "torchft": {"step": STEP, "batches_committed": 3}}
    source.send_checkpoint([1], STEP, state, timedelta(seconds=10))
    friend, stranger = _transport(b"k" * 32), _transport(b"x" * 32)
    transports = [source, friend, stranger]
    try:
        got = friend.recv_checkpoint(0, source.metadata(), STEP, timedelta(seconds=10))
        assert torch.equal(got["user"]["default"]["w"], torch.arange(4.0)) and got["torchft"]["step"] == STEP
        with pytest.raises(StateRefused, match="it refused this group"):
            stranger.recv_checkpoint(0, source.metadata(), STEP, timedelta(seconds=10))
        assert any("refused this group's state to 127.0.0.1" in line for line in said), said
        # a challenge answered once is spent: replaying the proof that worked is refused
        with urllib.request.urlopen(f"{source.metadata()}/challenge") as reply:
            challenge = reply.read().decode()
        headers = {
            "X-Hlat-Challenge": challenge,
            "X-Hlat-Nonce": "n",
            "X-Hlat-Proof": mac(b"k" * 32, "pull", challenge, "n", STEP).hex(),
        }
        with urllib.request.urlopen(urllib.request.Request(f"{source.metadata()}/state/{STEP}", headers=headers)):
            pass
        with pytest.raises(urllib.error.HTTPError, match="403"):
            urllib.request.urlopen(urllib.request.Request(f"{source.metadata()}/state/{STEP}", headers=headers))
        # a source that speaks the protocol without the secret: its state is not loaded
        forged = _transport(b"x" * 32)
        transports.append(forged)
        forged.send_checkpoint([1], STEP, state, timedelta(seconds=10))
        forged._admit = lambda step, *_: state  # it serves anyone
        with pytest.raises(StateRefused, match="cannot prove the run secret"):
            friend.recv_checkpoint(0, forged.metadata(), STEP, timedelta(seconds=10))
        # one that sends more than a state of this rank's size could be
        small = _transport(b"k" * 32, own={"w": torch.zeros(1)})
        transports.append(small)
        big = {"user": {"default": {"w": torch.zeros(20 << 20)}}, "torchft": {}}
        forged.send_checkpoint([1], STEP, big, timedelta(seconds=10))
        forged._admit = lambda step, *_: big
        with pytest.raises(StateRefused, match="more than"):
            small.recv_checkpoint(0, forged.metadata(), STEP, timedelta(seconds=10))
    finally:
        for transport in transports:
            transport.shutdown()


@pytest.mark.parametrize("wait", [True, False])
def test_shutdown_stops_serving_and_closes_the_port(wait):
    """torchft's manager ends a run with shutdown(wait=False): the serving thread must end too,
    not poll its closed socket (a core spinning until the process exits), and the port is closed."""
    transport = _transport(b"k" * 32)
    address = transport.address
    transport.shutdown(wait=wait)
    transport._thread.join(timeout=10)
    assert not transport._thread.is_alive(), "the state server still serves after shutdown"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # (without wait, the socket closes just after the loop ends)
        try:
            socket.create_connection(address, timeout=1).close()
        except ConnectionRefusedError:
            return
        time.sleep(0.1)
    raise AssertionError(f"{address} still accepts connections after shutdown")
