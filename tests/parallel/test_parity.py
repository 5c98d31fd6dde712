"""Every parallel layout matches the single-process run: losses, gradient norms and weights.

fp32 on gloo/CPU; tolerances: losses and grad norms 1e-5 relative; weights 2e-5 absolute after
2 AdamW steps at LR 1e-3 (Adam divides by sqrt(v), so near-zero gradient entries turn the
summation-order noise that separates layouts into visible weight differences; 2e-5 is 2% of one
step's largest update).
"""

import json
from pathlib import Path

import pytest
import torch

from parallel.parity_worker import SEQ, VARIANTS
from runs import Scenario, ScenarioResults

# the single-process run of each model variant (a spec's optional 8th field, parity_worker.VARIANTS)
REFERENCES = {variant: "1,1,1,ddp,1f1b,1,none" + (variant and "," + variant) for variant in ("", "tied", "bias", "odd", "qwen3")}

TWO = [
    "1,2,1,ddp,1f1b,1,none",
    "1,2,1,zero1,1f1b,1,none",
    "1,2,1,zero2,1f1b,1,none",
    "1,2,1,fsdp,1f1b,1,selective",
    "1,2,1,fsdp,1f1b,1,op",
    "1,1,2,ddp,1f1b,1,none",
    "1,1,2,ddp,1f1b,1,full",
    "2,1,1,ddp,1f1b,1,none",
    "2,1,1,ddp,gpipe,1,none",
    "2,1,1,ddp,interleaved-1f1b,2,none",
    # tied embeddings under PP: a copy on the first stage (rank 0) and the last (stage 3, rank 1)
    "2,1,1,ddp,interleaved-1f1b,2,none,tied",
    # tied embeddings: one matrix, its gradient summed from the embedding and the output head
    "1,2,1,fsdp,1f1b,1,selective,tied",
    "1,1,2,ddp,1f1b,1,none,tied",  # one vocab-sharded matrix for the embedding and the output head
    "1,1,2,ddp,1f1b,1,none,bias",  # biases, llama3 RoPE scaling and head_dim 32 (!= d_model / n_heads) over TP head shards
    "1,1,2,ddp,1f1b,1,none,odd",  # vocabulary 127: uneven vocab shards (64 + 63 rows) in TP's embedding, head and loss
    # Qwen3: the QK-norm weights replicated over data and tensor parallelism, the pipeline split by its spec's costs
    "1,2,1,ddp,1f1b,1,none,qwen3",
    "1,2,1,fsdp,1f1b,1,selective,qwen3",
    "1,1,2,ddp,1f1b,1,none,qwen3",  # each rank normalises its own heads; the norms' gradients summed over tp
    "2,1,1,ddp,1f1b,1,none,qwen3",
]
FOUR = [
    "1,2,2,fsdp,1f1b,1,none",
    "2,2,1,zero2,1f1b,1,none",
    "2,2,1,fsdp,1f1b,1,selective",
    "2,1,2,ddp,1f1b,1,none",
    "1,1,4,ddp,1f1b,1,none",  # tp 4 > 2 KV heads: KV projections replicated
    "1,1,4,ddp,1f1b,1,none,bias",  # ... with their biases
    "1,2,2,fsdp,1f1b,1,none,tied",
    "2,2,1,fsdp,1f1b,1,none,tied",  # PP x FSDP: the copies' gradient shards summed between stages
    "2,1,2,ddp,1f1b,1,none,tied",  # PP x TP: the embedding's Replicate gradient resharded, then summed
    "1,2x2,1,fsdp,1f1b,1,none",  # HSDP: 2 replicas x 2 shards (parity_worker.run)
    "1,1,4,ddp,1f1b,1,none,qwen3",  # tp 4 > 2 KV heads: k_norm over each rank's copy of its one KV head
    "1,2,2,fsdp,1f1b,1,none,qwen3",  # FSDP2 over TP: the norms' weights sharded over dp, replicated over tp
]
EIGHT = ["2,2,2,zero2,1f1b,1,none", "1,2,4,fsdp,1f1b,1,none",  # the second: FSDP over replicated KV projections
         "1,2x2,2,zero2,1f1b,1,none",  # HSDP 2 x 2 x TP 2
         "2,2x2,1,fsdp,1f1b,1,none"]  # PP 2 x HSDP 2 x 2
SCENARIOS = [Scenario(f"parity-{world}", "parallel/parity_worker.py:layouts", world, {"specs": specs})
             for world, specs in ((1, list(REFERENCES.values())), (2, TWO), (4, FOUR), (8, EIGHT))]


def results(out: Path, spec: str) -> tuple[dict, dict]:
    tag = spec.replace(",", "_")
    weights: dict[str, torch.Tensor] = {}
    for file in sorted(out.glob(f"{tag}.rank*.pt")):
        for name, value in torch.load(file, weights_only=True).items():
            # a tensor several ranks hold (replicas, the pipeline's tied copies) is identical on each
            assert name not in weights or torch.equal(weights[name], value), f"{spec}: {name} differs in {file.name}"
            weights[name] = value
    return json.loads((out / f"{tag}.json").read_text()), weights


@pytest.fixture(scope="module")
def reference(scenarios: ScenarioResults):
    return {variant: results(scenarios.path("parity-1"), spec) for variant, spec in REFERENCES.items()}


def check(reference, out: Path, spec: str) -> None:
    (ref_metrics, ref_weights), (metrics, weights) = reference[",".join(spec.split(",")[7:])], results(out, spec)
    assert metrics["losses"] == pytest.approx(ref_metrics["losses"], rel=1e-5), spec
    assert metrics["grad_norms"] == pytest.approx(ref_metrics["grad_norms"], rel=1e-5), spec
    assert weights.keys() == ref_weights.keys(), spec
    for name, value in ref_weights.items():
        torch.testing.assert_close(weights[name], value, rtol=0, atol=2e-5, msg=f"{spec}: {name}")


@pytest.mark.parametrize("world, specs", [(2, TWO), (4, FOUR), (8, EIGHT)], ids=["2-proc", "4-proc", "8-proc"])
def test_layouts_match_single_process(reference, scenarios, world, specs):
    for spec in specs:
        check(reference, scenarios.path(f"parity-{world}"), spec)


@pytest.mark.parametrize("world, spec", [(4, "1,1,4,ddp,1f1b,1,none"), (4, "1,1,4,ddp,1f1b,1,none,bias"), (8, "1,2,4,fsdp,1f1b,1,none")])
def test_replicated_kv_projections_compute_one_head_per_rank(scenarios, world, spec):
    """tp 4 over 2 KV heads: each rank computes only the KV head its query heads use, not both."""
    model = VARIANTS[",".join(spec.split(",")[7:])]
    metrics, _ = results(scenarios.path(f"parity-{world}"), spec)
    assert metrics["kv_flops"] == 2 * SEQ * model.d_model * model.attn_head_dim, spec
