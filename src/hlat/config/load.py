"""Load a run configuration: preset <- TOML file <- command-line overrides, then validate.

The one reader of a TOML configuration (presets, --config files, and a run directory's config.toml
through read_run_config); RunConfig.to_toml is its one writer.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from hlat.config.fields import value_problem
from hlat.config.run import Check, RunConfig
from hlat.errors import ConfigError, UserError, did_you_mean

DEFAULT_PRESET = "tiny"
PRESETS = "hlat.config.presets"
RUN_CONFIG = "config.toml"  # in a run directory: the resolved configuration it trained with


def preset_names() -> list[str]:
    return sorted(p.name.removesuffix(".toml") for p in resources.files(PRESETS).iterdir() if p.name.endswith(".toml"))


def load_config(
    preset: str | None = None,
    config_file: str | Path | None = None,
    overrides: list[str] | None = None,
    world: int | None = None,
    checks: Sequence[Check] = (),
) -> RunConfig:
    """Preset <- config file <- command-line overrides, then validate.

    The preset is `preset`, else the file's top-level `preset = "..."`, else (with no file) tiny;
    a `preset` other than the file's is noted in `notes`.
    A file without a preset applies over the built-in defaults: the HLAT 7B model shape and
    optimiser, but fp32 on one process with weight decay on matrices only (docs/recipe.md).
    With `world` (the number of processes that will run it), the micro-batch adapts to the layout
    unless the file or an override set it, and the layout is validated as well. `checks` add
    rules only higher layers know (hlat train passes the task registry's).
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
    file_preset = table.pop("preset", None)  # --preset, from the command line, overrides it
    if file_preset is not None and not isinstance(file_preset, str):
        raise ConfigError(
            [
                (
                    "preset",
                    f"expected a preset name (a string), got {type(file_preset).__name__} {file_preset!r} (from {config_file})",
                )
            ]
        )
    base = preset or file_preset or (None if config_file else DEFAULT_PRESET)
    if base is not None:
        if base not in preset_names():
            raise ConfigError(
                [
                    (
                        "preset",
                        f"unknown preset{did_you_mean(base, preset_names())}; available: {', '.join(preset_names())}",
                    )
                ]
            )
        for name, preset_table in _preset_tables(base):
            _apply_table(cfg, preset_table, source=f"preset {name}", user=False)
        cfg.name = base if config_file is None else cfg.name
    _apply_table(cfg, table, source=str(config_file), user=True)
    if preset and file_preset and file_preset != preset:
        cfg.notes.append(f"preset {preset} (--preset) instead of {config_file}'s preset = {file_preset!r}")
    for key, value in parse_overrides(overrides or []):
        set_field(cfg, key, value, source="command line", user=True)
    if world is not None:
        cfg.fit_micro_batch(world)
    cfg.validate(world, checks)
    return cfg


def _preset_tables(name: str) -> list[tuple[str, dict[str, Any]]]:
    """A preset's tables, the preset it names (`preset = "..."`, a variant of another) first."""
    table = tomllib.loads(resources.files(PRESETS).joinpath(f"{name}.toml").read_text())
    parent = table.pop("preset", None)
    return (_preset_tables(parent) if parent else []) + [(name, table)]


def read_run_config(path: str | Path) -> RunConfig:
    """A run directory's config.toml (`path` is the directory or the file), as hlat train or hlat
    import wrote it. Only [model] is validated: evaluation and export need the architecture, and a
    training corpus that has moved since must not stop them. A field the file lacks (it was written
    before the field existed, e.g. model.family or parallel.cp) keeps its default."""
    path = Path(path)
    file = path / RUN_CONFIG if path.is_dir() else path
    try:
        table = tomllib.loads(file.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise UserError(f"cannot read the run config {file}: {err}") from err
    cfg = RunConfig()
    _apply_table(cfg, table, source=str(file), user=True)
    problems = cfg.model.validate()
    if problems:
        raise ConfigError([(f"model.{key}", f"{message} (in {file})") for key, message in problems])
    return cfg


def parse_overrides(args: list[str]) -> list[tuple[str, str]]:
    """`--optim.lr 1e-4` and `--optim.lr=1e-4` -> [("optim.lr", "1e-4")]."""
    pairs, i = [], 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--") or "." not in arg.split("=", 1)[0]:
            shown = arg if arg.strip() else repr(arg)  # an empty argument, e.g. from an unset shell variable
            raise ConfigError([(shown, "expected an override like --section.field VALUE (e.g. --optim.lr 1e-4)")])
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
        raise ConfigError(
            [
                (
                    key,
                    f"unknown section{did_you_mean(section_name, list(sections))} (from {source}); sections: {', '.join(sections)}",
                )
            ]
        )
    section = sections[section_name]
    fields = {f.name: f for f in dataclasses.fields(section)}
    if field_name not in fields:
        raise ConfigError(
            [
                (
                    key,
                    f"unknown field{did_you_mean(field_name, list(fields), prefix=section_name + '.')} (from {source}); fields of [{section_name}]: {', '.join(fields)}",
                )
            ]
        )
    if fields[field_name].metadata.get("accepts_bool"):  # a choice of words that include true/false
        value = _bool_word(value) if isinstance(value, (bool, str)) else value
    expected = type(getattr(type(section)(), field_name))
    value = _coerce(key, value, expected, source)
    problem = value_problem(value)
    if problem:
        raise ConfigError([(key, f"{problem} (from {source})")])
    setattr(section, field_name, value)
    if user:
        cfg.user_set.add(key)


def _apply_table(cfg: RunConfig, table: dict[str, Any], source: str, user: bool) -> None:
    for key, value in table.items():
        if key == "name":
            cfg.name = str(value)
            if problem := value_problem(cfg.name):
                raise ConfigError([("name", f"{problem} (from {source})")])
        elif isinstance(value, dict):
            for sub, sub_value in value.items():
                set_field(cfg, f"{key}.{sub}", sub_value, source, user)
        else:
            raise ConfigError(
                [
                    (
                        key,
                        f"top-level keys must be [sections] (from {source}); did you mean to put it under a section such as [train]?",
                    )
                ]
            )


def _coerce(key: str, value: Any, expected: type, source: str) -> Any:
    """Convert TOML values and command-line strings to the field's type, or say what was wrong."""
    if expected is list:  # of strings: a TOML array, or comma-separated on the command line
        items = [item.strip() for item in value.split(",") if item.strip()] if isinstance(value, str) else value
        if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
            raise ConfigError(
                [(key, f"expected a list of strings, got {type(value).__name__} {value!r} (from {source})")]
            )
        return items
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
        raise ConfigError(
            [(key, f"expected {expected.__name__}, got {type(value).__name__} {value!r} (from {source})")]
        )
    return value


def _bool_word(value: bool | str) -> str:
    """A TOML or command-line boolean as "true"/"false"; other words lower-cased."""
    text = str(value).strip().lower()
    if text in ("true", "1", "yes", "on"):
        return "true"
    if text in ("false", "0", "no", "off"):
        return "false"
    return text
