"""Where a run starts, and the state a checkpoint holds of it.

A run starts from the newest checkpoint in its run directory that holds training state, from
weights only (what hlat import writes, or checkpoint.init_from) with a new optimizer, or from
scratch. `RunState` saves and restores that state (model, optimizer, each rank's data position
and RNG, the counters) whatever the layout that saved it.
"""

from __future__ import annotations

import copy
import dataclasses
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hlat.atomic_files import write_atomic
from hlat.checkpoint.manager import CheckpointManager, SaveStats
from hlat.checkpoint.restore import holds_training_state, init_weights, rank_state_for
from hlat.config.data import auto_virtual_shards
from hlat.config.data_paths import source_entries
from hlat.config.load import RUN_CONFIG, read_run_config
from hlat.config.run import RunConfig
from hlat.data.tokenizer import Tokenizer
from hlat.device.rng import load_rng_state, rng_state
from hlat.errors import ConfigError, ResumeError
from hlat.metrics.sinks import METRICS_FILE, PLOT_FILE
from hlat.parallel.mesh import Layout
from hlat.progress import Heartbeat
from hlat.toml_value import toml_value
from hlat.train.train_module import TrainModule

RESUME_MODES = ("auto", "require", "fresh")
# What a checkpoint pins: the model (its fields but these two: the RoPE tables are computed, not
# saved, and the weights are initialised already) and, when it holds training state, the settings
# of the data order. The others (optim.lr, train.steps, the layout...) may change on resume.
FREE_MODEL_FIELDS = ("max_seq_len", "init_std")
# What a new stage started from other weights (checkpoint.init_from) may change besides: the RoPE
# frequencies, which no weight's shape or meaning depends on (Llama 3's long-context stage).
STAGE_MODEL_FIELDS = FREE_MODEL_FIELDS + (
    "rope_theta", "rope_scaling", "rope_factor", "rope_low_freq_factor", "rope_high_freq_factor",
    "rope_original_max_seq_len",
)  # fmt: skip
DATA_PINS = (
    "data.source", "data.weights", "data.text_field", "data.split", "data.hf_config", "data.tokenizer",
    "data.seq_len", "data.max_doc_chars", "data.bos", "data.virtual_shards", "train.seed",
)  # fmt: skip
PATHS = ("data.source", "data.tokenizer")  # comma-separated paths: see _differs


def check_run_dir(cfg: RunConfig, resume: str) -> None:
    """Every rank, before anything is built: a run directory whose newest checkpoint this config
    cannot resume (another model shape, other data settings) is refused at once, naming each
    differing field with its saved and new values, rather than minutes later by a tensor shape."""
    checkpoints = CheckpointManager(cfg.run_dir / "checkpoints", None).checkpoints()
    if resume == "fresh" or not checkpoints or not (cfg.run_dir / RUN_CONFIG).is_file():
        return
    saved = read_run_config(cfg.run_dir)
    keys = [f"model.{name}" for name in vars(cfg.model) if name not in FREE_MODEL_FIELDS]
    keys += list(DATA_PINS) if holds_training_state(checkpoints[-1]) else []
    changed = [key for key in keys if _differs(key, _value(saved, key), _value(cfg, key))]
    if changed:
        values = "; ".join(
            f"{key} = {toml_value(_value(saved, key))}, now {toml_value(_value(cfg, key))}" for key in changed
        )
        raise ResumeError(
            f"{cfg.run_dir} holds a run this configuration cannot resume ({checkpoints[-1].name}): {values}; "
            "resume it with the saved values, or start over with --fresh (deletes its checkpoints) or "
            "another --train.run_dir"
        )


def check_init_from(cfg: RunConfig, resume: str) -> None:
    """Every rank, before anything is built: weights that checkpoint.init_from would load into
    another architecture are refused at once, naming each [model] field that differs from the
    source run's config.toml (a Hugging Face source is checked against its config.json as it loads).
    A run directory with a checkpoint to resume ignores init_from, and so does this check."""
    spec = cfg.checkpoint.init_from
    if not spec or spec.startswith("hf:"):
        return
    if resume != "fresh" and CheckpointManager(cfg.run_dir / "checkpoints", None).checkpoints():
        return
    path = Path(spec).expanduser()
    config = next((p / RUN_CONFIG for p in (path, path.parent.parent) if (p / RUN_CONFIG).is_file()), None)
    if config is None:  # a bare checkpoint: its tensors' names and shapes are checked as it loads
        return
    saved = read_run_config(config)
    keys = [f"model.{name}" for name in vars(cfg.model) if name not in STAGE_MODEL_FIELDS]
    changed = [key for key in keys if _value(saved, key) != _value(cfg, key)]
    if changed:
        raise ConfigError(
            [
                (
                    key,
                    f"{toml_value(_value(cfg, key))}, but the weights of checkpoint.init_from={spec} were trained "
                    f"with {toml_value(_value(saved, key))} ({config}); set it to that (a new stage may change "
                    "only the RoPE fields, model.max_seq_len and model.init_std)",
                )
                for key in changed
            ]
        )


