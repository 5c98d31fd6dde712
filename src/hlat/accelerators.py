"""The accelerators hlat knows: data-sheet peaks and memory, for MFU (trainer) and fits (planner).

One row per accelerator, matched on the exact name its device module reports
(hlat.device.runtime.device_name), never on a substring: "NVIDIA L40" is not an L4, "NVIDIA H100 PCIe" is not the SXM part. Where
one name covers several memory sizes, the device's total memory picks the row.

Peaks are dense (the data sheets' "with sparsity" figures halved), per rank: one GPU, or on
Trainium one logical NeuronCore, what Neuron runs one process on (docs/trainium.md). A Trainium
row is its chip's figures (NEURON_CHIPS) divided over the chip's ranks: 2 NeuronCore-v2 on trn1
(logical NeuronCore size 1 only); on trn2 and trn3 8 NeuronCores, 4 ranks of two at the default
LNC=2 ("trn2 LNC=2", also named "trn2") or 8 at LNC=1 ("trn2 NeuronCore-v3", "trn2 LNC=1").
`fp32` is the non-tensor-core FP32 rate (what torch's default float32 matmul precision "highest"
runs at); `tf32` the tensor-core rate used when torch.set_float32_matmul_precision("high"/"medium")
allows it. Memory is the data sheet's capacity; HBM and GDDR are sized in binary units, so "80 GB"
is 80 GiB, of which the driver keeps a few hundred MiB.

For the throughput planner (hlat.planning.throughput) the rows of the parts one rents by the node
also carry the node: ranks per node, and per rank the one-way intra-node link bandwidth (NVLink,
half the data sheets' bidirectional figure) and its share of the node's network (the instance's
EFA bandwidth over its ranks), in GB/s; a Trainium chip's links are shared by its ranks.
0 = not published in the sources read.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import torch

from hlat.errors import UserError

GIB = 1024**3


@dataclass(frozen=True)
class Accelerator:
    name: str  # the table's name: what `hlat plan --device` takes
    reported: tuple[str, ...]  # exact reported names (Trainium: none known yet)
    bf16_tflops: float  # dense tensor-core peak
    tf32_tflops: float
    fp32_tflops: float
    memory_gib: float
    bandwidth_tbs: float  # memory bandwidth, TB/s
    source: str
    min_memory_gib: float = 0.0  # where names are shared: the smallest total memory of this row
    per_node: int = 0  # ranks per node (0: no node figures)
    intra_gbs: float = 0.0  # one-way intra-node bandwidth per rank, GB/s (0: unknown)
    inter_gbs: float = 0.0  # the rank's share of the node's network, one way, GB/s
    node_source: str = ""
    rank: str = ""  # what one rank drives where it is part of a chip: "1 NeuronCore-v2 (16 GiB; 2 per chip)"
    aliases: tuple[str, ...] = ()  # other names `hlat plan --device` takes for this row

    @property
    def calibration_group(self) -> str:
        """The calibration group (hlat.planning.calibration): one efficiency constant each."""
        return "trainium" if self.name.startswith("trn") else "gpu"

    def peak_tflops(self, dtype: torch.dtype, tf32: bool) -> float:
        """The dense peak for matmuls in `dtype`; `tf32`: float32 matmuls may use TF32 tensor cores."""
        if dtype in (torch.bfloat16, torch.float16):
            return self.bf16_tflops
        return self.tf32_tflops if tf32 else self.fp32_tflops


_H100 = "NVIDIA H100 Tensor Core GPU data sheet"
_A100 = "NVIDIA A100 Tensor Core GPU data sheet (SXM and PCIe share the compute figures)"
# Node figures: NVLink per GPU from the data sheets (bidirectional, halved: H100/H200 900 GB/s,
# A100 600 GB/s, B200 1.8 TB/s); networks from the AWS EC2 instance pages (Gbps / 8 / chips).
_P5 = dict(
    per_node=8, intra_gbs=450.0, inter_gbs=50.0, node_source="p5.48xlarge: 8 GPUs, NVLink 900 GB/s each, 3,200 Gbps EFA"
)
_P5EN = dict(
    per_node=8,
    intra_gbs=450.0,
    inter_gbs=50.0,
    node_source="p5en.48xlarge: 8 GPUs, NVLink 900 GB/s each, 3,200 Gbps EFA",
)
_P4D = dict(
    per_node=8,
    intra_gbs=300.0,
    inter_gbs=6.25,
    node_source="p4d.24xlarge (40 GB) / p4de.24xlarge (80 GB): 8 GPUs, NVLink 600 GB/s each, 400 Gbps EFA",
)
_P6 = dict(
    per_node=8,
    intra_gbs=900.0,
    inter_gbs=50.0,
    node_source="p6-b200.48xlarge: 8 GPUs, NVLink 1.8 TB/s each, 3,200 Gbps EFA",
)
_GPUS = (
    Accelerator(
        "H100 SXM",
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM5 80GB"),
        989.4,
        494.7,
        66.9,
        80,
        3.35,
        f"{_H100}, SXM5",
        **_P5,
    ),
    Accelerator("H100 PCIe", ("NVIDIA H100 PCIe",), 756.5, 378.0, 51.2, 80, 2.0, f"{_H100}, PCIe"),
    Accelerator("H100 NVL", ("NVIDIA H100 NVL",), 835.5, 417.5, 60.0, 94, 3.9, f"{_H100}, H100 NVL (per GPU)"),
    Accelerator(
        "H200", ("NVIDIA H200",), 989.4, 494.7, 66.9, 141, 4.8, "NVIDIA H200 Tensor Core GPU data sheet, SXM", **_P5EN
    ),
    Accelerator(
        "H200 NVL", ("NVIDIA H200 NVL",), 835.5, 417.5, 60.0, 141, 4.8, "NVIDIA H200 Tensor Core GPU data sheet, NVL"
    ),
    Accelerator(
        "GH200",
        ("NVIDIA GH200 480GB", "NVIDIA GH200 144G HBM3e"),
        989.4,
        494.7,
        66.9,
        96,
        4.0,
        "NVIDIA GH200 Grace Hopper Superchip data sheet, the Hopper GPU (96 GB HBM3; 144 GB HBM3e parts: next row)",
    ),
    Accelerator(
        "GH200 144GB",
        ("NVIDIA GH200 480GB", "NVIDIA GH200 144G HBM3e"),
        989.4,
        494.7,
        66.9,
        144,
        4.9,
        "NVIDIA GH200 Grace Hopper Superchip data sheet, HBM3e GPU",
        min_memory_gib=120,
    ),
    Accelerator(
        "H800", ("NVIDIA H800",), 989.4, 494.7, 66.9, 80, 3.35, "NVIDIA H800 data sheet, SXM5 (H100 SXM compute)"
    ),
    Accelerator(
        "H800 PCIe",
        ("NVIDIA H800 PCIe",),
        756.5,
        378.0,
        51.2,
        80,
        2.0,
        "NVIDIA H800 data sheet, PCIe (H100 PCIe compute)",
    ),
    Accelerator("H20", ("NVIDIA H20",), 148.0, 74.0, 44.0, 96, 4.0, "NVIDIA HGX H20 data sheet"),
    Accelerator("A100 SXM 40GB", ("NVIDIA A100-SXM4-40GB",), 312.0, 156.0, 19.5, 40, 1.555, _A100, **_P4D),
    Accelerator("A100 SXM 80GB", ("NVIDIA A100-SXM4-80GB",), 312.0, 156.0, 19.5, 80, 2.039, _A100, **_P4D),
    Accelerator("A100 PCIe 40GB", ("NVIDIA A100-PCIE-40GB",), 312.0, 156.0, 19.5, 40, 1.555, _A100),
    Accelerator("A100 PCIe 80GB", ("NVIDIA A100 80GB PCIe",), 312.0, 156.0, 19.5, 80, 1.935, _A100),
    Accelerator("L4", ("NVIDIA L4",), 121.0, 60.0, 30.3, 24, 0.3, "NVIDIA L4 Tensor Core GPU data sheet"),
    Accelerator("L40", ("NVIDIA L40",), 181.0, 90.5, 90.5, 48, 0.864, "NVIDIA L40 GPU data sheet"),
    Accelerator("L40S", ("NVIDIA L40S",), 362.1, 183.0, 91.6, 48, 0.864, "NVIDIA L40S GPU data sheet"),
    Accelerator(
        "B200",
        ("NVIDIA B200",),
        2250.0,
        1100.0,
        75.0,
        180,
        8.0,
        "NVIDIA HGX B200 data sheet (8-GPU figures / 8)",
        **_P6,
    ),
    Accelerator(
        "GB200",
        ("NVIDIA GB200",),
        2500.0,
        1250.0,
        80.0,
        186,
        8.0,
        "NVIDIA GB200 NVL72 data sheet (72-GPU figures / 72)",
    ),
    Accelerator(
        "MI300X",
        ("AMD Instinct MI300X", "AMD Instinct MI300X VF"),
        1307.4,
        653.7,
        163.4,
        192,
        5.3,
        "AMD Instinct MI300X data sheet",
    ),
)


@dataclass(frozen=True)
class NeuronChip:
    """A Trainium chip as its data sheet gives it; the table's rows are its ranks (neuron_rank)."""

    name: str  # trn1, trn2, trn3: what `hlat plan --device` takes for the default rank
    core: str  # the physical NeuronCore
    cores: int  # physical NeuronCores per chip
    bf16_tflops: float  # dense BF16/FP16/TF32
    fp32_tflops: float
    memory_gib: float
    bandwidth_tbs: float
    lncs: tuple[int, ...]  # logical NeuronCore sizes Neuron supports, its default first
    source: str
    lnc_source: str  # the LNC sizes' source
    per_node: int  # chips per node
    link_gbs: float  # one-way NeuronLink per chip, GB/s
    network_gbs: float  # the chip's share of the node's EFA, one way, GB/s
    node_source: str


