"""The sections' fields as one source: each choice's allowed values are its Literal annotation
(validation reads them from there, with the messages it always gave), and each field has a
description (the docstring under it) that `hlat config --explain` and docs/configuration.md show."""

from __future__ import annotations

import dataclasses

import pytest

from hlat.config.fields import choices, field_docs
from hlat.config.run import RunConfig

SECTIONS = RunConfig().sections()


@pytest.mark.parametrize("name", list(SECTIONS))
def test_every_field_and_section_is_described(name: str) -> None:
    cls = type(SECTIONS[name])
    docs = field_docs(cls)
    missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
    assert not missing, f"[{name}] fields without a docstring under them: {', '.join(missing)}"
    assert cls.__doc__ and cls.__doc__.startswith(f"`[{name}]`"), f"{cls.__name__} needs a one-line docstring"


CHOICES = {  # every fixed-choice field and its values, in the order the messages list them
    "model.rope_scaling": ("none", "linear", "llama3"),
    "model.family": ("llama", "qwen3"),
    "data.bad_documents": ("error", "skip"),
    "data.verify_shards": ("cached", "full"),
    "optim.name": ("adamw", "muon"),
    "optim.weight_decay_scope": ("matrices", "all"),
    "optim.muon_ns_dtype": ("bfloat16", "float32"),
    "optim.muon_adjust_lr": ("match_rms_adamw", "original"),
    "schedule.name": ("hlat-cosine", "cosine", "wsd", "constant"),
    "precision.mode": ("fp32", "mixed", "bf16-sr", "bf16"),
    "precision.reduce_dtype": ("fp32", "bf16"),
    "recovery.nonfinite": ("skip", "rollback", "error"),
    "recovery.spike_action": ("skip", "rollback", "error"),
    "recovery.wrong_computation": ("stop", "exclude"),
    "parallel.dp_sharding": ("ddp", "zero1", "zero2", "fsdp"),
    "parallel.pp_schedule": ("1f1b", "interleaved-1f1b", "gpipe"),
    "parallel.activation_checkpoint": ("none", "selective", "op", "full"),
    "parallel.compile": ("auto", "true", "false"),
    "parallel.device_layout": ("auto", "config"),
    "parallel.compile_mode": ("default", "max-autotune-no-cudagraphs"),
    "parallel.recompute_attention": ("auto", "true", "false"),
    "train.attention_backend": ("auto", "cudnn", "flash", "efficient", "math"),
    "wandb.mode": ("", "online", "offline", "disabled"),
}


def test_choices_are_the_literal_annotations() -> None:
    found = {
        f"{name}.{f.name}": choices(type(section), f.name)
        for name, section in SECTIONS.items()
        for f in dataclasses.fields(section)
        if choices(type(section), f.name)
    }
    assert found == CHOICES


@pytest.mark.parametrize(
    ("key", "message"),
    [  # the messages validation gave before the Literals
        ("precision.mode", "got 'x'; choose one of fp32, mixed, bf16-sr, bf16"),
        ("precision.reduce_dtype", "got 'x'; choose one of fp32, bf16"),
        ("parallel.dp_sharding", "got 'x'; choose one of ddp, zero1, zero2, fsdp"),
        ("parallel.pp_schedule", "got 'x'; choose one of 1f1b, interleaved-1f1b, gpipe"),
        ("parallel.activation_checkpoint", "got 'x'; choose one of none, selective, op, full"),
        ("parallel.compile", "got 'x'; choose one of auto, true, false"),
        ("optim.weight_decay_scope", "got 'x'; choose one of matrices, all"),
        ("schedule.name", "got 'x'; choose one of hlat-cosine, cosine, wsd, constant"),
        ("recovery.nonfinite", "got 'x'; choose one of skip, rollback, error"),
        ("recovery.spike_action", "got 'x'; choose one of skip, rollback, error"),
        ("wandb.mode", "got 'x'; choose one of online, offline, disabled, or \"\" for WANDB_MODE"),
        ("model.rope_scaling", "rope_scaling='x' is not one of none, linear, llama3 (transformers' rope_type names)"),
        ("model.family", "family='x' is not one of llama, qwen3"),
        ("data.verify_shards", "'x': use cached or full"),
        ("data.bad_documents", "'x': use error or skip"),
    ],
)
def test_a_bad_choice_keeps_its_message(key: str, message: str) -> None:
    name, field = key.split(".")
    section = dataclasses.replace(SECTIONS[name], **{field: "x"})
    assert (field, message) in section.validate()
