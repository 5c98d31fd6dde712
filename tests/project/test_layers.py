"""hlat's top-level packages and modules import one way: down the layers below, never up.

Every import of hlat in src/hlat counts, at module level and inside functions alike, except those
in an `if TYPE_CHECKING:` block: those never run (no cycle, nothing loaded), so an annotation may
name a class of a higher layer. Imports inside one layer are allowed. Parsed with ast: nothing
is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "hlat"
# Bottom to top; a package or module may import those of its own layer and of lower ones.
LAYERS = [
    # Small helpers that import only each other. `__init__` is hlat's own: `import hlat.errors` must
    # stay cheap.
    {"__init__", "errors", "digests", "toml_value", "progress", "dtensor", "atomic_files", "output_dir", "faults"},
    {"accelerators"},  # the accelerator table: peaks, memory, bandwidth
    {"device"},
    {"config"},
    {"metrics"},  # reads config and the device runtime only: planning and train both measure with it
    {"model", "precision", "float8"},
    {"data"},
    {"parallel"},
    {"optim"},  # adamw names parameters as parallel.init does
    {"checkpoint"},
    {"planning"},
    {"eval"},
    {"train"},
    {"commands"},
    {"cli", "__main__"},
]
LAYER = {name: k for k, names in enumerate(LAYERS) for name in names}


def top_name(path: Path) -> str:
    """The top-level package or module of hlat that `path` belongs to."""
    return path.relative_to(SRC).with_suffix("").parts[0]


def imported_modules(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The dotted names an import statement in `module` loads, relative imports resolved."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # `from . import x` in a package's __init__ is that package's x
        parts = module.split(".")
        parts = parts[: len(parts) - node.level + is_package]
        base = ".".join(parts + ([base] if base else []))
    if base == "hlat":  # `from hlat import train`: the names are modules, or hlat's own (__version__)
        return [f"hlat.{alias.name}" if _is_module(alias.name) else "hlat" for alias in node.names]
    return [base]


def _is_module(name: str) -> bool:
    return (SRC / name).is_dir() or (SRC / f"{name}.py").is_file()


def type_checking_blocks(tree: ast.Module) -> set[int]:
    """ids of the statements inside `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`) blocks."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            inside |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return inside


def upward_imports(path: Path, source: str) -> list[str]:
    """'file:line: a imports b (layer i < j)' for each import in `source` (the file at `path`) of a
    higher layer or of a name in no layer."""
    here = top_name(path)
    parts = path.relative_to(SRC).with_suffix("").parts
    module = ".".join(("hlat",) + (parts[:-1] if path.name == "__init__.py" else parts))
    tree = ast.parse(source)
    skip = type_checking_blocks(tree)
    top = {id(n) for n in tree.body}
    problems = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom) or id(node) in skip:
            continue
        for name in imported_modules(node, module, path.name == "__init__.py"):
            if name != "hlat" and not name.startswith("hlat."):
                continue
            target = name.split(".")[1] if "." in name else "__init__"
            where = f"{path.relative_to(SRC.parents[1])}:{node.lineno}: {here} imports {target}"
            where += "" if id(node) in top else " (inside a function or block)"
            if target not in LAYER:
                problems.append(f"{where}, which is in no layer")
            elif LAYER[target] > LAYER[here]:
                problems.append(f"{where}, a higher layer ({LAYER[target]} > {LAYER[here]})")
    return problems


def test_every_package_has_a_layer():
    names = {top_name(path) for path in SRC.rglob("*.py")}
    assert names <= set(LAYER), (
        f"put {sorted(names - set(LAYER))} into a layer of LAYERS (tests/project/test_layers.py)"
    )


def test_no_import_goes_up_a_layer():
    problems = [
        problem
        for path in sorted(SRC.rglob("*.py"))
        if top_name(path) in LAYER
        for problem in upward_imports(path, path.read_text())
    ]
    assert not problems, "imports of a higher layer (move the code, or import it from above):\n" + "\n".join(problems)


def test_the_checker_finds_what_it_must():
    """An upward import at module level, inside a function, relative or `from hlat import`; not one
    under TYPE_CHECKING, nor one of the same or a lower layer."""
    planning = SRC / "planning" / "forecast.py"
    source = (
        "from typing import TYPE_CHECKING\n"
        "from hlat.config.run import RunConfig\n"  # down
        "from hlat.planning.memory import plan\n"  # same package
        "import hlat.train.trainer\n"  # up, line 4
        "from hlat import eval, __version__\n"  # up (eval; __version__ is hlat's own), line 5
        "from ..train import trainer\n"  # up, relative, line 6
        "if TYPE_CHECKING:\n"
        "    from hlat.train.trainer import Trainer\n"  # does not run
        "def f():\n"
        "    from hlat.train.sample import sample\n"  # up, inside a function, line 10
        "    from hlat.nowhere import x\n"  # in no layer, line 11
    )
    found = upward_imports(planning, source)
    assert [p.split(": ")[0].rsplit(":", 1)[1] for p in found] == ["4", "5", "6", "10", "11"], found
    assert found[0].startswith("src/hlat/planning/forecast.py:4: planning imports train, a higher layer ("), found
    assert "(inside a function or block)" in found[3] and "which is in no layer" in found[4]
