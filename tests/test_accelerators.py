"""The accelerator table: exact names, memory-picked variants, unknown devices, the planner's view."""

import pytest
import torch

from hlat.accelerators import ACCELERATORS, GIB, NEURON_CHIPS, by_table_name, identify
from hlat.errors import UserError

# (name torch.cuda.get_device_name reports, total memory GiB, the row it must select)
REPORTED = [
    ("NVIDIA H100 80GB HBM3", 79.6, "H100 SXM"),
    ("NVIDIA H100 PCIe", 79.6, "H100 PCIe"),
    ("NVIDIA H100 NVL", 93.6, "H100 NVL"),
    ("NVIDIA H200", 140.4, "H200"),
    ("NVIDIA H200 NVL", 140.4, "H200 NVL"),
    ("NVIDIA GH200 480GB", 94.5, "GH200"),
    ("NVIDIA GH200 480GB", 142.0, "GH200 144GB"),
    ("NVIDIA H800", 79.6, "H800"),
    ("NVIDIA H800 PCIe", 79.6, "H800 PCIe"),
    ("NVIDIA H20", 95.0, "H20"),
    ("NVIDIA A100-SXM4-40GB", 39.4, "A100 SXM 40GB"),
    ("NVIDIA A100-SXM4-80GB", 79.2, "A100 SXM 80GB"),
    ("NVIDIA A100-PCIE-40GB", 39.4, "A100 PCIe 40GB"),
    ("NVIDIA A100 80GB PCIe", 79.2, "A100 PCIe 80GB"),
    ("NVIDIA L4", 22.5, "L4"),
    ("NVIDIA L40", 45.0, "L40"),
    ("NVIDIA L40S", 45.0, "L40S"),
    ("NVIDIA B200", 179.0, "B200"),
    ("NVIDIA GB200", 184.0, "GB200"),
    ("AMD Instinct MI300X", 192.0, "MI300X"),
    ("AMD Instinct MI300X VF", 192.0, "MI300X"),
]


@pytest.mark.parametrize("reported, gib, row", REPORTED)
def test_each_reported_name_selects_its_row(reported, gib, row):
    assert identify(reported, int(gib * GIB)).name == row


def test_near_names_are_not_confused():
    """Today's substring matching read an L40 as an L4 and every H100 as the SXM part."""
    l4, l40 = identify("NVIDIA L4", 24 * GIB), identify("NVIDIA L40", 48 * GIB)
    assert (l4.bf16_tflops, l40.bf16_tflops) == (121.0, 181.0)
    assert identify("NVIDIA H100 PCIe", 80 * GIB).bf16_tflops < identify("NVIDIA H100 80GB HBM3", 80 * GIB).bf16_tflops
    assert identify("NVIDIA A100-SXM4-40GB", 40 * GIB).memory_gib == 40
    assert identify("NVIDIA A100-SXM4-80GB", 80 * GIB).memory_gib == 80


@pytest.mark.parametrize("reported", ["NVIDIA GeForce RTX 4090", "NVIDIA H100", "H100 SXM", "NVIDIA L", ""])
def test_unknown_names_match_nothing(reported):
    assert identify(reported, 80 * GIB) is None


def test_table_is_consistent():
    names = [a.name.lower() for a in ACCELERATORS]
    assert len(names) == len(set(names))
    for a in ACCELERATORS:
        assert a.bf16_tflops >= a.tf32_tflops >= a.fp32_tflops > 0 and a.memory_gib > 0 and a.bandwidth_tbs > 0, a
        assert a.peak_tflops(torch.bfloat16, tf32=False) == a.bf16_tflops
        assert a.peak_tflops(torch.float32, tf32=True) == a.tf32_tflops
        assert a.peak_tflops(torch.float32, tf32=False) == a.fp32_tflops
    assert len({n.lower() for a in ACCELERATORS for n in (a.name, *a.aliases)}) == len(names) + sum(
        len(a.aliases) for a in ACCELERATORS
    )  # no alias shadows another row


