"""Downstream tasks during training: a few documents of each task, scored on rank 0 with an
unsharded copy of the current weights, every `eval.tasks_every` steps.

Gathering the weights is a collective (every rank calls `run`); only rank 0 then scores, and the
other ranks go on to the next collective of training and wait there. Task documents are read
once, when the trainer starts (a missing file fails then, not hours later), so each evaluation
only scores. Nothing here draws from training's random generators: prompts and any sampling use
the harness's own seeded generators, so a run's losses are the same with and without it.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from hlat.config.eval import EvalConfig
from hlat.config.model import ModelConfig
from hlat.data.tokenizer import Tokenizer
from hlat.eval.harness import EvalOptions, evaluate_task
from hlat.eval.lm import LanguageModel
from hlat.eval.tasks import TASKS, DataMissing, Doc, Task, load_split
from hlat.model import Llama, build_model
from hlat.model.llama import rope_tables
from hlat.parallel.mesh import Layout


def gather_full_weights(parts: list[nn.Module], layout: Layout) -> dict[str, torch.Tensor] | None:
    """The whole model's weights as plain CPU tensors on rank 0, None on the other ranks.

    Collective: every rank must call it. Without pipeline stages, torch.distributed.checkpoint
    gathers each sharded (FSDP/TP) tensor straight to rank 0's host memory. A pipeline stage's
    tensors are gathered within the stage first, then each stage's first rank sends them to rank 0.
    On one unsharded process the tensors are the training weights themselves (no copy): treat
    them as read-only.
    """
    if layout.pp == 1:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        state = {k: v for part in parts for k, v in get_model_state_dict(part, options=options).items()}
        return state if layout.is_main else None
    # cpu_offload keeps tensors on global rank 0 only, which holds none of the later stages.
    options = StateDictOptions(full_state_dict=True)
    stage = {k: v for part in parts for k, v in get_model_state_dict(part, options=options).items()}
    if layout.coordinate("dp") or layout.coordinate("tp"):
        return None  # a copy of the stage that rank 0's pipeline group already sends
    stage = {k: v.cpu() for k, v in stage.items()}
    stages: list[dict[str, torch.Tensor]] | None = [{} for _ in range(layout.pp)] if layout.is_main else None
    dist.gather_object(stage, stages, dst=0, group=layout.group("pp"))
    return {k: v for s in stages for k, v in s.items()} if stages is not None else None


def unsharded_model(cfg: ModelConfig, weights: dict[str, torch.Tensor]) -> Llama:
    """A plain model of `cfg` around `weights` (assigned, not copied: a 7B model is not initialised only
    to be overwritten); strict, so a missing or unexpected tensor fails loudly."""
    with torch.device("meta"):
        model = build_model(cfg)
    model.load_state_dict(weights, assign=True)
    model.rope_cos, model.rope_sin = rope_tables(cfg)
    return model


class InTrainingTasks:
    """Built on every rank (the gather needs them all); holds task documents on rank 0 only."""

    def __init__(
        self,
        cfg: EvalConfig,
        model_cfg: ModelConfig,
        tokenizer: Tokenizer,
        layout: Layout,
        device: torch.device,
        precision_mode: str,
        bos: bool = False,
    ):
        self.cfg, self.model_cfg, self.tokenizer, self.bos = cfg, model_cfg, tokenizer, bos  # bos: data.bos
        self.layout, self.device, self.precision_mode = layout, device, precision_mode
        shots = None if cfg.tasks_shots < 0 else cfg.tasks_shots
        # data_dir stays None: the tasks below carry their documents in memory.
        self.options = EvalOptions(limit=cfg.tasks_limit, num_fewshot=shots)
        data_dir = Path(cfg.data_dir).expanduser() if cfg.data_dir else None
        self.tasks = [_in_memory(TASKS[name], data_dir, shots) for name in cfg.task_names()] if layout.is_main else []

    def due(self, step: int, last_step: int) -> bool:
        return self.cfg.tasks_due(step, last_step)

    def run(self, parts: list[nn.Module]) -> tuple[dict[str, float], float]:
        """({"<task>/<metric>": value} on rank 0, {} elsewhere; seconds spent). Collective."""
        t0 = time.perf_counter()
        weights = gather_full_weights(parts, self.layout)
        if weights is None:
            return {}, time.perf_counter() - t0
        lm = LanguageModel(
            unsharded_model(self.model_cfg, weights),
            self.tokenizer,
            self.device,
            precision=self.precision_mode,
            progress=False,
            bos=self.bos,
        )
        scores = {}
        for task in self.tasks:
            result = evaluate_task(lm, task, self.options)
            scores.update({f"{task.name}/{metric}": v["value"] for metric, v in result.metrics.items()})
        return scores, time.perf_counter() - t0


def _in_memory(task: Task, data_dir: Path | None, shots: int | None) -> Task:
    """`task` with its splits read now and served from memory through `Dataset.bundled`, which the
    harness consults when it has no data directory. A missing few-shot split is remembered as
    missing, so the harness falls back to the evaluation split as it does in `hlat eval`."""
    data = task.data
    try:
        splits: dict[str, list[Doc] | DataMissing] = {data.split: load_split(data, data.split, data_dir)}
    except DataMissing as err:
        raise DataMissing(
            f"eval.tasks: {err}; set --eval.data_dir to the local task files, or drop {task.name} from eval.tasks"
        ) from err
    wants_shots = (task.num_fewshot if shots is None else shots) > 0
    if wants_shots and data.fewshot_split:
        try:
            splits[data.fewshot_split] = load_split(data, data.fewshot_split, data_dir)
        except DataMissing as err:
            splits[data.fewshot_split] = err

    def read(split: str) -> list[Doc]:
        docs = splits.get(split)
        if docs is None:
            raise DataMissing(f"{task.name}: split {split!r} was not loaded")
        if isinstance(docs, DataMissing):
            raise DataMissing(str(docs))
        return docs

    return dataclasses.replace(task, data=dataclasses.replace(data, bundled=read))
