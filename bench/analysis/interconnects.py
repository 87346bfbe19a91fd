"""Interconnects' nominal bandwidths, and the link a GPU box's topology capture names.

A figure here is the vendor's nominal one-direction bandwidth per GPU (what a ring all-reduce's
bus bandwidth can at most reach: nccl-tests' busbw is comparable to it), never a measurement;
the probe (mode: allreduce) measures what a box really gets. Latency is a per-message figure
of the right order for the link kind, for the predictor's latency term (bench/analysis/predict.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Interconnect:
    name: str
    description: str
    busbw_gbps: float  # nominal, one direction, per GPU (1e9 bytes/s)
    latency_s: float  # one message's latency, order of magnitude
    source: str


# GB/s: PCIe 3.0 8 GT/s x 128b/130b = 0.985 GB/s per lane and direction, 4.0 twice, 5.0 four
# times; NVLink 1 (P100) 20 GB/s per link and direction, NVLink 2 (V100), 3 (A100), 4 (H100)
# 25 GB/s per link and direction.
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
NVLINK_LINK_GBPS = {"P100": 20.0, "V100": 25.0, "A100": 25.0, "H100": 25.0, "H200": 25.0,
                    "H800": 25.0, "B200": 50.0}

INTERCONNECTS: dict[str, Interconnect] = {i.name: i for i in [
    Interconnect("pcie3", "PCIe 3.0 x16", 15.75, 10e-6, "PCI-SIG: 8 GT/s, 128b/130b, 16 lanes"),
    Interconnect("pcie4", "PCIe 4.0 x16", 31.5, 10e-6, "PCI-SIG: 16 GT/s, 128b/130b, 16 lanes"),
    Interconnect("pcie5", "PCIe 5.0 x16", 63.0, 10e-6, "PCI-SIG: 32 GT/s, 128b/130b, 16 lanes"),
    Interconnect("nvlink-p100", "NVLink 1, 4 links (DGX-1 P100 hybrid cube-mesh)", 80.0, 5e-6,
                 "NVIDIA Tesla P100 whitepaper: 4 links x 20 GB/s per direction"),
    Interconnect("nvlink-v100", "NVLink 2, 6 links (DGX-1V / DGX-2 V100)", 150.0, 5e-6,
                 "NVIDIA Tesla V100 whitepaper: 6 links x 25 GB/s per direction"),
    Interconnect("nvlink-a100", "NVLink 3, 12 links (DGX A100 via NVSwitch)", 300.0, 5e-6,
                 "NVIDIA A100 whitepaper: 12 links x 25 GB/s per direction"),
    Interconnect("nvlink-h100", "NVLink 4, 18 links (DGX H100 via NVSwitch)", 450.0, 5e-6,
                 "NVIDIA H100 whitepaper: 18 links x 25 GB/s per direction"),
    Interconnect("ethernet-10g", "10 Gbit/s Ethernet", 1.25, 30e-6, "IEEE 802.3: 10 Gbit/s"),
    Interconnect("ethernet-25g", "25 Gbit/s Ethernet / RoCE", 3.125, 20e-6,
                 "IEEE 802.3by: 25 Gbit/s"),
    Interconnect("ethernet-50g", "50 Gbit/s Ethernet", 6.25, 20e-6, "IEEE 802.3cd: 50 Gbit/s"),
    Interconnect("ethernet-100g", "100 Gbit/s Ethernet / RoCE", 12.5, 10e-6,
                 "IEEE 802.3ba: 100 Gbit/s"),
    Interconnect("ib-edr", "InfiniBand EDR (100 Gbit/s)", 12.5, 2e-6, "InfiniBand Trade Assn."),
    Interconnect("ib-hdr", "InfiniBand HDR (200 Gbit/s)", 25.0, 2e-6, "InfiniBand Trade Assn."),
    Interconnect("ib-ndr", "InfiniBand NDR (400 Gbit/s)", 50.0, 2e-6, "InfiniBand Trade Assn."),
]}


# Any PCIe link by generation and width: pcie3-x1 (a mining rig's riser), pcie4-x8 ...
PCIE_NAME = re.compile(r"pcie([1-6])-x(1|2|4|8|16)")
PCIE_PATTERN = "pcie<gen>-x<width> (gen 1-6, width 1, 2, 4, 8 or 16)"


def names() -> list[str]:
    """The named interconnects, then the pattern any PCIe link's name follows."""
    return [*INTERCONNECTS, PCIE_PATTERN]


