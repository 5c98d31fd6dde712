"""Document masking on pipeline stages: positions and document ids travel with each micro-batch
to every stage, which builds its own mask; 2 stages train as one process does."""

import json

import pytest

from runs import Scenario

SCHEDULES = ["1f1b", "interleaved-1f1b"]
SCENARIOS = [
    Scenario("document-masking-pp-1", "parallel/document_masking_worker.py:losses", 1, {"schedules": ["1f1b"]}),
    Scenario("document-masking-pp-2", "parallel/document_masking_worker.py:losses", 2, {"schedules": SCHEDULES}),
]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_pipeline_stages_mask_documents_as_one_process(scenarios, schedule: str) -> None:
    reference = json.loads((scenarios.path("document-masking-pp-1") / "1f1b.json").read_text())
    staged = json.loads((scenarios.path("document-masking-pp-2") / f"{schedule}.json").read_text())
    assert staged["losses"] == pytest.approx(reference["losses"], rel=1e-5)
    assert staged["val"] == pytest.approx(reference["val"], rel=1e-5)
