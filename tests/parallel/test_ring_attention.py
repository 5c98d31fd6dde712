"""Ring attention over 2 and 4 cp ranks equals one process's causal attention, and its document
masking, forward and backward.

fp32; the largest difference measured on 2 ranks was 1.2e-6 (out and gradients of unit-normal inputs); asserted 1e-5.
"""

import json
import re

import pytest
import torch

from hlat.config.layout import Degrees
from hlat.config.parallel import ParallelConfig
from hlat.config.precision import PrecisionConfig
from hlat.errors import ConfigError
from hlat.model.ring_attention import RingContext, _pairs
from hlat.parallel.mesh import Layout
from hlat.parallel.parallelize import build_parallel_model
from parallel.parity_worker import MODEL
from runs import Scenario, ScenarioResults

# (cp, K/V heads of 4 query heads: multi-head or grouped-query, document masking)
CASES = [(2, 4, False), (2, 2, False), (4, 2, False), (2, 2, True), (4, 2, True)]
IDS = [f"cp{cp}-kv{kv}{'-documents' if docs else ''}" for cp, kv, docs in CASES]
SCENARIOS = [
    Scenario(
        f"ring-attention-{name}",
        "parallel/ring_attention_worker.py:compare",
        cp,
        {"kv_heads": kv, "documents": docs},
    )
    for name, (cp, kv, docs) in zip(IDS, CASES, strict=True)
]


@pytest.mark.parametrize("cp, kv_heads, documents", CASES, ids=IDS)
def test_ring_attention_matches_one_process(
    scenarios: ScenarioResults, cp: int, kv_heads: int, documents: bool
) -> None:
    out = scenarios.path(f"ring-attention-{IDS[CASES.index((cp, kv_heads, documents))]}")
    for rank in range(cp):
        errors = json.loads((out / f"errors.rank{rank}.json").read_text())
        assert max(errors.values()) < 1e-5, (rank, errors)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_load_balancing_gives_every_rank_the_same_causal_work(cp: int) -> None:
    """The query x key scores each rank computes over the whole ring (chunk pairs it does not skip;
    a diagonal pair computes its causal half) are one cp-th of the causal attention's."""
    chunk = 4
    seq = 2 * cp * chunk

    def scores(rank: int) -> int:
        ring = RingContext(None, rank, cp)  # type: ignore[arg-type]  # (no group: nothing is sent)
        pairs = [pair for src in range(cp) for pair in _pairs(ring, src)]
        return sum(chunk * (chunk + 1) // 2 if causal else chunk * chunk for _, _, causal, _ in pairs)

    assert [scores(rank) for rank in range(cp)] == [seq * (seq + 1) // 2 // cp] * cp


def test_context_parallel_off_the_cpu_is_refused_naming_the_field() -> None:
    layout = Layout(2, 0, Degrees(cp=2), None)
    with pytest.raises(
        ConfigError,
        match=re.escape(
            "parallel.cp: cp=2: ring attention has no kernel on meta (it runs on cpu and cuda); use --parallel.cp 1"
        ),
    ):
        build_parallel_model(
            MODEL,
            parallel=ParallelConfig(cp=2),
            layout=layout,
            device=torch.device("meta"),
            seed=0,
            n_microbatches=1,
            precision=PrecisionConfig(mode="fp32"),
        )
