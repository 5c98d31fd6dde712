"""The `compiling` fixture (tests/compiling.py) turns compilation on for each test that asks for
it, whatever ran before, and leaves the suite's eager setting as it was. Each order runs as a pytest
session of its own (one process, as the suite is), with this suite's conftest setting."""

import os
from pathlib import Path

import pytest
import torch
import torch._dynamo.config


def compiled_graphs() -> int:
    """How many graphs compiling a small function makes (0: compilation is off)."""
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    torch.compile(lambda x: x * 2 + 1, backend="eager")(torch.ones(3))
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


INNER = """
import os
os.environ["TORCH_COMPILE_DISABLE"] = "1"  # as tests/conftest.py sets it
import torch
from compiling import compiling  # noqa: F401
from test_compiling import compiled_graphs

def test_first(compiling):
    assert compiled_graphs() == 1

def test_second(compiling):
    assert compiled_graphs() == 1

def test_eager_between():
    assert torch._dynamo.config.disable is True
    assert compiled_graphs() == 0
"""


@pytest.mark.parametrize("order", [("first", "eager_between", "second"), ("second", "first", "eager_between")])
def test_compile_tests_in_a_row_both_compile(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, order: tuple[str, ...]
) -> None:
    here = Path(__file__).parent  # test_compiling, and compiling in tests/
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(map(str, (here, here.parent))))
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess(
        "-v", "-p", "no:cacheprovider", *(f"test_inner.py::test_{name}" for name in order)
    )
    result.assert_outcomes(passed=3)
    ran = [line.split("::test_")[1].split()[0] for line in result.outlines if line.startswith("test_inner.py::")]
    assert ran == list(order)