def pcie(gen: int, width: int) -> Interconnect:
    """A PCIe link of that generation and width: the per-lane figure x the width, the
    latency of the x16 entries."""
    return Interconnect(f"pcie{gen}-x{width}", f"PCIe {gen}.0 x{width}",
                        PCIE_LANE_GBPS[gen] * width, INTERCONNECTS["pcie3"].latency_s,
                        f"PCI-SIG: {PCIE_LANE_GBPS[gen]:g} GB/s per lane and direction, "
                        f"{width} lane{'s' if width > 1 else ''}")


def get(name: str) -> Interconnect:
    """The interconnect of that name, or a PCIe link named by PCIE_PATTERN; KeyError whose
    message lists the names allowed."""
    if name in INTERCONNECTS:
        return INTERCONNECTS[name]
    match = PCIE_NAME.fullmatch(name)
    if match:
        return pcie(int(match[1]), int(match[2]))
    raise KeyError(f"unknown interconnect {name!r}; allowed: {', '.join(names())}")


def _generation(gpu_name: str) -> str | None:
    return next((g for g in NVLINK_LINK_GBPS if g in gpu_name.upper()), None)


def topology_cells(topo: str) -> list[str]:
    """The GPU-to-GPU cells of `nvidia-smi topo -m`'s matrix (X on the diagonal left out):
    NV<k> (k bonded NVLinks), PIX, PXB, PHB, NODE or SYS."""
    lines = [ln for ln in topo.splitlines() if ln.strip()]
    if not lines:
        return []
    header = lines[0].split()
    gpus = [h for h in header if re.fullmatch(r"GPU\d+", h)]
    cells = []
    for line in lines[1:]:
        parts = line.split()
        if not parts or not re.fullmatch(r"GPU\d+", parts[0]):
            continue
        cells += [c for c in parts[1:1 + len(gpus)] if c != "X"]
    return cells


def nominal_link(environment: dict[str, Any]) -> dict[str, Any]:
    """The slowest GPU-to-GPU link of the box an environment capture (environment.json)
    describes, and its nominal bandwidth: NVLink when every GPU pair is NV<k> (k links at the
    generation's per-link figure), else the GPUs' PCIe link (generation and width from NVML,
    at their maximum: a link idles slower). {"link", "nominal_gbps", "how"}; nominal_gbps None
    where the capture cannot tell (no GPU, no nvidia-smi)."""
    gpus = environment.get("gpus") or []
    topo = (environment.get("gpu_topology") or {}).get("nvidia_smi_topo_m")
    if not gpus:
        return {"link": None, "nominal_gbps": None, "how": "no GPU in the environment capture"}
    cells = topology_cells(topo) if topo else []
    gen = _generation(str(gpus[0].get("name", "")))
    nv = [int(c[2:]) for c in cells if re.fullmatch(r"NV\d+", c)]
    if cells and len(nv) == len(cells) and gen:
        k = min(nv)
        return {"link": f"NVLink x{k} ({gen})", "nominal_gbps": k * NVLINK_LINK_GBPS[gen],
                "how": f"nvidia-smi topo -m: every GPU pair NV{k} or more; "
                       f"{NVLINK_LINK_GBPS[gen]:g} GB/s per link and direction"}
    pcie = [(g.get("pcie_max_gen"), g.get("pcie_max_width")) for g in gpus]
    known = [(gen_, w) for gen_, w in pcie if gen_ in PCIE_LANE_GBPS and w]
    if not known:
        return {"link": None, "nominal_gbps": None,
                "how": "NVML gave no PCIe generation or width" + ("" if topo else
                       "; no nvidia-smi topo -m")}
    gen_, width = min(known, key=lambda gw: PCIE_LANE_GBPS[gw[0]] * gw[1])
    crossing = sorted({c for c in cells if c in ("SYS", "NODE", "PHB")})
    return {"link": f"PCIe {gen_}.0 x{width}", "nominal_gbps": PCIE_LANE_GBPS[gen_] * width,
            "how": "NVML PCIe link (max generation and width); " + (
                f"pairs cross {'/'.join(crossing)} (through a CPU), slower in practice"
                if crossing else "no NVLink between every pair")}
