"""Resume a run directory in this process's layout and save again at once (resharding tests)."""

import os
import sys

from hlat.config import load_config
from hlat.parallel.mesh import teardown, world_from_env
from hlat.train.trainer import Trainer


def main() -> None:
    trainer = Trainer(load_config("tiny", None, sys.argv[1:]), resume="require")
    trainer.save()
    if world_from_env()[0] > 1:
        teardown()
        sys.stdout.flush()
        os._exit(0)  # see hlat.commands.train: gloo threads can race interpreter teardown


if __name__ == "__main__":
    main()
