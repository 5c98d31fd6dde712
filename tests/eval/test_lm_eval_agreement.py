"""Our harness against EleutherAI's lm-evaluation-harness on the same exported model and data:
per-choice log-likelihoods agree to 1e-4 and accuracies exactly."""

from __future__ import annotations

import pytest

from hlat.eval import EvalOptions, LanguageModel, TASKS, evaluate_task, load_model

from task_files import ARC_ROWS, write_jsonl
from export import save_hf
from deps import require

TASK_YAML = """task: hlat_tiny_arc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: multiple_choice
test_split: test
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{choices.label.index(answerKey)}}}}"
doc_to_choice: "{{{{choices.text}}}}"
metric_list:
  - metric: acc
  - metric: acc_norm
"""


def test_multiple_choice_agrees_with_lm_eval(model, tokenizer_file, tmp_path, monkeypatch) -> None:
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(var, "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))
    lm_eval = require("lm_eval")
    from lm_eval.tasks import TaskManager

    data = write_jsonl(tmp_path / "data" / "arc_easy" / "test.jsonl", ARC_ROWS)
    (tmp_path / "yaml").mkdir()
    (tmp_path / "yaml" / "hlat_tiny_arc.yaml").write_text(TASK_YAML.format(data=data))
    hf_dir = save_hf(tmp_path / "hf", model, tokenizer_file)

    theirs = lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={hf_dir},dtype=float32", tasks=["hlat_tiny_arc"],
        task_manager=TaskManager(include_path=str(tmp_path / "yaml"), include_defaults=False), num_fewshot=0,
        batch_size=2, device="cpu", log_samples=True)
    loaded = load_model(hf_dir)
    lm = LanguageModel(loaded.model, loaded.tokenizer, batch_size=4,
                       prefix_token=loaded.prefix_token, progress=False)
    ours = evaluate_task(lm, TASKS["arc_easy"], EvalOptions(data_dir=tmp_path / "data", num_fewshot=0))

    samples = sorted(theirs["samples"]["hlat_tiny_arc"], key=lambda s: s["doc_id"])
    assert len(samples) == len(ours.samples) == len(ARC_ROWS)
    for sample, mine in zip(samples, ours.samples):
        their_lls = [float(r[0][0]) for r in sample["resps"]]
        assert mine["loglikelihoods"] == pytest.approx(their_lls, abs=1e-4)
        assert (mine["acc"], mine["acc_norm"]) == (sample["acc"], sample["acc_norm"])
    result = theirs["results"]["hlat_tiny_arc"]
    assert ours.metrics["acc"]["value"] == result["acc,none"]
    assert ours.metrics["acc_norm"]["value"] == result["acc_norm,none"]
