"""`hlat config --explain` and docs/configuration.md, both read from the sections' annotations and
field docstrings (hlat.config.fields)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hlat.cli import main
from hlat.config.reference import REFERENCE_COMMAND, reference_page

ROOT = Path(__file__).resolve().parents[2]


def test_explain_a_field(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--explain", "parallel.dp_sharding", "--preset", "hlat-7b"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("parallel.dp_sharding\n  How data parallelism shards.")
    assert '  type:    str\n  choices: "ddp", "zero1", "zero2", "fsdp"\n  default: "ddp"\n' in out
    assert out.endswith('  value:   "zero2" (preset hlat-7b)\n')


def test_explain_a_field_of_a_preset_and_overrides(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--explain", "optim.lr", "--preset", "small", "--optim.lr", "2e-3"]) == 0
    out = capsys.readouterr().out
    assert "  type:    float\n  default: 0.0003\n  value:   0.002 (preset small, overrides)\n" in out
    assert main(["config", "--explain", "parallel.compile"]) == 0
    assert '"auto", "true", "false" (TOML and command-line booleans too)' in capsys.readouterr().out


def test_explain_a_section_lists_its_fields(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--explain", "precision"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("[precision] ")
    assert [line.split()[0] for line in lines[1:]] == [
        "mode",
        "compile_optimizer",
        "float8",
        "float8_min_d_model",
        "bf16_weight_cache",
        "reduce_dtype",
        "fp32_grad_accum",
    ]
    assert lines[1].split(None, 1)[1] == "The precision mode."


@pytest.mark.parametrize(("name", "close"), [("optim.lrr", "optim.lr"), ("precison", "precision")])
def test_an_unknown_field_is_one_line_with_the_closest(
    name: str, close: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "--explain", name]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hlat config: unknown field '{name}'; did you mean '{close}'?") and err.count("\n") == 1


def test_the_reference_page_is_generated_from_the_fields() -> None:
    page = ROOT / "docs" / "configuration.md"
    assert page.read_text() == reference_page(), f"docs/configuration.md is stale; regenerate it: {REFERENCE_COMMAND}"
    assert '| `parallel.dp_sharding` | str: "ddp", "zero1", "zero2", "fsdp" | `"ddp"` |' in page.read_text()
