"""Replica groups on torchft: the data-parallel replicate dimension across groups that may leave
and rejoin between steps (one torchrun job, or one plain process, per group).

Every rank of a group runs a torchft Manager (rank = its rank in the group; the group's rank 0
serves the group's quorum, over torchrun's TCPStore), and its collectives run with the ranks of
the same index in the other groups. Each step starts a quorum at torchft's lighthouse (a group
that died is no longer in it); a group that comes back heals in that call, each rank from the
same rank of a live peer (weights and optimizer state as this rank's local shards, counters, data
positions) sent over HTTP only to a peer that proves the run secret, and loaded with
weights_only=True only once its MAC proves the source knew it (hlat.train.elastic.transport); every
member of a quorum proves the secret before the step's data and gradients are exchanged
(hlat.train.elastic.members). Each rank's local gradient shards
(FSDP2 inside a group: DTensor.to_local) and its part of the loss are summed across the groups present
in one all-reduce, and the step commits only where every group's collectives succeeded
(should_commit); a failed step is retried with the next quorum.

torchft is an optional dependency (the `elastic` extra), imported only here (and by the transport
this imports) and only when elastic.enabled is set.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

import torch
from torch.distributed.tensor import DTensor

from hlat.config.elastic import ElasticConfig
from hlat.dtensor import local_tensor
from hlat.errors import UserError
from hlat.train.elastic.members import member_problems
from hlat.train.elastic.sockets import bound_store, manager_server_line, manager_server_port

INSTALL = "pip install 'hlat[elastic]'"


def import_torchft() -> Any:
    # torchft's servers log every quorum and commit at INFO; hlat logs membership changes itself
    os.environ.setdefault("RUST_LOG", "warn")
    try:
        import torchft
    except ImportError as err:
        raise UserError(f"elastic.enabled needs torchft, which is not installed: {INSTALL} ({err})") from None
    return torchft


def check_lighthouse(address: str, timeout_s: float) -> str:
    """The address of this machine that reaches the lighthouse; a one-line error when nothing answers there."""
    url = urlparse(address if "://" in address else f"http://{address}")
    if url.hostname is None or url.port is None:
        raise UserError(f"elastic.lighthouse={address!r} is not an address; give http://HOST:PORT")
    try:
        with socket.create_connection((url.hostname, url.port), timeout=timeout_s) as connection:
            return connection.getsockname()[0]
    except OSError as err:
        raise UserError(
            f"elastic.lighthouse={address}: no lighthouse answers ({err.strerror or err}); start one with "
            "`hlat lighthouse` or fix --elastic.lighthouse"
        ) from None


def _group_store(host: str) -> tuple[str, int, Any]:
    """The group's TCPStore that torchft's Manager needs: torchrun's, else one of our own (a plain
    process) on `host`, where the other groups reach it."""
    if "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        return os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), None
    store = bound_store(host)
    return host, store.port, store


def local_tensors(state: Any) -> Any:
    """`state` with every DTensor replaced by this rank's shard (a plain tensor: what weights_only loads)."""
    if isinstance(state, dict):
        return {k: local_tensors(v) for k, v in state.items()}
    if isinstance(state, list | tuple):
        return type(state)(local_tensors(v) for v in state)
    return local_tensor(state) if isinstance(state, torch.Tensor) else state


def like(received: Any, own: Any) -> Any:
    """`received` (from local_tensors on the same rank of a peer) with each shard put back into a
    DTensor laid out as the matching entry of `own` (this rank's state) is; no communication."""
    if isinstance(own, dict):
        return {k: like(received[k], own[k]) if k in own else v for k, v in received.items()}
    if isinstance(own, list | tuple):
        return type(own)(like(r, o) for r, o in zip(received, own))
    if isinstance(own, DTensor):
        return DTensor.from_local(
            received, own.device_mesh, own.placements, run_check=False, shape=own.shape, stride=own.stride()
        )
    return received


def no_quorum(cfg: ElasticConfig) -> UserError:
    """Why a step's quorum timed out, as far as this group can tell, and what to do."""
    resume = "restart this group with the same command: it resumes from the last checkpoint"
    try:
        check_lighthouse(cfg.lighthouse, min(cfg.timeout_s, 10.0))
    except UserError:
        return UserError(
            f"elastic.lighthouse={cfg.lighthouse}: the lighthouse stopped answering; restart it "
            f"(`hlat lighthouse`) on the same address, then {resume}"
        )
    return UserError(
        f"elastic.lighthouse={cfg.lighthouse}: no quorum within elastic.timeout_s={cfg.timeout_s:g} s: the "
        "lighthouse was restarted since this group joined (torchft's groups do not rejoin a new one), or too "
        f"few groups answer (a quorum needs elastic.min_groups and more than half of the live groups); {resume}"
    )


class Notices:
    """Log lines about peers, each said at most once per `interval_s` (a peer that stays in the
    quorum would otherwise repeat it every retry)."""

    def __init__(self, out: Callable[[str], None], interval_s: float):
        self.out, self.interval_s, self.said = out, interval_s, dict[str, float]()

    def say(self, line: str, key: str) -> None:
        """`line`, unless a line of the same `key` was said within the interval."""
        now = time.monotonic()
        if now - self.said.get(key, -math.inf) >= self.interval_s:
            self.said[key] = now
            self.out(line)


