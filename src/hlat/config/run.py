"""The run configuration: one section per component, validated as a whole.

Every problem names its field and the fix. Given the world size (torchrun's WORLD_SIZE), the
layout-dependent settings are checked too, before any process group exists.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hlat.config.checkpoint import CheckpointConfig
from hlat.config.data import DataConfig
from hlat.config.deterministic import deterministic_layout_problems, deterministic_problems
from hlat.config.elastic import ElasticConfig
from hlat.config.eval import EvalConfig
from hlat.config.fields import value_problem, value_problems
from hlat.config.layout import check_context_parallel, check_data_parallel, check_tensor_parallel, resolve_degrees
from hlat.config.model import ModelConfig
from hlat.config.optim import OptimConfig, ScheduleConfig
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.config.profile import ProfileConfig
from hlat.config.recovery import RecoveryConfig
from hlat.config.train import TrainConfig
from hlat.config.wandb import WandbConfig
from hlat.errors import ConfigError
from hlat.toml_value import toml_value

Check = Callable[["RunConfig"], list[tuple[str, str]]]


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    recovery: RecoveryConfig = field(default_factory=RecoveryConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    name: str = "run"  # preset or config-file name; names the default run directory
    # "section.field" keys a config file or the command line set (a preset's values are not the
    # user's choice: those may adapt to the layout), and what load_config adapted, to be logged.
    user_set: set[str] = field(default_factory=set, compare=False, repr=False)
    notes: list[str] = field(default_factory=list, compare=False, repr=False)

    def sections(self) -> dict[str, Any]:
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if dataclasses.is_dataclass(getattr(self, f.name))
        }

    def validate(self, world: int | None = None, checks: Sequence[Check] = ()) -> None:
        """Raise ConfigError with every problem; with `world`, also the layout's over that many
        processes; `checks` are what only higher layers know (e.g. the task registry's names)."""
        problems = [
            (f"{name}.{key}", msg)
            for name, section in self.sections().items()
            for key, msg in value_problems(section) + section.validate()
        ]
        if name_problem := value_problem(self.name):
            problems.append(("name", name_problem))
        problems += [problem for check in checks for problem in check(self)]
        if self.data.seq_len > self.model.max_seq_len:
            problems.append(
                (
                    "data.seq_len",
                    f"{self.data.seq_len} exceeds model.max_seq_len={self.model.max_seq_len}; shorten the rows or raise the model's limit",
                )
            )
        problems += self.elastic_problems() + deterministic_problems(self) + self.muon_problems()
        if self.eval.every and not self.data.val_source:
            problems.append(
                (
                    "eval.every",
                    "validation needs held-out data: set --data.val_source holdout (or a path), or eval.every 0",
                )
            )
        traced = self.profile.range() if not self.profile.validate() else None
        if traced and traced[1] > self.train.steps:
            problems.append(
                (
                    "profile.steps",
                    f"{self.profile.steps} ends after the run's last step (train.steps={self.train.steps}); "
                    f"trace steps within 1:{self.train.steps}",
                )
            )
        if world is not None and not problems:  # the layout rules assume sane degrees and batch sizes
            problems += self.layout_problems(world)
        if problems:
            raise ConfigError(problems)

    def elastic_problems(self) -> list[tuple[str, str]]:
        """An elastic group is one process, or FSDP2, TP or PP over its ranks (no CP or HSDP inside it
        yet), and splits the global batch into elastic.max_groups shares."""
        el, batch, micro = self.elastic, self.train.global_batch, self.train.micro_batch
        if not el.enabled or el.max_groups < 1 or micro < 1:
            return []
        problems = []
        if batch % (el.max_groups * micro) and not self.train.deterministic:  # (its shares: micro-batches)
            problems.append(
                (
                    "train.global_batch",
                    f"{batch} sequences do not split into elastic.max_groups={el.max_groups} shares x "
                    f"train.micro_batch={micro}; use a multiple of {el.max_groups * micro}",
                )
            )
        par = self.parallel
        if (par.cp, par.dp_shard) != (1, 0):
            problems.append(
                (
                    "elastic.enabled",
                    "a replica group runs FSDP2, TP or PP over its ranks only: set parallel.cp to 1 "
                    "and parallel.dp_shard to 0",
                )
            )
        if "rollback" in (self.recovery.nonfinite, self.recovery.spike_action if self.recovery.spike_sigmas else ""):
            problems.append(
                (
                    "elastic.enabled",
                    "rollbacks are not coordinated across groups yet: use recovery actions skip or error",
                )
            )
        return problems

    def muon_problems(self) -> list[tuple[str, str]]:
        """What Muon does not run with yet, by name."""
        if self.optim.name == "muon" and self.elastic.enabled:
            why = "an elastic group that heals does not carry Muon's momentum yet: use --optim.name adamw"
            return [("elastic.enabled", f"with optim.name muon: {why}")]
        return []

    def _elastic_group_problems(self, world: int, dp: int) -> list[tuple[str, str]]:
        """A replica group of `world` processes: FSDP2, tp or pp over all of them (what is tested; no two
        of them yet), each share's micro-batches dealt evenly over its `dp` data-parallel ranks."""
        problems = []
        degrees = {"dp": dp, "tp": self.parallel.tp, "pp": self.parallel.pp}
        if sum(d > 1 for d in degrees.values()) > 1:
            mixed = " x ".join(f"{name} {d}" for name, d in degrees.items() if d > 1)
            problems.append(
                (
                    "parallel.tp" if self.parallel.tp > 1 else "parallel.pp",
                    f"{mixed} inside a replica group is not supported yet: run FSDP2 (--parallel.dp_sharding "
                    f"fsdp), --parallel.tp {world} or --parallel.pp {world} over the whole group",
                )
            )
        if dp > 1 and self.parallel.dp_sharding != "fsdp":
            problems.append(
                (
                    "parallel.dp_sharding",
                    f"a replica group of {dp} data-parallel ranks runs FSDP2 over them: set --parallel.dp_sharding "
                    f"fsdp (not {self.parallel.dp_sharding}), or launch one process (or one tp group) per group",
                )
            )
        el, micro = self.elastic, self.train.micro_batch
        if self.train.global_batch % (el.max_groups * micro * dp) and not self.train.deterministic:
            problems.append(
                (
                    "train.global_batch",
                    f"{self.train.global_batch} sequences do not split into elastic.max_groups={el.max_groups} "
                    f"shares x {dp} data-parallel ranks per group x train.micro_batch={micro}; use a multiple of "
                    f"{el.max_groups * micro * dp}",
                )
            )
        return problems

    def layout_problems(self, world: int) -> list[tuple[str, str]]:
        """What does not fit the degrees over `world` processes: the degrees themselves, heads and
        widths over tp, layers over pipeline stages, the global batch over dp x micro-batch, enough
        micro-batches to fill the pipeline, data shards over dp, and the dp sharding's limits."""
        try:
            degrees = resolve_degrees(self.parallel, world)
        except ConfigError as err:
            return err.problems
        pp, dp = degrees.pp, degrees.dp
        problems = []
        if self.elastic.enabled and world > 1:
            problems += self._elastic_group_problems(world, degrees.dp)
        problems += deterministic_layout_problems(self, degrees)
        checks = [
            lambda: check_data_parallel(self.parallel.dp_sharding, degrees),
            lambda: check_context_parallel(degrees, self.parallel.dp_sharding, self.data.seq_len),
        ]
        if degrees.tp > 1:
            checks.insert(0, lambda: check_tensor_parallel(self.model, degrees.tp))
        for check in checks:  # the rules the model builder applies, asked before any process group exists
            try:
                check()
            except ConfigError as err:
                problems += err.problems
        if self.precision.bf16_weight_cache and dp > 1 and self.parallel.dp_sharding in ("zero2", "fsdp"):
            problems.append(
                (
                    "precision.bf16_weight_cache",
                    f"FSDP2 ({self.parallel.dp_sharding}) casts the weights as it gathers them; set it to false "
                    "(--parallel.reshard_after_backward false gathers once per step)",
                )
            )
        stages = pp * self.parallel.pp_stages_per_rank
        if pp > 1 and stages > self.model.n_layers:
            problems.append(
                (
                    "parallel.pp",
                    f"{stages} pipeline stages (pp={pp} x pp_stages_per_rank={self.parallel.pp_stages_per_rank}) "
                    f"need at least as many layers; model.n_layers={self.model.n_layers}",
                )
            )
        batch, micro = self.train.global_batch, self.train.micro_batch
        if batch % (dp * micro) and not batch % micro:  # (not a multiple of micro: TrainConfig says so)
            fix = "" if "train.micro_batch" not in self.user_set else " or a train.micro_batch that divides it"
            problems.append(
                (
                    "train.global_batch",
                    f"{batch} sequences do not split into dp={dp} data-parallel ranks x "
                    f"train.micro_batch={micro}; use a multiple of {dp * micro}{fix}",
                )
            )
        elif pp > 1 and batch // dp // micro < pp and not self.train.deterministic:  # (it steps one at a time)
            problems.append(
                (
                    "train.micro_batch",
                    f"pipeline parallel needs at least pp={pp} micro-batches per step on each "
                    f"data-parallel rank, got {batch // dp // micro} ({batch} / dp={dp} / micro_batch={micro}); "
                    "lower train.micro_batch or raise train.global_batch",
                )
            )
        if self.data.virtual_shards and dp > self.data.virtual_shards:
            problems.append(
                (
                    "data.virtual_shards",
                    f"{self.data.virtual_shards} shards cannot be dealt to dp={dp} "
                    f"data-parallel ranks; set --data.virtual_shards {dp} or more",
                )
            )
        return problems

    def fit_micro_batch(self, world: int) -> None:
        """Take the largest micro-batch not above the current one that splits the global batch over
        dp ranks (with at least pp micro-batches per step) when no file or override chose it; say so
        in `notes`. Anything that still does not fit is left for validate to report."""
        current, batch = self.train.micro_batch, self.train.global_batch
        if (
            self.train.deterministic  # the micro-batch is part of what two layouts must share
            or "train.micro_batch" in self.user_set
            or min(current, batch, self.parallel.tp, self.parallel.pp, self.parallel.cp) < 1
        ):
            return
        try:
            degrees = resolve_degrees(self.parallel, world)
        except ConfigError:
            return
        pp, dp = degrees.pp, degrees.dp
        per_rank = batch // dp
        divisors = [m for m in range(min(current, per_rank), 0, -1) if not per_rank % m]
        # too few sequences to fill the pipeline: still split them, so the pipeline rule is what validate reports
        fits = [m for m in divisors if per_rank // m >= pp] or divisors
        if batch % dp or not fits or fits[0] == current:
            return
        micro = self.train.micro_batch = fits[0]
        self.notes.append(
            f"train.micro_batch = {micro} instead of {current}: the global batch of {batch} over dp={dp} "
            f"is {per_rank} sequences per rank, {per_rank // micro} micro-batch(es) of {micro}"
            f"{f' (pp={pp} needs at least {pp})' if pp > 1 else ''}; set --train.micro_batch to choose"
        )

    @property
    def run_dir(self) -> Path:
        return Path(self.train.run_dir or f"runs/{self.name}")

    def to_toml(self, keys: Collection[str] | None = None) -> str:
        """The configuration as TOML (what a run directory's config.toml holds): every field, or
        only the "section.field" `keys`, for a file that leaves the rest to a preset or the defaults.
        hlat.config.load reads it back."""
        lines = [f"name = {toml_value(self.name)}"]
        for name, section in self.sections().items():
            chosen = [f.name for f in dataclasses.fields(section) if keys is None or f"{name}.{f.name}" in keys]
            if chosen:
                lines.append(f"\n[{name}]")
                lines += [f"{field} = {toml_value(getattr(section, field))}" for field in chosen]
        return "\n".join(lines) + "\n"
