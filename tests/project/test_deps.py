"""A missing test dependency skips locally and fails under CI (tests/deps.py)."""

import pytest

from deps import require


def test_missing_dependency_skips_locally_and_fails_under_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no_such_package is not installed"):
        require("no_such_package")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true: no_such_package is not installed"):
        require("no_such_package")
    assert require("json").dumps([1]) == "[1]"  # present: the module itself
