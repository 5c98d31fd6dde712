"""One replica group of an elastic run (elastic.enabled): the trainer's step joins the groups
present, reads this group's data shares, and commits or retries (hlat.parallel.elastic,
hlat.parallel.elastic_data). A rejoining group is refused when its configuration, data or number of
ranks differ from the live group it would heal from: the fingerprint travels with the state."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hlat.config.run import RunConfig
from hlat.data.batch import Batch
from hlat.digests import short_sha256
from hlat.errors import UserError
from hlat.faults import HOLD_TIMEOUT_S, hold_groups
from hlat.parallel.elastic import Replicas, like, local_tensors
from hlat.parallel.elastic_data import ElasticData
from hlat.train.resume import Progress
from hlat.train.train_module import TrainModule

# what every group must agree on (the rest names one group's files, devices and logging)
_SHARED_SECTIONS = ("model", "data", "optim", "schedule", "precision", "parallel", "recovery")
_SHARED_KEYS = ("train.seed", "train.global_batch", "train.micro_batch", "train.steps", "elastic.max_groups")


def fingerprint(cfg: RunConfig, data: ElasticData, ranks: int) -> str:
    """`ranks`: the group's processes (a rank heals from the same rank of a peer, shard for shard)."""
    keys = {f"{name}.{key}" for name in _SHARED_SECTIONS for key in vars(cfg.sections()[name])}
    text = cfg.to_toml(keys | set(_SHARED_KEYS)) + "\n".join(d.fingerprint() for d in data.docs)
    return short_sha256(f"{text}\nranks={ranks}")


class ElasticGroup:
    """`progress`/`set_progress`: the trainer's counters, sent to and received from peers."""

    def __init__(
        self,
        cfg: RunConfig,
        module: TrainModule,
        data: ElasticData,
        progress: Callable[[], Progress],
        set_progress: Callable[[Progress], None],
        out: Callable[[str], None],
    ):
        self.cfg, self.module, self.data, self.out = cfg, module, data, out
        self.progress, self.set_progress = progress, set_progress
        self.group = cfg.elastic.group
        layout = module.model.layout
        self.fingerprint = fingerprint(cfg, data, layout.world)
        self.replicas = Replicas(cfg.elastic, self._state_dict, self._load_state_dict, layout.rank, layout.world)
        self.present = 0  # groups in the last quorum
        self.failed_s = 0.0  # wall time of steps that did not commit (a group left or joined mid-step)

    def _state_dict(self) -> dict[str, Any]:
        return {
            "fingerprint": self.fingerprint,
            "group": self.group,
            "module": local_tensors(self.module.state_dict()),  # this rank's shards: weights_only loads them
            "progress": vars(self.progress()).copy(),
            "data": self.data.table_state(),
        }

    def _load_state_dict(self, state: dict[str, Any]) -> None:
        if state["fingerprint"] != self.fingerprint:
            raise UserError(
                f"elastic group {self.group} refused: its configuration or data (fingerprint {self.fingerprint}) "
                f"differ from group {state['group']}'s ({state['fingerprint']}); start it with the same config, "
                "data and tokenizer as the running groups"
            )
        self.module.load_state_dict(like(state["module"], self.module.state_dict()))
        self.set_progress(Progress(**state["progress"]))
        self.data.load_table_state(state["data"])
        self.out(
            f"elastic: group {self.group} rejoined from group {state['group']} at step {state['progress']['step']:,}"
        )

    def join(self) -> None:
        """Start the step's quorum; a rejoining group takes its peer's state here."""
        self.rank, groups = self.replicas.join()
        deadline = time.monotonic() + HOLD_TIMEOUT_S
        while groups < hold_groups(self.progress().step + 1) and time.monotonic() < deadline:  # tests only
            time.sleep(0.2)
            self.rank, groups = self.replicas.join()
        if groups != self.present:
            self.out(
                f"elastic: {groups} group(s) present at step {self.progress().step + 1:,} "
                f"(was {self.present}); group {self.group} is rank {self.rank} and trains shares "
                f"{self.data.owned(self.rank, groups)} of {self.data.shares}"
            )
        self.present = groups
        self.started = time.perf_counter()

    def batches(self) -> list[Batch]:
        return self.data.batches(self.rank, self.present, self.replicas)

    def finish(self, step: int) -> bool:
        """After the commit vote of step `step`: record it, or note the time lost and retry."""
        committed = self.replicas.committed
        self.data.finish(committed, step, self.group)
        if not committed:
            lost = time.perf_counter() - self.started
            self.failed_s += lost
            self.out(f"elastic: step {step:,} did not commit ({lost:.1f} s lost); retrying with the groups present")
        return committed

    def close(self) -> None:
        self.data.close()
        self.replicas.shutdown()
