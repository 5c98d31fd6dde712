"""Prompts as lm-eval builds them, deterministic few-shot, and each scorer end to end."""

from __future__ import annotations

import json

import pytest

from hlat.eval import TASKS, EvalOptions, LanguageModel, evaluate_task, resolve_tasks
from hlat.eval.metrics import multiple_choice
from hlat.eval.results import load_baselines, markdown_table, results_dict, write_results
from hlat.eval.tasks import choose_shots
from hlat.eval.tasks.generation import gsm8k_flexible, gsm8k_strict
from task_files import ARC_ROWS, write_jsonl

MMLU = [
    {"question": f"Q{i}?", "subject": s, "choices": ["w", "x", "y", "z"], "answer": i % 4}
    for i, s in enumerate(["anatomy"] * 6 + ["virology"] * 6)
]


def test_prompt_formats_match_lm_eval() -> None:
    arc = TASKS["arc_easy"]
    assert arc.prompt(ARC_ROWS[0], []) == "Question: What is the capital of France?\nAnswer:"
    assert arc.prompt(ARC_ROWS[0], [ARC_ROWS[1]]) == (
        "Question: Which tool cuts wood?\nAnswer: a saw\n\nQuestion: What is the capital of France?\nAnswer:"
    )
    mmlu = TASKS["mmlu"]
    assert mmlu.prompt(MMLU[0], []) == (
        "The following are multiple choice questions (with answers) "
        "about anatomy.\n\nQ0?\nA. w\nB. x\nC. y\nD. z\nAnswer:"
    )
    wino = TASKS["winogrande"]
    doc = {
        "sentence": "The cup fell because _ was slippery.",
        "option1": "the cup",
        "option2": "the table",
        "answer": "1",
    }
    assert wino.doc_to_choice(doc) == ["The cup fell because the cup", "The cup fell because the table"]
    assert wino.doc_to_text(doc) == "was slippery." and wino.doc_to_target(doc) == 0
    assert wino.prompt(doc, [doc]) == "The cup fell because the cup was slippery.\n\n"


def test_fewshot_is_deterministic_and_never_the_example_itself() -> None:
    arc = TASKS["arc_easy"]
    shots = [[id(s) for s in choose_shots(arc, i, d, ARC_ROWS, 3, 1234, True)] for i, d in enumerate(ARC_ROWS)]
    again = [[id(s) for s in choose_shots(arc, i, d, ARC_ROWS, 3, 1234, True)] for i, d in enumerate(ARC_ROWS)]
    assert shots == again
    assert all(id(d) not in s for d, s in zip(ARC_ROWS, shots))
    other = [[id(s) for s in choose_shots(arc, i, d, ARC_ROWS, 3, 99, True)] for i, d in enumerate(ARC_ROWS)]
    assert other != shots
    mmlu = TASKS["mmlu"]  # shots come from the same subject, first 5 of dev
    picked = choose_shots(mmlu, 0, MMLU[7], MMLU, 5, 1234, False)
    assert [d["question"] for d in picked] == ["Q6?", "Q7?", "Q8?", "Q9?", "Q10?"]
    with pytest.raises(ValueError, match="num-fewshot"):
        choose_shots(arc, 0, ARC_ROWS[0], ARC_ROWS, 6, 0, True)


def test_multiple_choice_end_to_end_matches_hand_scoring(lm, tmp_path) -> None:
    write_jsonl(tmp_path / "arc_easy" / "test.jsonl", ARC_ROWS)
    options = EvalOptions(data_dir=tmp_path, num_fewshot=2)
    result = evaluate_task(lm, TASKS["arc_easy"], options)
    again = evaluate_task(lm, TASKS["arc_easy"], options)
    assert result.prompt_hash == again.prompt_hash and result.n == 6 and result.shots == 2
    acc, acc_norm = [], []
    for doc, sample in zip(ARC_ROWS, result.samples):
        choices = doc["choices"]["text"]
        from hlat.eval import LoglikelihoodRequest

        lls = [ll for ll, _ in lm.loglikelihood([LoglikelihoodRequest(sample["prompt"], " " + c) for c in choices])]
        assert sample["loglikelihoods"] == pytest.approx(lls, abs=1e-5)
        scores = multiple_choice(lls, choices, doc["choices"]["label"].index(doc["answerKey"]))
        acc.append(scores["acc"])
        acc_norm.append(scores["acc_norm"])
    assert result.metrics["acc"]["value"] == sum(acc) / 6
    assert result.metrics["acc_norm"]["value"] == sum(acc_norm) / 6
    shifted = evaluate_task(lm, TASKS["arc_easy"], EvalOptions(data_dir=tmp_path, num_fewshot=2, seed=5))
    assert shifted.prompt_hash != result.prompt_hash


