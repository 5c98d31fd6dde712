"""One replica group of an elastic run (elastic.enabled), as the trainer sees it: the step's data.

Reading a step's micro-batches joins the groups present (a rejoining group heals here, taking a
peer's step and state) and deals this group its data shares (hlat.train.elastic.shares); the train
module's commit vote (hlat.train.elastic.module) then keeps the shares' new positions or puts them
back, and the trainer retries a step that did not commit. A rejoining group is refused when its
configuration, data or number of ranks differ from the live group it would heal from: the
fingerprint travels with the state."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from hlat.config.run import RunConfig
from hlat.data.batch import Batch
from hlat.errors import UserError
from hlat.faults import HOLD_TIMEOUT_S, hold_groups
from hlat.train.elastic.fingerprint import fingerprint
from hlat.train.elastic.module import ElasticTrainModule
from hlat.train.elastic.replicas import Replicas, like, local_tensors
from hlat.train.elastic.shares import ElasticData
from hlat.train.resume import Progress


class ElasticGroup:
    """The trainer's step data (hlat.train.step_data.StepData) in an elastic run; it also attaches
    the replicas to `module`. `progress`/`set_progress`: the trainer's counters, sent to and
    received from peers."""

    per = "data share and rank"  # what the step's micro-batch count is counted per

    def __init__(
        self,
        cfg: RunConfig,
        module: ElasticTrainModule,
        data: ElasticData,
        progress: Callable[[], Progress],
        set_progress: Callable[[Progress], None],
        out: Callable[[str], None],
        *,
        key: bytes,
    ):
        """`key`: the run's (hlat.train.elastic.secret.run_key)."""
        self.cfg, self.module, self.data, self.out = cfg, module, data, out
        self.progress, self.set_progress = progress, set_progress
        self.group = cfg.elastic.group
        layout = module.model.layout
        self.fingerprint = fingerprint(cfg, data, layout.world)
        self.replicas = Replicas(
            cfg.elastic,
            self._state_dict,
            self._load_state_dict,
            layout.rank,
            layout.world,
            key=key,
            fingerprint=self.fingerprint,
            out=out,
        )
        module.group = self
        self.loader = data  # the position a checkpoint holds (RunState)
        self.present = 0  # groups in the last quorum
        self.held: set[int] = set()  # the steps a test's hold (hlat.faults.hold_groups) already waited before
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

    def read(self) -> list[Batch]:
        """Join the step's quorum (a rejoining group takes its peer's step and state here), then read
        this process's micro-batches of the shares this group is dealt."""
        self._join()
        return self.data.batches(self.rank, self.present, self.replicas)

    def _join(self) -> None:
        self.rank, groups = self.replicas.join()
        deadline, step = time.monotonic() + HOLD_TIMEOUT_S, self.progress().step + 1
        while step not in self.held and groups < hold_groups(step) and time.monotonic() < deadline:  # tests only
            time.sleep(0.2)
            self.rank, groups = self.replicas.join()
        self.held.add(step)  # a retry of the step does not wait again
        if groups != self.present:
            self.out(
                f"elastic: {groups} group(s) present at step {self.progress().step + 1:,} "
                f"(was {self.present}); group {self.group} is rank {self.rank} and trains shares "
                f"{self.data.owned(self.rank, groups)} of {self.data.shares}"
            )
        self.present = groups
        self.started = time.perf_counter()

    def finish(self, committed: bool) -> None:
        """After the commit vote of the step read last: record it, or note the time lost (the trainer
        retries it with the groups then present, from the same positions)."""
        step = self.progress().step + 1
        self.data.finish(committed, step, self.group)
        if not committed:
            lost = time.perf_counter() - self.started
            self.failed_s += lost
            self.out(f"elastic: step {step:,} did not commit ({lost:.1f} s lost); retrying with the groups present")

    def skip(self, steps: int) -> None:
        raise AssertionError("rollbacks are refused for elastic runs (RunConfig.elastic_problems)")

    def tokens_by_source(self) -> dict[str, int]:
        """Every share's tokens of each source (the positions hold all groups')."""
        return {docs.name: n for docs, n in zip(self.data.docs, self.data.tokens_emitted)}

    def close(self) -> None:
        self.data.close()
        self.replicas.shutdown()
