"""Mixture proportions hold under data parallelism and across a resume that changes it.

Two sources weighted 0.75 / 0.25, short documents (at most 80 characters): 6 steps on DP 2, then
resumed on DP 4 (the loader states merged and dealt to 4 ranks) to step 12. Each rank keeps each
source within one document of its share (docs/data.md), so the per-source token counts summed
over the ranks (metrics.jsonl's source_tokens) must be within dp x (longest document + EOS) tokens
of weight x tokens at every step, over the whole run and over the resumed part alone.
"""

import json

from hlat.data.tokenizer import Tokenizer
from runs import Scenario, ScenarioResults

TRAIN = "train/layout_runs.py:train"
WEIGHTS = {"a": 0.75, "b": 0.25}
MIXTURE = [
    "--data.source",
    "{root}/mixture-sources/a,{root}/mixture-sources/b",
    "--data.weights",
    "0.75,0.25",
    "--checkpoint.every",
    "3",
    "--parallel.dp_sharding",
    "ddp",
]
SCENARIOS = [
    Scenario("mixture-sources", "train/layout_runs.py:mixture_sources", 1, {"docs": 300, "chars": 80}),
    Scenario("mixture-dp2", TRAIN, 2, {"steps": 6, "extra": MIXTURE}),
    Scenario(
        "mixture-dp4", TRAIN, 4, {"steps": 12, "extra": MIXTURE, "resume": "require", "start_from": "mixture-dp2"}
    ),
]


def records(scenarios: ScenarioResults, name: str) -> list[dict]:
    lines = (scenarios.path(name) / "run" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "source_tokens" in r]


def by_source(record: dict) -> dict[str, int]:
    """source_tokens keyed by the source's directory name (a or b)."""
    return {
        next(s for s in WEIGHTS if name.rstrip("/").endswith(f"/{s}")): n for name, n in record["source_tokens"].items()
    }


def longest_document(scenarios: ScenarioResults) -> int:
    tokenizer = Tokenizer.from_file(scenarios.path("mixture-dp2") / "run" / "tokenizer.json")
    return max(len(tokenizer.encode(f.read_text())) for f in scenarios.path("mixture-sources").glob("*/*.txt"))


def test_proportions_hold_under_dp_and_across_a_dp_change(scenarios):
    first, both = records(scenarios, "mixture-dp2"), records(scenarios, "mixture-dp4")  # the resumed run's log goes on
    assert both[:6] == first and [r["step"] for r in both] == list(range(1, 13))
    resumed = both[6:]
    assert any("resharded from" in m for m in scenarios.json("mixture-dp4", "summary.rank0.json")["messages"])
    doc = longest_document(scenarios) + 1  # + its EOS
    start = by_source(first[-1])
    for record, dp in [(r, 2) for r in first] + [(r, 4) for r in resumed]:
        counts = by_source(record)
        total = sum(counts.values())
        assert total == record["tokens"], record  # every token read is counted, once
        for source, weight in WEIGHTS.items():
            assert abs(counts[source] - weight * total) <= dp * doc, (record["step"], counts, doc)
        if dp == 4:  # the resumed part alone keeps the proportions too
            since = {s: counts[s] - start[s] for s in WEIGHTS}
            for source, weight in WEIGHTS.items():
                assert abs(since[source] - weight * sum(since.values())) <= (2 + 4) * doc, (record["step"], since, doc)
    final = by_source(resumed[-1])
    assert abs(final["a"] / sum(final.values()) - 0.75) < 0.05, final