# The Neuron docs' pages (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/): chips at
# general/arch/neuron-hardware/trainium.html and trainium2.html, about-neuron/arch/neuron-hardware/
# trainium3.html; nodes at general/arch/neuron-hardware/trn1-arch.html, about-neuron/arch/
# neuron-hardware/trn3-arch.html and the AWS EC2 Trn2 page; LNC at general/arch/neuron-features/
# logical-neuroncore-config.html. NeuronLink per chip as the docs give it, whether one way or both
# not said: halved, as NVLink's 900 GB/s (both ways) gives 450 one way. Networks: EFA Gbps / 8 / chips.
_LNC = "Neuron docs, Logical NeuronCore configuration"
NEURON_CHIPS = (
    NeuronChip(
        "trn1",
        "NeuronCore-v2",
        2,
        190.0,
        47.5,
        32,
        0.82,
        (1,),
        "AWS Neuron docs, Trainium architecture: 2 NeuronCore-v2, 190 BF16/TF32 TFLOP/s, 47.5 FP32, 32 GiB, 820 GB/s",
        "the only size on trn1: Neuron docs, compiler error NCC_EARG001",
        per_node=16,
        link_gbs=206.0,
        network_gbs=6.25,
        node_source="trn1.32xlarge: 16 chips, NeuronLink-v2 384 GiB/s per chip, 800 Gbps EFA (Neuron docs, trn1 "
        "architecture)",
    ),
    NeuronChip(
        "trn2",
        "NeuronCore-v3",
        8,
        667.0,
        181.0,
        96,
        2.9,
        (2, 1),
        "AWS Neuron docs, Trainium2 architecture: 8 NeuronCore-v3, 667 dense BF16/TF32 TFLOP/s, 181 FP32, 96 GiB, "
        "2.9 TB/s",
        f"default 2, two cores sharing a 24 GiB HBM bank: {_LNC}",
        per_node=16,
        link_gbs=640.0,
        network_gbs=25.0,
        node_source="trn2.48xlarge: 16 chips, NeuronLink-v3 1.28 TB/s per chip (Neuron docs, Trainium2 architecture), "
        "3.2 Tbps EFAv3 (AWS EC2 Trn2 page)",
    ),
    NeuronChip(
        "trn3",
        "NeuronCore-v4",
        8,
        671.0,
        183.0,
        144,
        4.9,
        (2, 1),
        "AWS Neuron docs, Trainium3 architecture: 8 NeuronCore-v4, 671 dense BF16/TF32 TFLOP/s, 183 FP32, 144 GiB, "
        "4.9 TB/s (the NKI architecture guide: 4.7)",
        f"1 or 2 as on Trn2; Trn3's default is not published, planned as Trn2's 2: {_LNC}",
        per_node=64,
        link_gbs=1099.5,
        network_gbs=25.0,
        node_source="Trn3 Gen1 UltraServer: 64 chips (4 servers of 16), NeuronLink-v4 2,048 GiB/s per chip (the "
        "Trainium3 page: 2.56 TB/s), 12,800 Gbps EFA (Neuron docs, Trn3 architecture; the Gen2 UltraServer: 144 "
        "chips, 36 servers of 4, 28,800 Gbps)",
    ),
)


