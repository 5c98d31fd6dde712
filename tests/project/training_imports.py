"""Run a tiny `hlat train` and print, as JSON, the top-level modules hlat's own code imports
outside the standard library and torch (torch.utils.tensorboard counts as tensorboard, which it
imports), and whether torch.distributed.optim was loaded (tests/project/test_offline_install.py).
Usage: python tests/project/training_imports.py WORK_DIR"""

import builtins
import json
import shutil
import sys
import sysconfig
from pathlib import Path

imported: set[str] = set()
_import = builtins.__import__


def _recording(name, globals=None, locals=None, fromlist=(), level=0):  # type: ignore[no-untyped-def]
    importer = str((globals or {}).get("__name__", ""))
    if level == 0 and importer.split(".")[0] == "hlat":
        top = name.split(".")[0]
        if name.startswith("torch.utils.tensorboard"):
            imported.add("tensorboard")
        elif top not in sys.stdlib_module_names and top not in ("hlat", "torch", "__future__"):
            imported.add(top)
    return _import(name, globals, locals, fromlist, level)


builtins.__import__ = _recording
from hlat.cli import main  # noqa: E402

work = Path(sys.argv[1])
corpus = work / "corpus"
corpus.mkdir(parents=True)
for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:20]:
    shutil.copy(path, corpus / path.name)
code = main(
    ["train", "--fresh", "--preset", "tiny", "--data.source", str(corpus), "--data.cache_dir", str(work / "cache"),
     "--train.run_dir", str(work / "run"), "--train.steps", "2", "--checkpoint.every", "1", "--parallel.compile", "false",
     "--model.vocab_size", "512", "--model.n_layers", "1", "--model.d_model", "64", "--model.ffn_dim", "160",
     "--data.seq_len", "64"]
)  # fmt: skip
# torch.distributed.optim compiles TorchScript on import: only a ZeRO-1 run should pay for it
print(json.dumps({"exit_code": code, "imported": sorted(imported), "zero1": "torch.distributed.optim" in sys.modules}))
