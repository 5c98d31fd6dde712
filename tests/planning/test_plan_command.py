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


def test_the_paper_presets_fit_trn1_at_the_papers_scale(capsys):
    """HLAT's 4096 trn1 chips are 8192 NeuronCores, a process each: both paper presets plan as
    shipped (the 70B in HLAT's TP 32 x PP 8; the 7B's 1024 data-parallel ranks get 1024 virtual
    shards, chosen and said)."""
    for preset, need in (("hlat-70b", "7.65 GiB per rank (48% of the device)"), ("hlat-7b", "3.95 GiB per rank (25%")):
        lines = _plan(capsys, "--preset", preset, "--world", "8192", "--device", "trn1")
        assert "rank = 1 NeuronCore-v2 (16 GiB; 2 per chip)" in lines
        fit = next(line for line in lines if line.startswith("on trn1 NeuronCore-v2 (16 GiB)"))
        assert need in fit and fit.endswith(": fits"), fit
        assert any(line.startswith("predicted on 8192 x trn1") for line in lines)
    assert "data: 1024 virtual shards (auto for dp 1024; training records them at its first start)" in lines


def test_a_layout_that_does_not_fit_predicts_no_days(capsys):
    """The 70B at TP 8 on NeuronCores of 16 GiB (104%): the plan says so and prints no time or cost."""
    lines = _plan(capsys, "--preset", "hlat-70b-gpu", "--world", "8192", "--device", "trn1")
    fit = next(line for line in lines if line.startswith("on trn1 NeuronCore-v2 (16 GiB)"))
    assert fit.endswith("(104% of the device): does NOT fit"), fit
    assert (
        lines[-1]
        == "this layout does NOT fit, so no time or cost is predicted: add --search to rank the layouts that do"
    )
    assert not any("days" in line or line.startswith("predicted") for line in lines)


def test_the_plan_is_the_layout_training_runs(capsys):
    """On H100 hlat-7b trains tp 1 (parallel.device_layout auto): that is the plan, the preset's beside it."""
    lines = _plan(capsys, "--preset", "hlat-7b", "--world", "64", "--device", "H100 SXM")
    assert lines[0].startswith("layout: tp 1, zero2 over 64 data-parallel ranks instead of the preset's tp 8"), lines[0]
    assert lines[0].endswith("; planned below")
    assert lines[1].startswith("hlat-7b on 64 ranks: pp 1 x dp 64 x tp 1, zero2")


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