def neuron_rank(chip: NeuronChip, lnc: int) -> Accelerator:
    """One rank of `chip` at logical NeuronCore size `lnc`, as Neuron runs training: one process per
    logical NeuronCore, each with the chip's figures over the ranks it holds."""
    ranks = chip.cores // lnc  # per chip
    memory = chip.memory_gib / ranks
    if lnc == 1:
        name, rank = f"{chip.name} {chip.core}", f"1 {chip.core} ({memory:g} GiB; {ranks} per chip)"
    else:
        name = f"{chip.name} LNC={lnc}"
        rank = f"1 logical NeuronCore ({lnc} x {chip.core}, {memory:g} GiB; {ranks} per chip)"
    aliases = ((chip.name,) if lnc == chip.lncs[0] else ()) + ((f"{chip.name} LNC=1",) if lnc == 1 else ())
    return Accelerator(
        name,
        (),
        chip.bf16_tflops / ranks,
        chip.bf16_tflops / ranks,
        chip.fp32_tflops / ranks,
        memory,
        chip.bandwidth_tbs / ranks,
        f"{chip.source}; {ranks} ranks a chip at LNC={lnc} ({chip.lnc_source})",
        per_node=chip.per_node * ranks,
        intra_gbs=chip.link_gbs / ranks,
        inter_gbs=chip.network_gbs / ranks,
        node_source=chip.node_source,
        rank=rank,
        aliases=aliases,
    )


