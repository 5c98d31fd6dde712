import shutil
import sysconfig
from pathlib import Path

import pytest


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Tokenizer caches go to a temporary directory, never the user's ~/.cache."""
    mp = pytest.MonkeyPatch()
    mp.setenv("HLAT_CACHE", str(tmp_path_factory.mktemp("hlat-cache")))
    yield
    mp.undo()


@pytest.fixture(scope="session")
def small_corpus(tmp_path_factory) -> Path:
    """A directory of 60 real documents (standard-library modules) for fast end-to-end runs."""
    root = tmp_path_factory.mktemp("corpus")
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if 2_000 < p.stat().st_size < 40_000)[:60]
    for i, path in enumerate(files):
        shutil.copy(path, root / f"{i:03d}_{path.stem}.py")
    return root
