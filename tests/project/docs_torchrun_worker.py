"""A documented `torchrun ... -m hlat ARGS` command as a scenario of the shared launch (tests/runs.py):
each rank runs hlat.cli.main(ARGS) in the scenario's directory, the way `python -m hlat` does
under torchrun (same environment: WORLD_SIZE, RANK, the process group hlat's setup joins).
tests/project/test_docs_commands.py reads the outcome; torchrun's own argument handling is PyTorch's.
"""

import contextlib
import io
import os

from hlat.cli import main


def run(ctx, argv: list[str]) -> None:
    os.chdir(ctx.out)
    output = io.StringIO()
    with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
        code = main(argv)
    (ctx.out / f"output.rank{ctx.rank}.txt").write_text(output.getvalue())
    assert code == 0, f"hlat {' '.join(argv)} exited {code} on rank {ctx.rank}:\n{output.getvalue()[-4000:]}"