ACCELERATORS: tuple[Accelerator, ...] = _GPUS + tuple(
    neuron_rank(chip, lnc) for chip in NEURON_CHIPS for lnc in chip.lncs
)


def identify(reported_name: str, total_memory_bytes: int) -> Accelerator | None:
    """The row whose exact reported name is `reported_name`, picked by total memory where names are
    shared; None for a device the table does not know."""
    rows = [a for a in ACCELERATORS if reported_name.strip() in a.reported]
    fitting = [a for a in rows if total_memory_bytes >= a.min_memory_gib * GIB]
    return max(fitting, key=lambda a: a.min_memory_gib) if fitting else None


def by_table_name(name: str) -> Accelerator:
    """The row named `name` or one of its aliases (case-insensitive), as `hlat plan --device` takes it."""
    wanted = name.strip().lower()
    for accelerator in ACCELERATORS:
        if wanted in (n.lower() for n in (accelerator.name, *accelerator.aliases)):
            return accelerator
    # the rows a name begins (H100: its three forms), else the closest spelling of any name
    spelled = {n.lower(): a.name for a in ACCELERATORS for n in (a.name, *a.aliases)}
    close = [row for n, row in spelled.items() if n.startswith(wanted)] or [
        spelled[n] for n in difflib.get_close_matches(wanted, spelled, n=1)
    ]
    mean = f"; did you mean {' or '.join(repr(row) for row in dict.fromkeys(close))}?" if close else ""
    raise UserError(f"unknown device {name!r}{mean}; pick one of: {', '.join(repr(a.name) for a in ACCELERATORS)}")


def format_table() -> str:
    """The table as `hlat plan --device list` prints it, each row's other names after it."""
    lines = [f"{'device':<20} {'bf16 TFLOP/s':>12} {'tf32':>7} {'fp32':>6} {'memory GiB':>10} {'TB/s':>6}  source"]
    for a in ACCELERATORS:
        lines.append(
            f"{a.name:<20} {a.bf16_tflops:>12,.1f} {a.tf32_tflops:>7,.1f} {a.fp32_tflops:>6.1f} {a.memory_gib:>10g} "
            f"{a.bandwidth_tbs:>6g}  {a.source}"
        )
        if a.rank:
            also = f"; also named {', '.join(repr(n) for n in a.aliases)}" if a.aliases else ""
            lines.append(f"{'':<20} rank = {a.rank}{also}")
    return "\n".join(lines)
