"""The `compiling` fixture: torch.compile on again for one test (the suite runs eager, tests/conftest.py).

It goes through torch's own config API. A torch config module keeps its values outside its
instance `__dict__`, so monkeypatching the attribute is undone wrongly by some pytest releases
(pytest 9.2 deletes the entry on undo, and every later read of the setting fails).
"""

from collections.abc import Iterator

import pytest
import torch._dynamo.config


@pytest.fixture
def compiling(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """torch.compile on for one test, in its process and the subprocesses it starts."""
    monkeypatch.delenv("TORCH_COMPILE_DISABLE")
    with torch._dynamo.config.patch(disable=False):
        yield
