"""The tree is formatted and linted by the locked ruff (pyproject.toml's [tool.ruff]), so CI's one
test command checks it too. Fix what this reports with: ruff format . && ruff check --fix ."""

import subprocess
import sys
from pathlib import Path

import pytest

from deps import require

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", [["format", "--check"], ["check"]], ids=["format", "check"])
def test_ruff(command: list[str]) -> None:
    require("ruff")
    done = subprocess.run([sys.executable, "-m", "ruff", *command, "."], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"ruff {' '.join(command)} .:\n{done.stdout[-4000:]}{done.stderr[-2000:]}"