@pytest.mark.parametrize("chip", NEURON_CHIPS, ids=lambda c: c.name)
def test_trainium_rows_are_the_chip_over_its_ranks(chip):
    """One row per rank as Neuron runs it: a NeuronCore, or a logical NeuronCore of LNC cores."""
    for lnc in chip.lncs:
        row = by_table_name(f"{chip.name} LNC={lnc}")
        ranks = chip.cores // lnc
        assert (row.bf16_tflops, row.tf32_tflops, row.fp32_tflops) == (
            chip.bf16_tflops / ranks,
            chip.bf16_tflops / ranks,
            chip.fp32_tflops / ranks,
        )
        assert (row.memory_gib, row.bandwidth_tbs) == (chip.memory_gib / ranks, chip.bandwidth_tbs / ranks)
        assert (row.per_node, row.intra_gbs, row.inter_gbs) == (
            chip.per_node * ranks,
            chip.link_gbs / ranks,
            chip.network_gbs / ranks,
        )
        assert row.calibration_group == "trainium" and chip.source in row.source and chip.node_source == row.node_source
    assert by_table_name(chip.name) == by_table_name(f"{chip.name} LNC={chip.lncs[0]}")  # the default LNC


def test_trainium_names_resolve_to_the_rank_neuron_runs():
    trn1, trn2, trn2_core, trn3 = (by_table_name(n) for n in ("trn1", "trn2", "trn2 LNC=1", "TRN3"))
    assert (trn1.name, trn1.bf16_tflops, trn1.memory_gib, trn1.per_node) == ("trn1 NeuronCore-v2", 95.0, 16, 32)
    assert (trn2.name, trn2.memory_gib, trn2.per_node) == ("trn2 LNC=2", 24, 64)  # 64 ranks a trn2.48xlarge
    assert trn2.rank == "1 logical NeuronCore (2 x NeuronCore-v3, 24 GiB; 4 per chip)"
    assert (trn2_core.name, trn2_core.memory_gib) == ("trn2 NeuronCore-v3", 12)
    assert trn2.bf16_tflops == 2 * trn2_core.bf16_tflops and trn2.intra_gbs == 2 * trn2_core.intra_gbs
    assert (trn3.name, trn3.bf16_tflops, trn3.memory_gib) == ("trn3 LNC=2", 671 / 4, 36)


def test_table_names_are_looked_up_case_insensitively_and_typos_list_the_names():
    assert by_table_name("h100 sxm").name == "H100 SXM"
    with pytest.raises(UserError, match="unknown device 'H100'.*'H100 SXM'.*'MI300X'"):
        by_table_name("H100")


def test_plan_shows_the_device_memory_and_whether_it_fits(capsys):
    from hlat.cli import main
    from hlat.planning.memory import StagePlan, format_fit

    stages = [
        StagePlan(0, range(0, 2), 0, 10 * GIB, 2 * GIB, 4 * GIB, 2 * GIB),
        StagePlan(1, range(2, 4), 0, 1, 1, 1, 1),
    ]
    assert format_fit(stages, by_table_name("L4")) == (
        "on L4 (24 GiB): the largest stage needs 18.00 GiB per rank (75% of the device): fits"
    )
    assert format_fit(stages, by_table_name("trn2 NeuronCore-v3")).endswith("(150% of the device): does NOT fit")
    assert main(["plan", "--world", "1", "--device", "H100 SXM"]) == 0  # the tiny preset
    lines = capsys.readouterr().out.splitlines()
    fit = [i for i, line in enumerate(lines) if line.startswith("on H100 SXM (80 GiB): the largest stage needs 0.")]
    # then the predicted step, tokens/s and days (tests/parallel/test_throughput.py), before the speed switches
    assert fit and any(line.endswith(" days") for line in lines[fit[0] + 1 :]), lines
    assert main(["plan", "--device", "list"]) == 0
    assert "L40S" in capsys.readouterr().out


def test_an_unknown_device_suggests_the_rows_it_begins_or_the_closest():
    with pytest.raises(
        UserError, match=r"unknown device 'H100'; did you mean 'H100 SXM' or 'H100 PCIe' or 'H100 NVL'\?"
    ):
        by_table_name("H100")
    with pytest.raises(UserError, match=r"unknown device 'h100sxm'; did you mean 'H100 SXM'\?"):
        by_table_name("h100sxm")
