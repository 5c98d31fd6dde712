"""`python -m hlat`: the `hlat` program, as the console script runs it."""

import os
import sys

# `python -m` puts the working directory first on sys.path, the console script does not: without
# this, a config's train.callbacks could import a module that merely lies in the directory hlat was
# started from. A directory the user put on PYTHONPATH is a later entry of its own and stays; under
# -P (safe_path) the first entry is not the working directory.
if not sys.flags.safe_path and sys.path and os.path.abspath(sys.path[0] or os.curdir) == os.getcwd():
    del sys.path[0]

from hlat.cli import entry  # noqa: E402  (imported once the working directory is off sys.path)

entry()
