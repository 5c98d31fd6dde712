"""A crafted checkpoint cannot run code, with checkpoint.verify on or off.

Each attack's payload, if it ran, would create a marker file; every test asserts the marker does
not exist and that a CheckpointError names the file. The manifests of the crafted checkpoints are
rewritten with the true sizes and SHA-256 digests, so only the safety checks can stop them.
"""

import hashlib
import json
import os
import pickle
import re
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from hlat import __version__
from hlat.checkpoint.errors import CheckpointError
from hlat.checkpoint.loading import load_model
from hlat.checkpoint.manager import FORMAT_VERSION, CheckpointManager
from hlat.checkpoint.safe_metadata import read_metadata
from hlat.config.load import load_config
from hlat.train.trainer import Trainer
from runs import tiny_args


def quiet(_: str) -> None:
    pass


@pytest.fixture(scope="module")
def trained(small_corpus, tmp_path_factory) -> Path:
    """A tiny run of 2 steps with a checkpoint after each (model, AdamW state with param_groups, data
    position): the tests craft the newest, step 2; step 1 is what a resume may fall back to."""
    run = tmp_path_factory.mktemp("safety") / "run"
    Trainer(
        load_config("tiny", None, tiny_args(small_corpus, run, "--train.steps", "2", "--checkpoint.every", "1")),
        out=quiet,
    ).fit()
    return run


def run_copy(trained: Path, tmp_path: Path) -> tuple[Path, Path]:
    """(a copy of the trained run, its checkpoint)."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    return run, run / "checkpoints" / "step_00000002"


def rewrite_manifest(checkpoint: Path) -> None:
    """The manifest as an attacker would leave it: true size and SHA-256 of every file on disk."""
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    manifest["files"] = {
        str(f.relative_to(checkpoint)): {
            "bytes": f.stat().st_size,
            "sha256": hashlib.sha256(f.read_bytes()).hexdigest(),
        }
        for f in sorted(checkpoint.rglob("*"))
        if f.is_file() and f.name != "manifest.json"
    }
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))


def _unicode(text: str) -> bytes:
    data = text.encode()
    return b"\x8c" + bytes([len(data)]) + data  # SHORT_BINUNICODE


def dotted_gadget(marker: Path) -> bytes:
    """Pickle protocol 4 calling os.system through a DCP module that imports os: STACK_GLOBAL
    resolves the dotted qualified name "os.system" attribute by attribute. A module-prefix
    allow-list ("torch.distributed.checkpoint.*") lets it through."""
    return (
        b"\x80\x04"
        + _unicode("torch.distributed.checkpoint.filesystem")
        + _unicode("os.system")
        + b"\x93"
        + _unicode(f"touch {marker}")
        + b"\x85R."
    )  # TUPLE1, REDUCE, STOP


class _System:
    """Pickles as os.system(command): what a crafted non-tensor entry would run."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


@pytest.mark.parametrize("verify", [True, False], ids=["verify", "no-verify"])
def test_dotted_name_gadget_in_dcp_metadata_runs_nothing(trained, tmp_path, capsys, verify):
    run, checkpoint = run_copy(trained, tmp_path)
    marker = tmp_path / "metadata-gadget-ran"
    (checkpoint / "dcp" / ".metadata").write_bytes(dotted_gadget(marker))
    rewrite_manifest(checkpoint)
    mgr = CheckpointManager(run / "checkpoints", keep_last=None, verify=verify)
    refused = "refusing to load torch.distributed.checkpoint.filesystem.os.system"
    where = re.escape(f"{checkpoint / 'dcp' / '.metadata'}: {refused}")
    with pytest.raises(CheckpointError, match=where):
        mgr.check(checkpoint)
    assert mgr.latest() == checkpoint.parent / "step_00000001"  # skipped like a corrupt checkpoint
    assert refused in capsys.readouterr().out
    with pytest.raises(CheckpointError, match=where):
        mgr.load_sharded(
            checkpoint, {"model": {"norm.weight": torch.zeros(64)}}
        )  # DCP's own read goes through the allow-list too
    load_model(run)  # hlat eval / hlat export: skip it for the previous one, naming it
    assert re.search(refused, capsys.readouterr().err)
    assert not marker.exists()


def craft_param_group_entry(checkpoint: Path, marker: Path) -> str:
    """Replace one optimizer param_groups value (a non-tensor DCP entry) with an os.system call
    and rewrite the DCP files and the manifest consistently; return the entry's name."""
    directory = checkpoint / "dcp"
    whole = checkpoint.parent / "whole.pt"
    dcp_to_torch_save(directory, whole)
    state = torch.load(whole, weights_only=False)  # our own, untampered checkpoint
    name = next(k for k in state["optim"] if k.startswith("param_groups.") and k.endswith(".lr"))  # flattened
    state["optim"][name] = _System(f"touch {marker}")
    shutil.rmtree(directory)
    dcp.save(state, checkpoint_id=str(directory), no_dist=True)
    rewrite_manifest(checkpoint)
    return f"optim.{name}"


