"""hlat plan through the CLI: Trainium planned per rank as Neuron runs it, and what the output says
when a layout does not fit or the search finds a faster one."""

from __future__ import annotations

import re

from hlat.cli import main

# tiny on 4 ranks of a node whose links are slow: tensor parallelism costs more than it saves
SLOW_NODE = ["--world", "4", "--peak-tflops", "100", "--per-node", "4", "--intra-gbs", "1"]


def _plan(capsys, *args: str) -> list[str]:
    assert main(["plan", *args]) == 0
    return capsys.readouterr().out.splitlines()


def test_trn2_plans_a_rank_per_logical_neuroncore(capsys):
    lines = _plan(capsys, "--preset", "hlat-7b", "--world", "256", "--device", "trn2")
    assert "rank = 1 logical NeuronCore (2 x NeuronCore-v3, 24 GiB; 4 per chip)" in lines
    assert any(line.startswith("on trn2 LNC=2 (24 GiB): the largest stage needs ") for line in lines)
    predicted = next(line for line in lines if line.startswith("predicted on "))
    assert predicted.startswith("predicted on 256 x trn2 LNC=2 (4 nodes of 64; trainium efficiency")
    # a rank's peak: the chip's 667 TFLOP/s over its 4 logical NeuronCores, in the MFU
    single = _plan(capsys, "--preset", "hlat-7b", "--world", "256", "--device", "trn2 LNC=1")
    assert "rank = 1 NeuronCore-v3 (12 GiB; 8 per chip)" in single
    assert any(line.startswith("predicted on 256 x trn2 NeuronCore-v3 (2 nodes of 128;") for line in single)


def test_the_70b_on_trn1_does_not_fit_a_neuroncore(capsys):
    """HLAT's 4096 trn1 chips counted as 4096 ranks of 32 GiB let the 70B "fit (52%)"; Neuron runs a
    process per 16 GiB NeuronCore, where it does not."""
    lines = _plan(capsys, "--preset", "hlat-70b", "--world", "8192", "--device", "trn1")
    assert "rank = 1 NeuronCore-v2 (16 GiB; 2 per chip)" in lines
    fit = next(line for line in lines if line.startswith("on trn1 NeuronCore-v2 (16 GiB)"))
    assert fit.endswith("(104% of the device): does NOT fit"), fit
    assert "this layout does NOT fit: add --search to rank the layouts that do" in lines


def test_search_says_when_a_faster_layout_fits_and_its_overrides_give_it(capsys):
    lines = _plan(
        capsys,
        *SLOW_NODE,
        "--memory-gib",
        "80",
        "--parallel.tp",
        "2",
        "--parallel.dp_sharding",
        "zero2",
        "--search",
        "--top",
        "1",
    )
    verdict = re.match(r"a layout (\d+)% faster than the config's fits: (.*): (--.*)$", lines[-1])
    assert verdict, lines[-1]
    best = next(line for line in lines if line.startswith("  1 "))
    assert verdict[2].startswith(best.split()[1] + " ")  # the top row's layout, e.g. "tp 1 x pp 2 x ..."
    top_tokens = best.split()[-3]
    again = _plan(capsys, *SLOW_NODE, "--memory-gib", "80", *verdict[3].split())
    assert any(line.startswith(f"{top_tokens} tokens/s") for line in again), (top_tokens, again)


def test_search_says_when_the_configs_layout_does_not_fit(capsys):
    # tiny's ddp on 4 ranks needs 0.12 GiB a rank; sharded layouts need less
    lines = _plan(capsys, *SLOW_NODE, "--memory-gib", "0.11", "--search", "--top", "1")
    assert any(line.endswith("(111% of the device): does NOT fit") for line in lines)
    assert lines[-1].startswith("the config's layout does NOT fit; the fastest that does is tp "), lines[-1]
    assert "add --search" not in "\n".join(lines)  # it did
