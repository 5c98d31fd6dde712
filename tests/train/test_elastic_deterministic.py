"""The exchange of elastic groups under train.deterministic (hlat.train.elastic.deterministic), its
all-reduce played by hand: three groups present, each holding a whole subtree of four micro-batches.
The processes themselves: tests/train/test_deterministic.py."""

from types import SimpleNamespace

import pytest
import torch

from hlat.parallel.ordered_sum import sum_blocks, tree_blocks
from hlat.train.elastic.deterministic import ElasticDeterministicTrainModule
from hlat.train.replay import WrongComputation

SHARES, GROUPS = 4, 3
BLOCKS = tree_blocks(SHARES, GROUPS)  # [0], [1], [2, 3]


class Replicas:
    """torchft's sum over the groups present: this group's table plus the tables the others send."""

    def __init__(self, others: list[torch.Tensor]):
        self.others = others

    def sum_(self, table: torch.Tensor) -> torch.Tensor:
        for other in self.others:
            table += other  # uint8: each byte has one non-zero writer
        return table

    def failed(self) -> bool:
        return False


class Capture(Replicas):
    """The table a group sends."""

    def __init__(self):
        super().__init__([])
        self.sent: torch.Tensor | None = None

    def sum_(self, table: torch.Tensor) -> torch.Tensor:
        self.sent = table.clone()
        return table


def group_sums(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Group `rank`'s subtree sum of a 2 x 3 weight and of its loss; exact zeros of both signs too."""
    grad = torch.randn(2, 3, generator=torch.Generator().manual_seed(rank)) * 10.0 ** (rank * 3)
    grad[0, 0] = -0.0
    return grad, torch.tensor(0.5 + rank)


def module(rank: int, replicas: Replicas, found: str | None = None) -> tuple[ElasticDeterministicTrainModule, list]:
    grad, loss = group_sums(rank)
    weight = torch.nn.Parameter(torch.zeros(2, 3))
    weight.grad = grad.clone()
    self = ElasticDeterministicTrainModule.__new__(ElasticDeterministicTrainModule)
    self.model = SimpleNamespace(parameters=lambda: [weight])
    self.group = SimpleNamespace(present=GROUPS, rank=rank, data=SimpleNamespace(shares=SHARES), replicas=replicas)
    self.found, self.number = found, 2
    return self, [weight, loss]


def exchange(founds: dict[int, str] = {}) -> list:  # noqa: B006  (read only)
    """Every group's (gradient, loss) after its exchange, or the error it stopped with."""
    sent = []
    for rank in range(GROUPS):
        capture = Capture()
        self, (_, loss) = module(rank, capture, founds.get(rank))
        try:
            self._reduce(loss)
        except WrongComputation:
            pass  # its own finding, seen in its own row: the table was sent before
        sent.append(capture.sent)
    results = []
    for rank in range(GROUPS):
        self, (weight, loss) = module(rank, Replicas([t for r, t in enumerate(sent) if r != rank]), founds.get(rank))
        try:
            results.append((weight.grad, self._reduce(loss)))
        except WrongComputation as err:
            results.append(str(err))
    return results


def test_every_group_gets_the_roots_bits():
    want_grad = sum_blocks([group_sums(r)[0] for r in range(GROUPS)], BLOCKS)
    want_loss = sum_blocks([group_sums(r)[1] for r in range(GROUPS)], BLOCKS)
    first, second, third = (group_sums(r)[0] for r in range(GROUPS))
    assert not torch.equal(want_grad.view(torch.int32), (first + (second + third)).view(torch.int32))  # order shows
    for grad, loss in exchange():
        assert torch.equal(grad.view(torch.int32), want_grad.view(torch.int32))  # -0.0 stays -0.0
        assert torch.equal(loss, want_loss)


def test_a_finding_under_stop_stops_every_group():
    line = "replay: at step 2 ...; computing wrong: data-parallel rank 1 (host h, device cpu:1)"
    finder, *others = (exchange({1: line})[r] for r in (1, 0, 2))
    assert finder.startswith(line) and "every elastic group stops (recovery.wrong_computation stop)" in finder
    for told in others:
        assert "replica rank(s) [1] of this step's quorum found a node computing wrong at step 2" in told


def test_exclude_stops_the_finder_before_its_exchange():
    self, _ = module(1, Capture())
    self.wrong_computation = "exclude"
    with pytest.raises(WrongComputation, match="this group leaves the run"):
        self._computing_wrong("replay: at step 2 ...")
    assert self.found is None