def _value(cfg: RunConfig, key: str) -> Any:
    section, _, name = key.partition(".")
    return getattr(getattr(cfg, section), name)


def resolve_shard_count(
    cfg: RunConfig, resume: str, ranks: int, readers: str = "data-parallel ranks"
) -> tuple[RunConfig, str | None]:
    """data.virtual_shards = 0 (auto) made a count: the one the run chose at its first start (its
    config.toml, where its newest checkpoint can be resumed), else auto's for `ranks` loaders, which
    the start line calls `readers` (data-parallel ranks; an elastic or deterministic run's data
    shares). The count then goes into config.toml with the rest."""
    if cfg.data.virtual_shards:
        return cfg, None
    checkpoints = CheckpointManager(cfg.run_dir / "checkpoints", None).checkpoints()
    resumable = resume != "fresh" and checkpoints and holds_training_state(checkpoints[-1])
    saved = (
        read_run_config(cfg.run_dir).data.virtual_shards if resumable and (cfg.run_dir / RUN_CONFIG).is_file() else 0
    )
    count = saved or auto_virtual_shards(ranks)
    cfg = copy.deepcopy(cfg)
    cfg.data = dataclasses.replace(cfg.data, virtual_shards=count)
    why = "kept from the run's first start" if saved else f"auto for {ranks} {readers}"
    return cfg, f"data: {count} virtual shards ({why})"


def _differs(key: str, saved: Any, now: Any) -> bool:
    if key == "data.virtual_shards" and now == 0:
        return False  # auto keeps the count the run chose at its first start (build.shard_count)
    if key not in PATHS:
        return saved != now
    old, new = source_entries(saved), source_entries(now)
    return len(old) != len(new) or not all(_same_path(a, b) for a, b in zip(old, new))


def _same_path(saved: str, now: str) -> bool:
    """Also when written another way; and a saved path that no longer exists is taken as data
    that moved: the checkpoint's own data fingerprints decide then, when the loader resumes."""
    if saved == now:
        return True
    if not saved or not now or saved.startswith("hf:") or now.startswith("hf:"):
        return False
    path = Path(saved).expanduser()
    return not path.exists() or path.resolve() == Path(now).expanduser().resolve()


def prepare_run_dir(cfg: RunConfig, resume: str) -> None:
    """Global rank 0, once everything is built (a start that fails must leave the directory as it
    was): --fresh deletes what an earlier run wrote there."""
    if resume == "fresh":
        for name in ("checkpoints", "tensorboard", METRICS_FILE, PLOT_FILE):
            path = cfg.run_dir / name  # a symbolic link is removed, never followed
            is_tree = path.is_dir() and not path.is_symlink()
            shutil.rmtree(path, ignore_errors=True) if is_tree else path.unlink(missing_ok=True)


def record_run(cfg: RunConfig, tokenizer: Tokenizer) -> None:
    """Global rank 0, once the run has started or resumed: the resolved config and the tokenizer,
    which evaluation and export read from the run directory. Not before: a refused resume (other
    data settings) must leave the files of the run it refused as they were, and a failed start
    creates no directory."""
    cfg.run_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(cfg.run_dir / tokenizer.FILE_NAME)
    write_atomic(cfg.run_dir / RUN_CONFIG, cfg.to_toml())


@dataclass
class Progress:
    """The counters a checkpoint records."""

    step: int = 0
    tokens: int = 0
    skipped_steps: int = 0  # steps the optimizers skipped (non-finite or over-norm gradients)
    train_s: float = 0.0  # wall time of the training loop, for the cost so far (train.price_per_node_hour)