def test_acc_norm_divides_by_characters() -> None:
    # "b" is likelier in total, but per character the long choice wins
    assert multiple_choice([-4.0, -3.0], ["long one", "b"], 0) == {"acc": 0.0, "acc_norm": 1.0}


class FixedAnswers(LanguageModel):
    """Generation replaced by canned outputs, to test answer extraction and exact match."""

    def __init__(self, base: LanguageModel, outputs: list[str]) -> None:
        self.__dict__.update(base.__dict__)
        self.outputs = outputs

    def generate(self, requests):  # type: ignore[override]
        return self.outputs[: len(requests)]


def test_generation_exact_match_and_gsm8k_extraction(lm, tmp_path) -> None:
    rows = [
        {"question": "Who wrote Hamlet", "answer": {"aliases": ["Shakespeare", "William Shakespeare"]}},
        {"question": "Capital of France", "answer": {"aliases": ["Paris"]}},
    ]
    write_jsonl(tmp_path / "triviaqa" / "validation.jsonl", rows)
    result = evaluate_task(
        FixedAnswers(lm, [" william shakespeare", " Lyon"]),
        TASKS["triviaqa"],
        EvalOptions(data_dir=tmp_path, num_fewshot=1),
    )
    assert result.metrics["exact_match"]["value"] == 0.5
    assert any("few-shot split 'train' unavailable" in n for n in result.notes)
    assert gsm8k_strict("so 3 + 4 = 7.\n#### 7") == "7" and gsm8k_strict("it is 7") == "[invalid]"
    assert gsm8k_flexible("first 3, then $1,200.") == "$1,200."
    gsm = [{"question": "2+2?", "answer": "2+2=4\n#### 4"}, {"question": "1000+234?", "answer": "#### 1,234"}]
    write_jsonl(tmp_path / "gsm8k" / "test.jsonl", gsm)
    result = evaluate_task(
        FixedAnswers(lm, ["4 apples\n#### 4", "The answer is $1234."]),
        TASKS["gsm8k"],
        EvalOptions(data_dir=tmp_path, num_fewshot=0),
    )
    assert result.metrics["exact_match"]["value"] == 0.5  # strict needs "#### N"
    assert result.metrics["exact_match_flexible"]["value"] == 1.0


def test_perplexity_task_and_results_files(lm, tmp_path) -> None:
    write_jsonl(
        tmp_path / "perplexity" / "test.jsonl", [{"text": "The quick brown fox."}, {"text": "A saw cuts wood."}]
    )
    result = evaluate_task(lm, TASKS["perplexity"], EvalOptions(data_dir=tmp_path))
    lls = [s["loglikelihood"] for s in result.samples]
    nbytes = len("The quick brown fox.") + len("A saw cuts wood.")
    import math

    assert result.metrics["bits_per_byte"]["value"] == pytest.approx(-sum(lls) / nbytes / math.log(2))
    baseline_file = tmp_path / "baseline.json"
    baseline_file.write_text(json.dumps({"LLaMA-2 7B": {"perplexity": {"bits_per_byte": 0.5}}}))
    baselines = load_baselines(baseline_file)
    data = results_dict([result], {"mmlu": "no data"}, {"model": "tiny"})
    path = write_results(tmp_path / "out", data, [result], baselines, log_samples=True)
    saved = json.loads(path.read_text())
    assert saved["tasks"]["perplexity"]["n"] == 2 and "samples" not in saved["tasks"]["perplexity"]
    table = markdown_table(saved, baselines)
    assert "| perplexity | language modelling | bits_per_byte | 0 | 2 |" in table and "0.5000" in table
    assert "skipped mmlu" in table
    assert (tmp_path / "out" / "samples_perplexity.jsonl").is_file()
    baseline_file.write_text(json.dumps({"x": {"arc_easy": {"acc": 76.2}}}))
    with pytest.raises(ValueError, match="fractions"):
        load_baselines(baseline_file)


def test_suites_and_unknown_names() -> None:
    names = [t.name for t in resolve_tasks(suite="hlat")]
    assert names[:2] == ["mmlu", "bbh"] and "humaneval" in names and len(names) == 15
    assert [t.name for t in resolve_tasks("piqa,piqa,boolq")] == ["piqa", "boolq"]
    with pytest.raises(ValueError, match="unknown task"):
        resolve_tasks("arc_eazy")
    with pytest.raises(ValueError, match="unknown suite"):
        resolve_tasks(suite="nope")
