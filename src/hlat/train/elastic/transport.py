"""The transfer of a live group's state to a rejoining one (torchft's CheckpointTransport), served
only to a request that proves the run secret, and loaded only when a MAC binds it to this transfer.

A receiver first asks the source for a challenge (a fresh random nonce, usable once), then for the
state of the step the quorum names, with a nonce of its own and HMAC(key, challenge, nonce, step).
The source streams the state and then HMAC(key, step, the receiver's nonce, the payload's SHA-256,
its fingerprint); the receiver reads at most a bound it derives from its own state's size, checks
that MAC and only then loads the payload (weights_only: tensors and plain values). A recorded
exchange is useless: both nonces are fresh. Anything else is refused, said once per interval, and
the step it happened in does not commit (torchft then retries with the next quorum).
"""

from __future__ import annotations

import hashlib
import hmac
import io
import secrets
import socket
import threading
import urllib.error
import urllib.request
from collections import OrderedDict
from collections.abc import Callable
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import torch
from torch.distributed._serialization import _streaming_load, _streaming_save
from torch.utils._pytree import tree_flatten, tree_map_only
from torchft.checkpointing.transport import CheckpointTransport

from hlat.train.elastic.secret import mac
from hlat.train.elastic.sockets import listening_socket

MAC_BYTES = 32
CHALLENGES = 256  # challenges outstanding at most (the oldest is dropped): a flood costs no memory


class StateRefused(RuntimeError):
    """A state transfer that failed its proof: nothing of it was loaded."""