class Replicas:
    """This group's place among the replica groups present; every method is a step's collective.
    `state_dict`/`load_state_dict`: what a live group sends a rejoining one, and how it applies it.
    `rank`, `ranks`: this process's rank in its group, and the group's size."""

    def __init__(
        self,
        cfg: ElasticConfig,
        state_dict: Callable[[], dict[str, Any]],
        load_state_dict: Callable[[dict[str, Any]], None],
        rank: int = 0,
        ranks: int = 1,
        *,
        key: bytes,
        fingerprint: str,
        out: Callable[[str], None],
    ):
        import_torchft()
        from torchft import Manager, ProcessGroupGloo

        from hlat.train.elastic.transport import AuthenticatedTransport

        reaches = check_lighthouse(cfg.lighthouse, min(cfg.timeout_s, 10.0))  # also: fail now if none answers
        host = cfg.bind_address or reaches  # every socket hlat opens for this group listens there only
        self.cfg, self.key, self.fingerprint = cfg, key, fingerprint
        self.notices = Notices(out, cfg.timeout_s)
        timeout = timedelta(seconds=cfg.timeout_s)
        store_host, port, self._store = _group_store(host)
        self.transport = AuthenticatedTransport(
            key=key, fingerprint=fingerprint, host=host, timeout=timeout, own_state=state_dict, say=self.notices.say
        )
        self.manager = Manager(
            pg=ProcessGroupGloo(timeout=timeout),
            load_state_dict=load_state_dict,
            state_dict=state_dict,
            min_replica_size=cfg.min_groups,
            use_async_quorum=False,  # a rejoining group heals before its first forward
            timeout=timeout,
            quorum_timeout=timeout,
            connect_timeout=timeout,
            rank=rank,
            world_size=ranks,
            store_addr=store_host,
            store_port=port,
            lighthouse_addr=cfg.lighthouse,
            replica_id=cfg.group,
            hostname=host,
            checkpoint_transport=self.transport,
            init_sync=False,  # every group initialises the same weights from train.seed
        )
        if rank == 0:  # the group's rank 0 runs torchft's manager server
            out(manager_server_line(manager_server_port(store_host, port), host))
        self.committed = False

    def join(self) -> tuple[int, int]:
        """Start the step's quorum (a rejoining group heals here, only from a peer that proves the
        run secret), and check that every member is one of this run's groups with this group's
        fingerprint (else the step does not commit); (this group's rank, groups present)."""
        try:
            self.manager.start_quorum()
        except TimeoutError:
            raise no_quorum(self.cfg) from None
        rank = self.manager.participating_rank()
        rank, groups = (0 if rank is None else rank), max(self.manager.num_participants(), 1)
        if groups > 1 and not self.failed():
            problems = member_problems(
                key=self.key,
                name=self.cfg.group,
                fingerprint=self.fingerprint,
                rank=rank,
                members=groups,
                sum_=self.sum_,
            )
            for member, what in problems if not self.failed() else []:
                self.refuse(member, what)
        return rank, groups

    def sum_(self, tensor: torch.Tensor) -> torch.Tensor:
        """In place, over the groups present. On a failure the values are garbage and the step will not commit."""
        from torch.distributed import ReduceOp

        self.manager.allreduce(tensor, reduce_op=ReduceOp.SUM).wait()
        return tensor

    def failed(self) -> bool:
        """A collective of this step failed (a group left mid-step): the step will not commit."""
        return self.manager.errored() is not None

    def reduce_gradients(self, params: Iterable[torch.nn.Parameter], share: torch.Tensor) -> torch.Tensor:
        """Sum this rank's gradient shards and its part of the loss over the groups present, in one all-reduce."""
        params = list(params)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        shards = [local_tensor(g) for g in grads]  # FSDP2: the same shard on the same rank of every group
        flat = torch.cat([g.reshape(-1) for g in shards] + [share.reshape(1).to(shards[0].dtype)])
        self.sum_(flat)
        offset = 0
        for p, g, shard in zip(params, grads, shards):
            shard.copy_(flat[offset : offset + shard.numel()].view_as(shard))
            p.grad = g
            offset += shard.numel()
        return flat[-1].to(share.dtype)

    def refuse(self, sender: int, what: str) -> None:
        """Replica rank `sender` of this step's quorum did `what`, which no group of this run does:
        this step does not commit (the healthy groups go on without its effect), and the log says so."""
        self.manager.report_error(RuntimeError(f"replica rank {sender} {what}"))
        step = self.manager.current_step() + 1
        self.notices.say(f"elastic: replica rank {sender} {what} at step {step:,}; the step does not commit", what)

    def should_commit(self) -> bool:
        self.committed = self.manager.should_commit()
        return self.committed

    def shutdown(self) -> None:
        self.manager.shutdown(wait=False)
