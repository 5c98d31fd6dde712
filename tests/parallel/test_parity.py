"""Every parallel layout matches the single-process run: losses, gradient norms and weights.

fp32 on gloo/CPU; tolerances: losses and grad norms 1e-5 relative; weights 2e-5 absolute after
2 AdamW steps at LR 1e-3 (Adam divides by sqrt(v), so near-zero gradient entries turn the
summation-order noise that separates layouts into visible weight differences; 2e-5 is 2% of one
step's largest update). The model has 2 layers, 4 under pipeline parallelism (parity_worker.Case.layers).
"""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from parallel.parity_worker import MODEL, PIPELINE_LAYERS, SEQ, VARIANTS, Case
from runs import Scenario, ScenarioResults

# the single-process run of each model variant (parity_worker.VARIANTS) at each depth (Case.layers)
REFERENCES = {
    (variant, layers): Case(variant=variant, n_layers=layers)
    for variant in ("", "tied", "bias", "odd", "qwen3", "documents")
    for layers in (MODEL.n_layers, PIPELINE_LAYERS)
}

TWO = [
    Case(dp=2),
    Case(dp=2, dp_sharding="zero1"),
    Case(dp=2, dp_sharding="zero2"),
    Case(dp=2, dp_sharding="fsdp", recompute="selective"),
    Case(dp=2, dp_sharding="fsdp", recompute="op"),
    Case(tp=2),
    Case(tp=2, recompute="full"),
    Case(pp=2),
    Case(pp=2, schedule="gpipe"),
    Case(pp=2, schedule="interleaved-1f1b", stages_per_rank=2),
    # tied embeddings under PP: a copy on the first stage (rank 0) and the last (stage 3, rank 1)
    Case(pp=2, schedule="interleaved-1f1b", stages_per_rank=2, variant="tied"),
    # tied embeddings: one matrix, its gradient summed from the embedding and the output head
    Case(dp=2, dp_sharding="fsdp", recompute="selective", variant="tied"),
    Case(tp=2, variant="tied"),  # one vocab-sharded matrix for the embedding and the output head
    Case(
        tp=2, variant="bias"
    ),  # biases, llama3 RoPE scaling and head_dim 32 (!= d_model / n_heads) over TP head shards
    Case(tp=2, variant="odd"),  # vocabulary 127: uneven vocab shards (64 + 63 rows) in TP's embedding, head and loss
    # Qwen3: the QK-norm weights replicated over data and tensor parallelism, the pipeline split by its spec's costs
    Case(dp=2, variant="qwen3"),
    Case(dp=2, dp_sharding="fsdp", recompute="selective", variant="qwen3"),
    Case(tp=2, variant="qwen3"),  # each rank normalises its own heads; the norms' gradients summed over tp
    Case(pp=2, variant="qwen3"),
    Case(cp=2),  # context parallel: each sequence's chunks 0+3 and 1+2 of 4, ring attention over them
    Case(cp=2, variant="documents"),  # ... with document masking: per-document positions and masks
    Case(cp=2, recompute="full"),  # ring attention recomputed inside each block's backward
    Case(cp=2, recompute="op"),
    Case(cp=2, recompute="selective"),  # the ring attention's output saved, not replayed
    Case(cp=2, recompute="selective", variant="documents"),
]
FOUR = [
    Case(cp=4),
    Case(cp=4, variant="documents"),
    Case(cp=2, tp=2, dp_sharding="zero2"),  # ring attention over each rank's tp shard of the heads
    Case(cp=2, tp=2, dp_sharding="zero2", variant="documents"),  # ... with document masking
    Case(dp=2, cp=2, dp_sharding="fsdp"),  # FSDP2 over dp and cp flattened
    # HSDP x CP: 2 replicas, each FSDP2 over dp_shard 1 x cp 2
    Case(dp=2, dp_replicate=2, cp=2, dp_sharding="fsdp", recompute="selective", variant="documents"),
    Case(dp=2, tp=2, dp_sharding="fsdp"),
    Case(pp=2, dp=2, dp_sharding="zero2"),
    Case(pp=2, dp=2, dp_sharding="fsdp", recompute="selective"),
    Case(pp=2, tp=2),
    Case(pp=2, cp=2, dp_sharding="zero2"),  # each pipeline stage's ring over its cp ranks
    # ... each micro-batch's whole rows' documents given to its stages' rings
    Case(pp=2, cp=2, dp_sharding="fsdp", recompute="selective", variant="documents"),
    Case(pp=2, cp=2, dp_sharding="zero2", schedule="interleaved-1f1b", stages_per_rank=2),
    Case(tp=4),  # tp 4 > 2 KV heads: KV projections replicated
    Case(tp=4, variant="bias"),  # ... with their biases
    Case(dp=2, tp=2, dp_sharding="fsdp", variant="tied"),
    Case(
        pp=2, dp=2, dp_sharding="fsdp", variant="tied"
    ),  # PP x FSDP: the copies' gradient shards summed between stages
    Case(pp=2, tp=2, variant="tied"),  # PP x TP: the embedding's Replicate gradient resharded, then summed
    Case(dp=4, dp_replicate=2, dp_sharding="fsdp"),  # HSDP: 2 replicas x 2 shards
    Case(tp=4, variant="qwen3"),  # tp 4 > 2 KV heads: k_norm over each rank's copy of its one KV head
    Case(
        dp=2, tp=2, dp_sharding="fsdp", variant="qwen3"
    ),  # FSDP2 over TP: the norms' weights sharded over dp, replicated over tp
]
EIGHT = [
    Case(pp=2, dp=2, tp=2, dp_sharding="zero2"),
    Case(dp=2, tp=4, dp_sharding="fsdp"),  # the second: FSDP over replicated KV projections
    Case(dp=4, dp_replicate=2, tp=2, dp_sharding="zero2"),  # HSDP 2 x 2 x TP 2
    Case(pp=2, dp=4, dp_replicate=2, dp_sharding="fsdp"),
]  # PP 2 x HSDP 2 x 2
SCENARIOS = [
    Scenario(
        f"parity-{world}", "parallel/parity_worker.py:layouts", world, {"cases": [dataclasses.asdict(c) for c in cases]}
    )
    for world, cases in ((1, list(REFERENCES.values())), (2, TWO), (4, FOUR), (8, EIGHT))
]


