"""`pip install .` ships no test-only module: every module under src/hlat is imported by another
one, started by one as a script, named by a command or the console entry, or imported by a
benchmark (benchmarks run against the installed package). Helpers that only tests use live in
tests/ (the simulated accelerator: tests/device/)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from hlat.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
ENTRY_POINTS = {"hlat.__main__", "hlat.cli"}  # `python -m hlat` and the function [project.scripts] names


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")


def imported_names(path: Path, package: str) -> set[str]:
    """Modules a file imports (`from a import b` counts a.b, which may be a module), resolved
    relative to `package`; bare names also as siblings (a script run by path imports its neighbours
    so), and any `name.py` string (a script run by path)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, base] if base else parent)
            names |= {base} | {f"{base}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.endswith(".py"):
            names.add(node.value.removesuffix(".py"))
    return names | {f"{package}.{n}" for n in names}


def test_every_module_has_an_importer_outside_the_tests() -> None:
    modules = {module_name(p): p for p in (SRC / "hlat").rglob("*.py")}
    importers = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        importers[name] = imported_names(path, package)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"].values()
    assert {s.partition(":")[0] for s in scripts} <= ENTRY_POINTS
    used = set(ENTRY_POINTS) | {f"hlat.commands.{m}" for m in COMMANDS.values()}
    used |= {n for p in (ROOT / "benchmarks").glob("*.py") for n in imported_names(p, "benchmarks")}
    used |= {n for importer, names in importers.items() for n in names if n != importer}
    packages = {module_name(p) for p in (SRC / "hlat").rglob("__init__.py")}  # imported with their modules
    unused = sorted(set(modules) - used - packages)
    assert not unused, f"modules nothing but the tests import (move them to tests/): {unused}"