class AuthenticatedTransport(CheckpointTransport[dict[str, Any]]):
    """Serves this rank's state on `host` (an address of this machine; port chosen by the system).
    `own_state`: this rank's state as a source would send it (the bound on what a receiver reads);
    `say(line, key)`: a log line about a peer, said once per interval per key."""

    def __init__(
        self,
        *,
        key: bytes,
        fingerprint: str,
        host: str,
        timeout: timedelta,
        own_state: Callable[[], Any],
        say: Callable[[str, str], None],
    ):
        self._key, self._fingerprint, self._timeout = key, fingerprint, timeout
        self._own_state, self._say = own_state, say
        self._changed = threading.Condition()
        self._state: Any = None  # what send_checkpoint staged, until disallow_checkpoint
        self._step, self._sending = -1, 0
        self._challenges: OrderedDict[str, None] = OrderedDict()
        self._server = _server(host, self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True, name="hlat-state-server")
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        return self._server.server_address[:2]

    def metadata(self) -> str:
        host, port = self.address
        return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    # --- the source ---------------------------------------------------------------------------
    def send_checkpoint(self, dst_ranks: list[int], step: int, state_dict: dict[str, Any], timeout: timedelta) -> None:
        with self._changed:
            self._state = tree_map_only(torch.Tensor, lambda t: t.detach().cpu(), state_dict)
            self._step = step
            self._changed.notify_all()

    def disallow_checkpoint(self) -> None:
        """After this the state may change: wait for the transfers in flight, then serve nothing."""
        with self._changed:
            self._changed.wait_for(lambda: self._sending == 0)
            self._state = None

    def _challenge(self) -> str:
        nonce = secrets.token_hex(32)
        with self._changed:
            self._challenges[nonce] = None
            while len(self._challenges) > CHALLENGES:
                self._challenges.popitem(last=False)
        return nonce

    def _admit(self, step: int, challenge: str, nonce: str, proof: str) -> Any:
        """The state of `step` for a request that proves the secret over a challenge of ours, else None."""
        with self._changed:
            fresh = self._challenges.pop(challenge, False) is None
            if not (fresh and hmac.compare_digest(proof, mac(self._key, "pull", challenge, nonce, step).hex())):
                return None
            ready = self._changed.wait_for(
                lambda: self._state is not None and self._step == step, self._timeout.total_seconds()
            )
            if not ready:
                return None
            self._sending += 1
            return self._state

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        transport = self

        class Handler(BaseHTTPRequestHandler):
            timeout = transport._timeout.total_seconds()

            def do_GET(self) -> None:  # noqa: N802  (http.server's name)
                if self.path == "/challenge":
                    self._reply(200, transport._challenge().encode())
                    return
                parts = self.path.split("/")
                step = int(parts[2]) if len(parts) == 3 and parts[1] == "state" and parts[2].isdigit() else -1
                headers = [self.headers.get(h, "") for h in ("X-Hlat-Challenge", "X-Hlat-Nonce", "X-Hlat-Proof")]
                state = transport._admit(step, *headers) if step >= 0 else None
                if state is None:
                    peer = self.client_address[0]
                    transport._say(
                        f"elastic: refused this group's state to {peer}: it cannot prove the run secret "
                        f"(or asked for a step this group does not serve)",
                        f"pull {peer}",
                    )
                    self._reply(403, b"")
                    return
                try:
                    self.send_response(200)
                    self.send_header("X-Hlat-Fingerprint", transport._fingerprint)
                    self.end_headers()
                    digest = _Hashing(self.wfile)
                    _streaming_save(state, digest)
                    nonce = headers[1]
                    self.wfile.write(
                        mac(transport._key, "state", step, nonce, digest.hexdigest(), transport._fingerprint)
                    )
                finally:
                    with transport._changed:
                        transport._sending -= 1
                        transport._changed.notify_all()

            def _reply(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  (the refusals are said above)
                pass

        return Handler

    # --- the receiver -------------------------------------------------------------------------
    def recv_checkpoint(self, src_rank: int, metadata: str, step: int, timeout: timedelta) -> dict[str, Any]:
        try:
            return self._receive(metadata, step, timeout.total_seconds())
        except (OSError, ValueError, StateRefused) as err:
            self._say(
                f"elastic: did not heal from {metadata} at step {step:,}: {err}; nothing of it was loaded",
                f"heal {metadata}",
            )
            raise StateRefused(f"state from {metadata} refused: {err}") from None

    def _receive(self, source: str, step: int, timeout_s: float) -> dict[str, Any]:
        if not source.startswith("http://"):
            raise StateRefused("it is not an hlat group's state server")
        with urllib.request.urlopen(f"{source}/challenge", timeout=timeout_s) as reply:
            challenge = reply.read(2 * 32 + 1).decode("ascii", "replace")
        nonce = secrets.token_hex(32)
        proof = mac(self._key, "pull", challenge, nonce, step).hex()
        request = urllib.request.Request(
            f"{source}/state/{step}",
            headers={"X-Hlat-Challenge": challenge, "X-Hlat-Nonce": nonce, "X-Hlat-Proof": proof},
        )
        limit = _state_bound(self._own_state())
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as reply:
                fingerprint = reply.headers.get("X-Hlat-Fingerprint", "")
                body = reply.read(limit + MAC_BYTES + 1)
        except urllib.error.HTTPError as err:
            raise StateRefused(f"it refused this group ({err.code}): the run secrets differ") from None
        if len(body) > limit + MAC_BYTES:
            raise StateRefused(f"it sent more than {limit:,} bytes, more than this group's own state")
        payload, tag = body[:-MAC_BYTES], body[-MAC_BYTES:]
        digest = hashlib.sha256(payload).hexdigest()
        if not hmac.compare_digest(tag, mac(self._key, "state", step, nonce, digest, fingerprint)):
            raise StateRefused("it cannot prove the run secret")
        return _streaming_load(io.BytesIO(payload), weights_only=True)

    def shutdown(self, wait: bool = True) -> None:
        """Stop serving, then close the socket; `wait`: until both are done (torchft's manager
        asks without, at the end of a run). Closing the socket under a running loop would leave
        its poll returning at once on the closed descriptor: a core spinning until the process
        exits."""
        stop = threading.Thread(target=self._stop, daemon=True, name="hlat-state-server-stop")
        stop.start()
        if wait:
            stop.join()

    def _stop(self) -> None:
        self._server.shutdown()  # returns once serve_forever has (within its 0.5 s poll)
        self._server.server_close()


class _Hashing(io.RawIOBase):
    """A write-only stream that passes bytes on and hashes them."""

    def __init__(self, out: Any):
        self.out, self.digest = out, hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.digest.update(data)
        self.out.write(data)
        return len(data)

    def hexdigest(self) -> str:
        return self.digest.hexdigest()


def _state_bound(state: Any) -> int:
    """What a peer's state (the same structure as this rank's) may take serialized: twice this
    rank's tensor bytes and 64 MiB for the rest."""
    leaves, _ = tree_flatten(state)
    return 2 * sum(t.numel() * t.element_size() for t in leaves if isinstance(t, torch.Tensor)) + (64 << 20)


def _server(host: str, handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    class Server(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        daemon_threads = True

    server = Server((host, 0), handler, bind_and_activate=False)
    server.socket.close()
    server.socket = listening_socket(host)  # a bad elastic.bind_address is one line
    server.server_address = server.socket.getsockname()
    return server