def results(out: Path, case: Case) -> tuple[dict, dict]:
    tag = case.id
    weights: dict[str, torch.Tensor] = {}
    for file in sorted(out.glob(f"{tag}.rank*.pt")):
        for name, value in torch.load(file, weights_only=True).items():
            # a tensor several ranks hold (replicas, the pipeline's tied copies) is identical on each
            assert name not in weights or torch.equal(weights[name], value), f"{case.id}: {name} differs in {file.name}"
            weights[name] = value
    return json.loads((out / f"{tag}.json").read_text()), weights


def references(scenarios: ScenarioResults) -> dict[tuple[str, int], tuple[dict, dict]]:
    """parity-1's results by (variant, layers), what `check` compares a case with."""
    return {key: results(scenarios.path("parity-1"), case) for key, case in REFERENCES.items()}


@pytest.fixture(scope="module")
def reference(scenarios: ScenarioResults):
    return references(scenarios)


def check(reference, out: Path, case: Case) -> None:
    (ref_metrics, ref_weights), (metrics, weights) = reference[case.variant, case.layers], results(out, case)
    assert metrics["losses"] == pytest.approx(ref_metrics["losses"], rel=1e-5), case.id
    assert metrics["grad_norms"] == pytest.approx(ref_metrics["grad_norms"], rel=1e-5), case.id
    assert weights.keys() == ref_weights.keys(), case.id
    for name, value in ref_weights.items():
        torch.testing.assert_close(weights[name], value, rtol=0, atol=2e-5, msg=f"{case.id}: {name}")


@pytest.mark.parametrize("world, cases", [(2, TWO), (4, FOUR), (8, EIGHT)], ids=["2-proc", "4-proc", "8-proc"])
def test_layouts_match_single_process(reference, scenarios, world, cases):
    for case in cases:
        check(reference, scenarios.path(f"parity-{world}"), case)


@pytest.mark.parametrize(
    "world, case",
    [(4, Case(tp=4)), (4, Case(tp=4, variant="bias")), (8, Case(dp=2, tp=4, dp_sharding="fsdp"))],
    ids=lambda value: value.id if isinstance(value, Case) else str(value),
)
def test_replicated_kv_projections_compute_one_head_per_rank(scenarios, world, case):
    """tp 4 over 2 KV heads: each rank computes only the KV head its query heads use, not both."""
    model = VARIANTS[case.variant]
    metrics, _ = results(scenarios.path(f"parity-{world}"), case)
    assert metrics["kv_flops"] == 2 * SEQ * model.d_model * model.attn_head_dim, case.id
