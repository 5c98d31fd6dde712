"""Our harness against EleutherAI's lm-evaluation-harness on the same exported model, the same
local data and the same task YAML files, one per output type: per-example log-likelihoods agree to
4e-5, accuracies and exact matches exactly, generations character for character and perplexities
to 4e-5 relative. One simple_evaluate call runs all four tasks (lm-eval indexes only their folder)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from deps import require
from export import save_hf
from hlat.checkpoint.loading import load_model
from hlat.eval import TASKS, EvalOptions, GenerateRequest, LanguageModel, evaluate_task
from hlat.eval.harness import TaskResult
from hlat.eval.tasks.task_file import load_task_files
from task_files import ARC_ROWS, TEXT, write_jsonl

# Measured: log-likelihoods at most 7.6e-6 apart (two fp32 steps at |ll| ~ 42: the two sides batch
# differently, and the kernels a batch shape picks differ by host), rolling ones identical.
LL_ABS = 4e-5  # 5x
# A perplexity is exp(-mean ll): its relative difference is the mean ll's absolute difference, so
# the per-example bound is the bound here (measured 2.5e-6 on an AMD EPYC host, 0 on others).
PPL_REL = LL_ABS
DATA = "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\n{shots}test_split: test\n"
# few-shot: the first 2 examples of a train split, as lm-eval's first_n sampler takes them
SHOTS = "    train: {data}\nfewshot_split: train\nnum_fewshot: 2\nfewshot_config:\n  sampler: first_n\n"
YAML = {
    "tiny_mc": """output_type: multiple_choice
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_target: "{{choices.label.index(answerKey)}}"
doc_to_choice: "{{choices.text}}"
metric_list:
  - metric: acc
  - metric: acc_norm
""",
    "tiny_ll": """output_type: loglikelihood
doc_to_text: "Question: {{question}}\\nAnswer:"
doc_to_target: " {{choices.text[0]}}"
metric_list:
  - metric: perplexity
  - metric: acc
""",
    "tiny_rolling": """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
""",
    "tiny_mc_shots": """output_type: multiple_choice
description: "Answer each question.\\n\\n"
doc_to_text: "Q: {{question}}\\nA:"
doc_to_target: "{{choices.label.index(answerKey)}}"
doc_to_choice: "{{choices.text}}"
""",
    "tiny_gen_shots": """output_type: generate_until
doc_to_text: "Q: {{question}}\\nA:"
doc_to_target: answer
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 4
metric_list:
  - metric: exact_match
""",
    "tiny_gen": """output_type: generate_until
doc_to_text: "Q: {{question}}\\nA:"
doc_to_target: answer
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 6
metric_list:
  - metric: exact_match
