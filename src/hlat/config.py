"""Compose the run configuration from component configs, TOML presets and command-line overrides.

Each component owns a small dataclass next to its code; a run is one section per component.
Everything is validated before any work starts, and every problem names its field and the fix.
Given the world size (torchrun's WORLD_SIZE), the layout-dependent settings are checked too, before
any process group exists, and a micro-batch that no file or override set adapts to the layout.
"""

from __future__ import annotations

import dataclasses
import difflib
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from hlat.checkpoint.config import CheckpointConfig
from hlat.checkpoint.recovery import RecoveryConfig
from hlat.data.config import DataConfig
from hlat.errors import ConfigError
from hlat.eval.validation import EvalConfig
from hlat.model.config import ModelConfig
from hlat.optim.config import OptimConfig, ScheduleConfig
from hlat.parallel.config import ParallelConfig
from hlat.toml_value import toml_value
from hlat.train.config import PrecisionConfig, TrainConfig
from hlat.train.profiling import ProfileConfig
from hlat.train.wandb_sink import WandbConfig

DEFAULT_PRESET = "tiny"


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
    name: str = "run"  # preset or config-file name; names the default run directory
    # "section.field" keys a config file or the command line set (a preset's values are not the
    # user's choice: those may adapt to the layout), and what load_config adapted, to be logged.
    user_set: set[str] = field(default_factory=set, compare=False, repr=False)
    notes: list[str] = field(default_factory=list, compare=False, repr=False)

    def sections(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if dataclasses.is_dataclass(getattr(self, f.name))}

    def validate(self, world: int | None = None) -> None:
        """Raise ConfigError with every problem; with `world`, also the layout's over that many processes."""
        problems = [(f"{name}.{key}", msg) for name, section in self.sections().items() for key, msg in section.validate()]
        if self.data.seq_len > self.model.max_seq_len:
            problems.append(("data.seq_len", f"{self.data.seq_len} exceeds model.max_seq_len={self.model.max_seq_len}; shorten the rows or raise the model's limit"))
        if self.eval.every and not self.data.val_source:
            problems.append(("eval.every", "validation needs held-out data: set --data.val_source holdout (or a path), or eval.every 0"))
        traced = self.profile.range() if not self.profile.validate() else None
        if traced and traced[1] > self.train.steps:
            problems.append(("profile.steps", f"{self.profile.steps} ends after the run's last step (train.steps={self.train.steps}); "
                             f"trace steps within 1:{self.train.steps}"))
        if world is not None and not problems:  # the layout rules assume sane degrees and batch sizes
            problems += self.layout_problems(world)
        if problems:
            raise ConfigError(problems)

    def layout_problems(self, world: int) -> list[tuple[str, str]]:
        """What does not fit pp x dp x tp over `world` processes: the degrees themselves, heads and
        widths over tp, layers over pipeline stages, the global batch over dp x micro-batch, enough
        micro-batches to fill the pipeline, data shards over dp, and the dp sharding's limits."""
        from hlat.parallel.data_parallel import check_data_parallel
        from hlat.parallel.mesh import resolve_degrees
        from hlat.parallel.tensor_parallel import check_tensor_parallel

        try:
            pp, dp, tp = resolve_degrees(self.parallel, world)
        except ConfigError as err:
            return err.problems
        problems = []
        checks = [lambda: check_data_parallel(self.parallel.dp_sharding, dp, tp, pp)]
        if tp > 1:
            checks.insert(0, lambda: check_tensor_parallel(self.model, tp))
        for check in checks:  # the rules the model builder applies, asked before any process group exists
            try:
                check()
            except ConfigError as err:
                problems += err.problems
        stages = pp * self.parallel.pp_stages_per_rank
        if pp > 1 and stages > self.model.n_layers:
            problems.append(("parallel.pp", f"{stages} pipeline stages (pp={pp} x pp_stages_per_rank={self.parallel.pp_stages_per_rank}) "
                             f"need at least as many layers; model.n_layers={self.model.n_layers}"))
        batch, micro = self.train.global_batch, self.train.micro_batch
        if batch % (dp * micro) and not batch % micro:  # (not a multiple of micro: TrainConfig says so)
            fix = "" if "train.micro_batch" not in self.user_set else " or a train.micro_batch that divides it"
            problems.append(("train.global_batch", f"{batch} sequences do not split into dp={dp} data-parallel ranks x "
                             f"train.micro_batch={micro}; use a multiple of {dp * micro}{fix}"))
        elif pp > 1 and batch // dp // micro < pp:
            problems.append(("train.micro_batch", f"pipeline parallel needs at least pp={pp} micro-batches per step on each "
                             f"data-parallel rank, got {batch // dp // micro} ({batch} / dp={dp} / micro_batch={micro}); "
                             "lower train.micro_batch or raise train.global_batch"))
        if dp > self.data.virtual_shards:
            problems.append(("data.virtual_shards", f"{self.data.virtual_shards} shards cannot be dealt to dp={dp} "
                             f"data-parallel ranks; set --data.virtual_shards {dp} or more"))
        return problems

    def fit_micro_batch(self, world: int) -> None:
        """Take the largest micro-batch not above the current one that splits the global batch over
        dp ranks (with at least pp micro-batches per step) when no file or override chose it; say so
        in `notes`. Anything that still does not fit is left for validate to report."""
        from hlat.parallel.mesh import resolve_degrees

        current, batch = self.train.micro_batch, self.train.global_batch
        if "train.micro_batch" in self.user_set or min(current, batch, self.parallel.tp, self.parallel.pp) < 1:
            return
        try:
            pp, dp, _ = resolve_degrees(self.parallel, world)
        except ConfigError:
            return
        per_rank = batch // dp
        divisors = [m for m in range(min(current, per_rank), 0, -1) if not per_rank % m]
        # too few sequences to fill the pipeline: still split them, so the pipeline rule is what validate reports
        fits = [m for m in divisors if per_rank // m >= pp] or divisors
        if batch % dp or not fits or fits[0] == current:
            return
        micro = self.train.micro_batch = fits[0]
        self.notes.append(f"train.micro_batch = {micro} instead of {current}: the global batch of {batch} over dp={dp} "
                          f"is {per_rank} sequences per rank, {per_rank // micro} micro-batch(es) of {micro}"
                          f"{f' (pp={pp} needs at least {pp})' if pp > 1 else ''}; set --train.micro_batch to choose")

    @property
    def grad_accum_steps(self) -> int:
        return self.train.global_batch // self.train.micro_batch

    @property
    def run_dir(self) -> Path:
        return Path(self.train.run_dir or f"runs/{self.name}")

    def to_toml(self) -> str:
        lines = [f"name = {toml_value(self.name)}"]
        for name, section in self.sections().items():
            lines.append(f"\n[{name}]")
            lines += [f"{f.name} = {toml_value(getattr(section, f.name))}" for f in dataclasses.fields(section)]
        return "\n".join(lines) + "\n"


def preset_names() -> list[str]:
    return sorted(p.name.removesuffix(".toml") for p in resources.files("hlat.configs").iterdir() if p.name.endswith(".toml"))


def load_config(preset: str | None = None, config_file: str | Path | None = None, overrides: list[str] | None = None,
                world: int | None = None) -> RunConfig:
    """Preset <- config file <- command-line overrides, then validate.

    The preset is `preset`, else the file's top-level `preset = "..."`, else (with no file) tiny.
    A file without a preset applies over the built-in defaults: the HLAT 7B model shape and
    optimiser, but fp32 on one process with weight decay on matrices only (docs/recipe.md).
    With `world` (the number of processes that will run it), the micro-batch adapts to the layout
    unless the file or an override set it, and the layout is validated as well.
    """
    cfg = RunConfig()
    table: dict[str, Any] = {}
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError([("--config", f"no such file: {path}")])
        try:
            table = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as err:
            raise ConfigError([("--config", f"{path} is not valid TOML: {err}")]) from err
        cfg.name = path.stem
    base = preset or table.pop("preset", None) or (None if config_file else DEFAULT_PRESET)
    if base is not None:
        if base not in preset_names():
            raise ConfigError([("preset", f"unknown preset{_did_you_mean(base, preset_names())}; available: {', '.join(preset_names())}")])
        _apply_table(cfg, tomllib.loads(resources.files("hlat.configs").joinpath(f"{base}.toml").read_text()),
                     source=f"preset {base}", user=False)
        cfg.name = base if config_file is None else cfg.name
    _apply_table(cfg, table, source=str(config_file), user=True)
    for key, value in parse_overrides(overrides or []):
        set_field(cfg, key, value, source="command line", user=True)
    if world is not None:
        cfg.fit_micro_batch(world)
    cfg.validate(world)
    return cfg


def parse_overrides(args: list[str]) -> list[tuple[str, str]]:
    """`--optim.lr 1e-4` and `--optim.lr=1e-4` -> [("optim.lr", "1e-4")]."""
    pairs, i = [], 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or "." not in arg.split("=", 1)[0]:
            raise ConfigError([(arg, "expected an override like --section.field VALUE (e.g. --optim.lr 1e-4)")])
        if "=" in arg:
            key, value = arg[2:].split("=", 1)
            i += 1
        else:
            if i + 1 >= len(args):
                raise ConfigError([(arg[2:], "missing value; write --section.field VALUE")])
            key, value = arg[2:], args[i + 1]
            i += 2
        pairs.append((key, value))
    return pairs


def set_field(cfg: RunConfig, key: str, value: Any, source: str, user: bool) -> None:
    section_name, _, field_name = key.partition(".")
    sections = cfg.sections()
    if section_name not in sections or not field_name:
        raise ConfigError([(key, f"unknown section{_did_you_mean(section_name, list(sections))} (from {source}); sections: {', '.join(sections)}")])
    section = sections[section_name]
    fields = {f.name: f for f in dataclasses.fields(section)}
    if field_name not in fields:
        raise ConfigError([(key, f"unknown field{_did_you_mean(field_name, list(fields), prefix=section_name + '.')} (from {source}); fields of [{section_name}]: {', '.join(fields)}")])
    if fields[field_name].metadata.get("accepts_bool"):  # a choice of words that include true/false
        value = _bool_word(value) if isinstance(value, (bool, str)) else value
    expected = type(getattr(type(section)(), field_name))
    setattr(section, field_name, _coerce(key, value, expected, source))
    if user:
        cfg.user_set.add(key)


def _apply_table(cfg: RunConfig, table: dict[str, Any], source: str, user: bool) -> None:
    for key, value in table.items():
        if key == "name":
            cfg.name = str(value)
        elif isinstance(value, dict):
            for sub, sub_value in value.items():
                set_field(cfg, f"{key}.{sub}", sub_value, source, user)
        else:
            raise ConfigError([(key, f"top-level keys must be [sections] (from {source}); did you mean to put it under a section such as [train]?")])


def _coerce(key: str, value: Any, expected: type, source: str) -> Any:
    """Convert TOML values and command-line strings to the field's type, or say what was wrong."""
    if isinstance(value, str) and expected is not str:
        text = value.strip().lower()
        if expected is bool:
            if text in ("true", "1", "yes", "on"):
                return True
            if text in ("false", "0", "no", "off"):
                return False
        else:
            try:
                number = float(text.replace("_", ""))
            except ValueError:
                number = None
            if number is not None and (expected is float or number.is_integer()):
                return expected(number)
        raise ConfigError([(key, f"expected {expected.__name__}, got {value!r} (from {source})")])
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise ConfigError([(key, f"expected {expected.__name__}, got {type(value).__name__} {value!r} (from {source})")])
    return value


def _bool_word(value: bool | str) -> str:
    """A TOML or command-line boolean as "true"/"false"; other words lower-cased."""
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return "true"
    if text in ("false", "0", "no", "off"):
        return "false"
    return text


def _did_you_mean(word: str, choices: list[str], prefix: str = "") -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f" {word!r}; did you mean '{prefix}{close[0]}'?" if close else f" {word!r}"