class RunState:
    """The state of a run that its checkpoints hold; every method is collective."""

    def __init__(
        self,
        cfg: RunConfig,
        layout: Layout,
        device: torch.device,
        module: TrainModule,
        loader: Any,
        guard: Callable[[], None] | None = None,
    ):
        """`loader`: the stateful data position; `guard`: rank 0's check before each save writes
        (the run directory's lock, hlat.train.run_lock)."""
        self.cfg, self.layout, self.device = cfg, layout, device
        self.module, self.loader = module, loader
        self.checkpoints = CheckpointManager(
            cfg.run_dir / "checkpoints", cfg.checkpoint.keep_last, cfg.checkpoint.verify, guard
        )
        self.archive = CheckpointManager(cfg.run_dir / "archive", None, cfg.checkpoint.verify, guard)  # never pruned

    def start(self, resume: str, out: Callable[[str], None]) -> Progress:
        """Restore the newest checkpoint that holds training state, or load the weights the run
        starts from (a weights-only checkpoint in the run directory, else checkpoint.init_from)."""
        path = None if resume == "fresh" else self.checkpoints.latest()
        if resume != "fresh":
            self._keep_verified(path)
        if path is not None and holds_training_state(path):
            return self.restore(path, out)
        if resume == "require":
            raise FileNotFoundError(
                f"--resume: no valid checkpoint to resume in {self.checkpoints.directory}"
                f"{f' ({path.name} holds weights only)' if path else ''}; drop --resume to start a new run"
            )
        if path is not None:  # e.g. what hlat import wrote: its weights start this run
            with Heartbeat(f"checkpoint: loading the weights of {path}", out):
                source = init_weights(str(path), self.module.model.parts)
            out(f"initialised from {source} (weights only: new optimizer, step 0)")
        elif self.cfg.checkpoint.init_from:
            with Heartbeat(f"checkpoint: loading the weights of {self.cfg.checkpoint.init_from}", out):
                source = init_weights(self.cfg.checkpoint.init_from, self.module.model.parts)
            out(f"initialised from {source} (new optimizer)")
        return Progress()

    def _keep_verified(self, path: Path | None) -> None:
        """A run whose checkpoints all fail verification stops (a silent start from step 0 would
        overwrite its metrics, and retention would then delete each new checkpoint in favour of the
        failed ones); newer ones that failed beside an older good one are set aside."""
        rejected = self.checkpoints.rejected
        if rejected and path is None:
            lines = "".join(f"\n  {failed.name}: {why}" for failed, why in rejected)
            raise ResumeError(
                f"{self.checkpoints.directory}: no checkpoint passes verification, so this run cannot resume:"
                f"{lines}\nrepair or restore the files named and run the same command again, or start over with "
                "--fresh (deletes every checkpoint of this run)"
            )
        if rejected and self.layout.is_main:
            self.checkpoints.set_aside()

    def latest_resumable(self) -> Path | None:
        """The newest checkpoint a rollback can restore (weights-only ones cannot), once the
        save in flight, if any, has committed."""
        self.checkpoints.wait()
        path = self.checkpoints.latest()
        return path if path is not None and holds_training_state(path) else None

    def layout_record(self) -> dict[str, Any]:
        lay = self.layout
        record = {"pp": lay.pp, "dp": lay.dp, "tp": lay.tp, "dp_sharding": self.cfg.parallel.dp_sharding}
        # HSDP's shard degree and cp only where they are used: older records stay equal
        hsdp = {"dp_shard": lay.dp_shard} if lay.dp_replicate > 1 else {}
        # the deterministic mode's loader state is its shares', merged: another mode's must be dealt again
        mode = {"deterministic": True} if self.cfg.train.deterministic else {}
        return record | hsdp | ({"cp": lay.cp} if lay.cp > 1 else {}) | mode

    def save(self, progress: Progress) -> SaveStats:
        """Under checkpoint.async_save it returns once the state is staged."""
        shared = {"progress": vars(progress).copy(), "layout": self.layout_record()}
        rank_state = {"loader": self.loader.state_dict(), "rng": rng_state(self.device)}
        return self.checkpoints.save(
            progress.step,
            self.module.state_dict(),
            rank_state,
            shared if self.layout.is_main else None,
            background=self.cfg.checkpoint.async_save,
        )

    def archive_weights(self, progress: Progress) -> SaveStats:
        """A weights-only checkpoint under archive/, never pruned."""
        shared = {"progress": {"step": progress.step, "tokens": progress.tokens}}
        return self.archive.save(
            progress.step, {"model": self.module.model_state_dict()}, None, shared if self.layout.is_main else None
        )

    def restore(self, path: Path, out: Callable[[str], None]) -> Progress:
        """Load everything from checkpoint `path`, whatever layout saved it."""
        with Heartbeat(f"checkpoint: loading {path}", out):
            shared = self.checkpoints.load_shared(path)
            state = self.module.state_dict()
            self.checkpoints.load_sharded(path, state)
            self.module.load_state_dict(state)
        same = shared.get("layout") == self.layout_record()
        lay = self.layout
        merged = self.cfg.train.deterministic
        loader, rng = rank_state_for(self.checkpoints, path, lay.rank, lay.dp_rank, lay.dp, same, merged)
        try:
            self.loader.load_state_dict(loader)
        except ResumeError as err:
            raise ResumeError(f"{path}: {err}") from err
        if rng is not None:
            load_rng_state(rng, self.device)
        saved = shared["progress"]
        progress = Progress(saved["step"], saved["tokens"], saved.get("skipped_steps", 0), saved.get("train_s", 0.0))
        note = "" if same else f", resharded from {shared.get('layout')} to {self.layout_record()}"
        out(f"resuming from {path} (step {progress.step:,}, {progress.tokens:,} tokens{note})")
        return progress
