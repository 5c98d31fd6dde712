"""The gradient norm and AdamW step hlat computes from each rank's shards equal torch's own DTensor
ops (shardwise_worker.py, on a 2 x 2 mesh); one process's norm is torch's, bit for bit."""

import torch

from hlat.parallel.grad_norm import total_norm
from runs import Scenario, ScenarioResults

SCENARIOS = [Scenario("shardwise-2x2", "parallel/shardwise_worker.py:compare", 4)]


def test_the_norm_from_shards_is_the_whole_tensors_norm(scenarios: ScenarioResults):
    got = scenarios.json("shardwise-2x2", "results.json")
    # fp32 sums in another order than torch's: a few ulps of the fp64 norm of the whole tensors
    assert abs(got["ours"] - got["whole"]) <= 4e-7 * got["whole"], got
    assert abs(got["ours_dtensors"] - got["torch"]) <= 4e-7 * got["torch"], got
    assert got["ours_dtype"] == "torch.float32"
    assert "partial" in got["refused"]


def test_shardwise_adamw_equals_torch_adamw_on_dtensors(scenarios: ScenarioResults):
    """Same kernel on the same shards: equal to the bit, a partial gradient summed as torch's
    dispatch sums it, and the state still DTensors (checkpoints unchanged)."""
    runs = scenarios.json("shardwise-2x2", "results.json")["adamw"]
    assert runs["shardwise"] == runs["torch"]
    assert runs["shardwise"]["state_types"] == ["DTensor"]


def test_one_process_norm_is_torchs_bit_for_bit():
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        tensors = [torch.randn(shape, generator=gen).to(dtype) for shape in ((64, 32), (7,), (3, 3, 3))]
        ours, theirs = total_norm(tensors), torch.nn.utils.get_total_norm(tensors, foreach=True)
        assert ours.dtype == theirs.dtype and torch.equal(ours, theirs)
