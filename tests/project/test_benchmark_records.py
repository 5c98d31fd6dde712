"""Every recorded benchmark names the script command that produces its figures, so that each
figure can be re-measured (benchmarks/X.md is the record of benchmarks/X.py)."""

import re
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize("record", sorted(BENCHMARKS.glob("*.md")), ids=lambda p: p.name)
def test_record_names_its_command(record: Path) -> None:
    script = record.with_suffix(".py")
    assert script.exists(), f"{record.name}: no {script.name} beside it produces its figures"
    command = re.compile(rf"`(python|torchrun) [^`]*benchmarks/{re.escape(script.name)}[^`]*`")
    assert command.search(record.read_text()), (
        f"{record.name}: print the command that produced its figures (`python benchmarks/{script.name} ...`)"
    )