""",
}
# two windows of the model's 96 tokens for the longest text
ROLLING_ROWS = [{"text": TEXT[0]}, {"text": " ".join(TEXT[:12])}, {"text": TEXT[3]}]


@pytest.fixture(scope="module")
def both(model, tokenizer_file, tmp_path_factory) -> dict[str, tuple[TaskResult, dict[str, Any]]]:
    """{task: (hlat's result, lm-eval's {"samples", "results"})}, hlat reading the same YAML files."""
    tmp = tmp_path_factory.mktemp("agreement")
    with pytest.MonkeyPatch.context() as mp:
        for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
            mp.setenv(var, "1")
        mp.setenv("HF_HOME", str(tmp / "hf-home"))
        mp.setenv("HF_DATASETS_CACHE", str(tmp / "hf-datasets"))
        lm_eval = require("lm_eval")
        from lm_eval.tasks import TaskManager

        hf_dir = save_hf(tmp / "hf", model, tokenizer_file)
        loaded = load_model(hf_dir)
        lm = LanguageModel(
            loaded.model, loaded.tokenizer, batch_size=4, prefix_token=loaded.prefix_token, progress=False
        )
        # generations: the answer of every other question is what the model says, so exact
        # match is 1 there and 0 elsewhere on both sides
        questions = [{"question": r["question"]} for r in ARC_ROWS]
        said = lm.generate([GenerateRequest(f"Q: {q['question']}\nA:", ("\n",), 6) for q in questions])
        rows = {
            "tiny_mc": ARC_ROWS,
            "tiny_ll": ARC_ROWS,
            "tiny_rolling": ROLLING_ROWS,
            "tiny_gen": [
                {**q, "answer": s if i % 2 == 0 else "nothing at all"} for i, (q, s) in enumerate(zip(questions, said))
            ],
        }
        rows |= {"tiny_mc_shots": ARC_ROWS, "tiny_gen_shots": rows["tiny_gen"]}
        folder = tmp / "yaml"
        folder.mkdir()
        for name, body in YAML.items():
            data = write_jsonl(tmp / "data" / f"{name}.jsonl", rows[name])
            shots = (
                SHOTS.format(data=write_jsonl(tmp / "data" / f"{name}.train.jsonl", rows[name][::-1]))
                if name.endswith("_shots")
                else ""
            )
            (folder / f"{name}.yaml").write_text(f"task: {name}\n" + DATA.format(data=data, shots=shots) + body)
        theirs = lm_eval.simple_evaluate(
            model="hf",
            model_args=f"pretrained={hf_dir},dtype=float32",
            tasks=list(YAML),
            task_manager=TaskManager(include_path=str(folder), include_defaults=False),
            num_fewshot=None,
            batch_size=8,
            device="cpu",
            log_samples=True,
        )  # each file's own
        ours = {t.name: evaluate_task(lm, t, EvalOptions()) for t in load_task_files([folder])}
        ours["arc_easy"] = evaluate_task(
            lm,
            TASKS["arc_easy"],
            EvalOptions(
                data_dir=write_jsonl(tmp / "builtin" / "arc_easy" / "test.jsonl", ARC_ROWS).parents[1], num_fewshot=0
            ),
        )
    return {
        name: (
            ours[name],
            {"samples": sorted(theirs["samples"][name], key=lambda s: s["doc_id"]), "results": theirs["results"][name]},
        )
        for name in YAML
    } | {
        "arc_easy": (
            ours["arc_easy"],
            {
                "samples": sorted(theirs["samples"]["tiny_mc"], key=lambda s: s["doc_id"]),
                "results": theirs["results"]["tiny_mc"],
            },
        )
    }


@pytest.mark.parametrize("name", ["tiny_mc", "arc_easy", "tiny_mc_shots"])  # task file, built-in, 2-shot
def test_multiple_choice_agrees_with_lm_eval(both, name) -> None:
    ours, theirs = both[name]
    assert len(theirs["samples"]) == len(ours.samples) == len(ARC_ROWS)
    for sample, mine in zip(theirs["samples"], ours.samples):
        if name == "tiny_mc_shots":  # the description, two shots, then the question
            assert sample["arguments"][0][0].startswith("Answer each question.\n\nQ: ")
            assert sample["arguments"][0][0].count("Q: ") == 3
        their_lls = [float(r[0][0]) for r in sample["resps"]]
        assert mine["loglikelihoods"] == pytest.approx(their_lls, abs=LL_ABS)
        assert (mine["acc"], mine["acc_norm"]) == (sample["acc"], sample["acc_norm"])
    assert ours.metrics["acc"]["value"] == theirs["results"]["acc,none"]
    assert ours.metrics["acc_norm"]["value"] == theirs["results"]["acc_norm,none"]


def test_loglikelihood_agrees_with_lm_eval(both) -> None:
    ours, theirs = both["tiny_ll"]
    assert len(theirs["samples"]) == len(ours.samples) == len(ARC_ROWS)
    for sample, mine in zip(theirs["samples"], ours.samples):
        ll, greedy = sample["resps"][0][0]
        assert mine["loglikelihood"] == pytest.approx(float(ll), abs=LL_ABS)
        assert mine["greedy"] == bool(greedy)
    assert ours.metrics["acc"]["value"] == theirs["results"]["acc,none"]
    assert ours.metrics["perplexity"]["value"] == pytest.approx(theirs["results"]["perplexity,none"], rel=PPL_REL)


def test_loglikelihood_rolling_agrees_with_lm_eval(both) -> None:
    ours, theirs = both["tiny_rolling"]
    assert len(theirs["samples"]) == len(ours.samples) == len(ROLLING_ROWS)
    for sample, mine in zip(theirs["samples"], ours.samples):
        assert mine["loglikelihood"] == pytest.approx(float(sample["resps"][0][0]), abs=LL_ABS)
    for metric in ("word_perplexity", "byte_perplexity", "bits_per_byte"):
        assert ours.metrics[metric]["value"] == pytest.approx(theirs["results"][f"{metric},none"], rel=PPL_REL)
    assert math.isfinite(ours.metrics["bits_per_byte"]["value"])


def test_generate_until_agrees_with_lm_eval(both) -> None:
    ours, theirs = both["tiny_gen"]
    assert len(theirs["samples"]) == len(ours.samples) == len(ARC_ROWS)
    for sample, mine in zip(theirs["samples"], ours.samples):
        assert mine["output"] == sample["resps"][0][0]
        assert mine["exact_match"] == sample["exact_match"]
    assert ours.metrics["exact_match"]["value"] == theirs["results"]["exact_match,none"] == 0.5
    json.dumps([s for s in ours.samples])  # the records --log-samples writes


def test_few_shot_generation_agrees_with_lm_eval(both) -> None:
    """2 shots (first_n) before each question: the same prompts, so the same generations."""
    ours, theirs = both["tiny_gen_shots"]
    assert len(theirs["samples"]) == len(ours.samples) == len(ARC_ROWS)
    for sample, mine in zip(theirs["samples"], ours.samples):
        assert sample["arguments"][0][0].count("Q: ") == 3  # two shots, then the question
        assert mine["output"] == sample["resps"][0][0]
        assert mine["exact_match"] == sample["exact_match"]
    assert ours.metrics["exact_match"]["value"] == theirs["results"]["exact_match,none"]
