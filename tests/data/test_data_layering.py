"""src/hlat/data imports one way: each module imports only modules of lower layers, at module
level (no deferred imports inside functions or TYPE_CHECKING blocks to close a circle)."""

from __future__ import annotations

import ast
from pathlib import Path

import hlat.data

PACKAGE = Path(hlat.data.__file__).parent
# The order stated in docs/data.md: a module may import only modules of earlier layers.
LAYERS = [
    {"batch", "sources", "spm", "shard_check"},
    {"records", "documents"},
    {"order"},
    {"packing", "tokenizer"},
    {"shards", "catalog"},
    {"loader"},
]


def intra_imports(tree: ast.Module) -> list[tuple[str, ast.AST, bool]]:
    """(imported module, node, at module level) for every import of hlat.data or its modules."""
    top = set(map(id, tree.body))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("hlat.data"):
            names = [node.module] if node.module != "hlat.data" else [f"hlat.data.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.startswith("hlat.data")]
        else:
            continue
        found += [(n.removeprefix("hlat.data").lstrip(".") or "__init__", node, id(node) in top) for n in names]
    return found


def test_data_modules_import_one_way():
    layer = {m: k for k, mods in enumerate(LAYERS) for m in mods}
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert modules == set(layer), f"add {sorted(modules - set(layer))} to LAYERS (and docs/data.md)"
    problems = []
    for name in sorted(modules):
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        for target, node, at_top in intra_imports(tree):
            where = f"{name}.py:{node.lineno} imports {target}"
            if not at_top:
                problems.append(f"{where} inside a function or block")
            elif target not in layer or layer[target] >= layer[name]:
                problems.append(f"{where}, which is not in a lower layer")
    assert not problems, "\n".join(problems)
