"""The deterministic mode's trees: an elastic step's groups, however many are present, hold whole
subtrees whose sums meet in the same root, bit for bit (hlat.parallel.ordered_sum)."""

import pytest
import torch

from hlat.parallel.ordered_sum import PairwiseSum, sum_blocks, tree_blocks, tree_sum


@pytest.mark.parametrize("leaves", [1, 2, 4, 8, 16])
def test_blocks_are_consecutive_whole_subtrees(leaves):
    for parts in range(1, leaves + 1):
        blocks = tree_blocks(leaves, parts)
        assert len(blocks) == parts and [i for b in blocks for i in b] == list(range(leaves))
        for block in blocks:  # a subtree: a power of two of leaves, starting at a multiple of its size
            assert len(block) & (len(block) - 1) == 0 and block.start % len(block) == 0, (parts, blocks)
        assert max(map(len, blocks)) <= 2 * min(map(len, blocks))  # dealt as evenly as subtrees allow


def test_three_groups_of_eight():
    assert tree_blocks(8, 3) == [range(0, 2), range(2, 4), range(4, 8)]


def test_any_number_of_groups_gives_the_bits_of_one_process():
    """Values spanning 40 binary orders, whose sum depends on the order of its additions."""
    leaves = 16
    values = [
        torch.randn(257, generator=torch.Generator().manual_seed(i)) * 2.0 ** (i * 5 % 40 - 20) for i in range(leaves)
    ]
    one_process = tree_sum(values)
    assert not torch.equal(one_process, sum(values))  # the order matters for these values
    for parts in range(1, leaves + 1):
        blocks = tree_blocks(leaves, parts)
        sums = []
        for block in blocks:
            group = PairwiseSum()
            for i in block:
                group.add([values[i]])
            (total,) = group.total()
            sums.append(total)
        assert torch.equal(sum_blocks(sums, blocks), one_process), parts
