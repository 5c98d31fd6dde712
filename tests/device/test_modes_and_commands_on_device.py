"""bf16-sr, `mixed` autocast, document masking and the commands that read a checkpoint (eval,
generate, export, import) on the simulated accelerator give the CPU's results exactly. One
mixed-precision run per device is shared by the command tests."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

from hlat.cli import main

sys.path.insert(0, str(Path(__file__).parents[1]))
from device import simulated_device  # noqa: E402
from device.device_runs import accelerator_compute_on_cpu, foreach_adamw_on_cpu, train_here  # noqa: E402
from eval.task_files import write_tiny_tasks  # noqa: E402
from runs import assert_same_tensors, checkpoint_tensors  # noqa: E402

simulated_device.register()
DEVICE = simulated_device.TYPE
STEPS = 2


@contextlib.contextmanager
def embedding_noise() -> Iterator[None]:
    """Training draws from the device's generator, as dropout would (hlat's models have none):
    noise on the embeddings' output, so a resume that restores the wrong generator changes the losses."""

    def noisy(module: nn.Module, inputs: object, output: torch.Tensor) -> torch.Tensor | None:
        return output + 0.1 * torch.randn_like(output) if isinstance(module, nn.Embedding) and module.training else None

    handle = nn.modules.module.register_module_forward_hook(noisy)
    try:
        yield
    finally:
        handle.remove()


@pytest.fixture(scope="module")
def mixed(small_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny model trained for STEPS under `mixed` (bf16 autocast) on the CPU and on the device: run directories."""
    root = tmp_path_factory.mktemp("mixed")
    with foreach_adamw_on_cpu():
        for device in ("cpu", DEVICE):
            train_here(small_corpus, root / device, device, STEPS, "--precision.mode", "mixed")
    return {device: root / device for device in ("cpu", DEVICE)}


def _losses(run: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]


def test_mixed_autocast_on_the_device_equals_the_cpu(mixed: dict[str, Path], tmp_path: Path) -> None:
    cpu, device = _losses(mixed["cpu"]), _losses(mixed[DEVICE])
    assert len(cpu) == STEPS and device == cpu
    saved = [checkpoint_tensors(mixed[d] / "checkpoints" / f"step_{STEPS:08d}", tmp_path) for d in ("cpu", DEVICE)]
    assert_same_tensors(*saved)  # the weights and AdamW moments after the updates


def test_bf16_sr_with_document_masking_resumes_exactly_on_the_device(small_corpus: Path, tmp_path: Path) -> None:
    """bf16 weights with stochastically rounded updates and per-document attention, with training
    noise from each device's own generator: the device's run, stopped and resumed, is the CPU's
    computing as accelerators do (bf16 autocast)."""
    args = ("--precision.mode", "bf16-sr", "--data.document_masking", "true")
    with foreach_adamw_on_cpu(), embedding_noise():
        with accelerator_compute_on_cpu():
            cpu = train_here(small_corpus, tmp_path / "cpu", "cpu", 3, *args)
        half = train_here(small_corpus, tmp_path / "device", DEVICE, 2, *args)
        resumed = train_here(small_corpus, tmp_path / "device", DEVICE, 3, *args)
    assert half == cpu[:2]
    assert resumed == cpu  # two steps, then one after the resume (metrics.jsonl holds all three)


def _text(capsys: pytest.CaptureFixture[str]) -> str:
    """What `hlat generate` printed, without its timing line."""
    return capsys.readouterr().out.rsplit("\n[", 1)[0]


def test_eval_and_generate_on_the_device_equal_the_cpu(
    mixed: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint = mixed[DEVICE] / "checkpoints" / f"step_{STEPS:08d}"
    tasks = write_tiny_tasks(tmp_path / "tasks")
    texts, scores = {}, {}
    for device in ("cpu", DEVICE):
        out = tmp_path / f"eval-{device}"
        with simulated_device.present():
            evaluated = main(
                ["eval", "--checkpoint", str(checkpoint), "--tasks", "arc_easy,perplexity", "--data-dir", str(tasks),
                 "--output", str(out), "--device", device, "--log-samples"]
            )  # fmt: skip
            capsys.readouterr()
            generated = main(["generate", "--checkpoint", str(checkpoint), "--prompt", "def ", "--max-new-tokens", "8",
                              "--device", device])  # fmt: skip
        assert (evaluated, generated) == (0, 0), device
        texts[device] = _text(capsys)
        tasks_done = json.loads((out / "results.json").read_text())["tasks"]
        scores[device] = [{name: {**t, "seconds": None} for name, t in tasks_done.items()}] + [
            (out / f"samples_{task}.jsonl").read_text() for task in ("arc_easy", "perplexity")
        ]
    assert scores[DEVICE] == scores["cpu"]  # every example's log-likelihoods, not only the scores
    assert texts[DEVICE] == texts["cpu"] and len(texts["cpu"]) > len("def ")


def test_export_and_import_round_trip_from_the_device(
    mixed: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A checkpoint the device saved, exported to Hugging Face and imported back, generates on the
    device what the CPU run's own checkpoint generates on the CPU."""
    assert main(["export", str(mixed[DEVICE]), str(tmp_path / "hf")]) == 0
    assert main(["import", str(tmp_path / "hf"), str(tmp_path / "imported")]) == 0
    texts = []
    for run, device in ((mixed["cpu"], "cpu"), (tmp_path / "imported", DEVICE)):
        capsys.readouterr()
        with simulated_device.present():
            prompt = ["--prompt", "import ", "--max-new-tokens", "8", "--device", device]
            assert main(["generate", "--checkpoint", str(run), *prompt]) == 0
        texts.append(_text(capsys))
    assert texts[1] == texts[0] and len(texts[0]) > len("import ")