@pytest.mark.parametrize("verify", ["true", "false"], ids=["verify", "no-verify"])
def test_crafted_optimizer_entry_in_distcp_runs_nothing_at_resume(trained, small_corpus, tmp_path, verify):
    run, checkpoint = run_copy(trained, tmp_path)
    marker = tmp_path / "distcp-entry-ran"
    entry = craft_param_group_entry(checkpoint, marker)
    cfg = load_config("tiny", None, tiny_args(small_corpus, run, "--train.steps", "3", "--checkpoint.verify", verify))
    where = re.escape(f"{checkpoint / 'dcp' / '__0_0.distcp'}: the non-tensor entry '{entry}' is refused")
    with pytest.raises(CheckpointError, match=f"{where}.*posix.system"):
        Trainer(cfg, resume="require", out=quiet)
    assert not marker.exists()


def test_tampered_manifests_are_refused(trained, tmp_path):
    _, checkpoint = run_copy(trained, tmp_path)
    original = (checkpoint / "manifest.json").read_text()

    def refused(edit, match: str, verify: bool = True) -> None:
        manifest = json.loads(original)
        edit(manifest)
        (checkpoint / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(CheckpointError, match=match):
            CheckpointManager(checkpoint.parent, keep_last=None, verify=verify).check(checkpoint)

    shard = "dcp/__0_0.distcp"
    refused(lambda m: m["files"][shard].update(sha256="0" * 64), f"{shard} fails its SHA-256 check")
    refused(lambda m: m["files"][shard].update(bytes=1), f"{shard} has \\d+ bytes, manifest says 1", verify=False)
    refused(
        lambda m: m["files"].update({"rank_00001.pt": m["files"]["rank_00000.pt"]}),
        "missing rank_00001.pt",
        verify=False,
    )
    refused(
        lambda m: m.update(format=1),
        f"checkpoint format 1, and hlat {__version__} reads format {FORMAT_VERSION}: hlat {__version__} reads it",
    )
    refused(lambda m: m["files"].update({"../outside": m["files"]["shared.pt"]}), "manifest.json is malformed")
    refused(lambda m: m["files"].pop("dcp/.metadata"), "does not list dcp/.metadata")
    (checkpoint / "manifest.json").write_text(original)
    CheckpointManager(checkpoint.parent, keep_last=None).check(checkpoint)  # the untouched manifest passes


@pytest.mark.parametrize("name", ["../../outside.distcp", "/etc/hostname", ".hidden"])
def test_metadata_naming_a_file_outside_dcp_is_skipped(trained, small_corpus, tmp_path, capsys, name):
    """Metadata made only of allowed classes whose data files point outside dcp/ (a load would read
    any file the process can): every reader refuses it, and a resume falls back to step 1."""
    run, checkpoint = run_copy(trained, tmp_path)
    file = checkpoint / "dcp" / ".metadata"
    metadata = read_metadata(file)
    for info in metadata.storage_data.values():
        info.relative_path = name
    file.write_bytes(pickle.dumps(metadata))
    rewrite_manifest(checkpoint)
    refused = re.escape(f"names the data file {name!r}, which is not a plain file name in {checkpoint / 'dcp'}")
    mgr = CheckpointManager(run / "checkpoints", keep_last=None, verify=False)
    with pytest.raises(CheckpointError, match=refused):
        mgr.check(checkpoint)
    with pytest.raises(CheckpointError, match=refused):
        mgr.load_sharded(checkpoint, {"model": {"norm.weight": torch.zeros(64)}})
    load_model(run)  # hlat eval / hlat export: skip it for the previous one, naming it
    assert re.search(refused, capsys.readouterr().err)
    lines: list[str] = []
    Trainer(
        load_config("tiny", None, tiny_args(small_corpus, run, "--train.steps", "3")),
        resume="require",
        out=lines.append,
    )
    assert any(f"resuming from {checkpoint.parent / 'step_00000001'}" in line for line in lines)
    assert f"skipping checkpoint {checkpoint}" in capsys.readouterr().out


@pytest.mark.parametrize("verify", ["true", "false"], ids=["verify", "no-verify"])
@pytest.mark.parametrize("file", ["rank_00000.pt", "shared.pt"])
def test_crafted_pt_files_run_nothing(trained, small_corpus, tmp_path, file, verify, capsys):
    """A rank's state or the shared progress replaced by a pickle that calls os.system: refused
    at resume and by hlat eval's loader, naming the file, and the marker never appears. It is
    refused rather than skipped: no accident leaves a file of the right digest that is not plain
    data, so it is reported as what it is."""
    run, checkpoint = run_copy(trained, tmp_path)
    marker = tmp_path / "pt-payload-ran"
    torch.save({"progress": _System(f"touch {marker}")}, checkpoint / file)
    rewrite_manifest(checkpoint)
    cfg = load_config("tiny", None, tiny_args(small_corpus, run, "--train.steps", "3", "--checkpoint.verify", verify))
    where = re.escape(f"cannot load {checkpoint / file}")
    with pytest.raises(CheckpointError, match=f"{where}.*posix.system"):
        Trainer(cfg, resume="require", out=quiet)
    if file == "shared.pt":
        load_model(run)  # skipped for the previous checkpoint, named on stderr
        assert str(checkpoint) in capsys.readouterr().err
    assert not marker.exists()
