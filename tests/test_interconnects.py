"""Nominal link bandwidths read from an environment capture (bench/analysis/interconnects.py)."""

from __future__ import annotations

import pytest

from bench.analysis import interconnects

TOPO_NV = """\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity
GPU0\t X \tNV4\tNV2\t0-19\t0
GPU1\tNV4\t X \tNV4\t0-19\t0
GPU2\tNV2\tNV4\t X \t0-19\t0

Legend:
  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks"""

TOPO_PCIE = """\tGPU0\tGPU1\tCPU Affinity
GPU0\t X \tSYS\t0-7
GPU1\tSYS\t X \t8-15"""


def gpu(name: str, gen: int = 3, width: int = 16) -> dict:
    return {"name": name, "pcie_max_gen": gen, "pcie_max_width": width}


def test_topology_cells_skip_diagonal_and_affinity_columns() -> None:
    assert interconnects.topology_cells(TOPO_NV) == ["NV4", "NV2", "NV4", "NV4", "NV2", "NV4"]


def test_nvlink_box_takes_its_slowest_pair() -> None:
    env = {"gpus": [gpu("Tesla V100-SXM2-16GB")] * 3,
           "gpu_topology": {"nvidia_smi_topo_m": TOPO_NV}}
    link = interconnects.nominal_link(env)
    assert link["link"] == "NVLink x2 (V100)"
    assert link["nominal_gbps"] == 50.0


def test_pcie_box_takes_the_narrowest_link_and_says_it_crosses_the_cpu() -> None:
    env = {"gpus": [gpu("Tesla P100", 3, 16), gpu("Tesla P100", 3, 8)],
           "gpu_topology": {"nvidia_smi_topo_m": TOPO_PCIE}}
    link = interconnects.nominal_link(env)
    assert link["link"] == "PCIe 3.0 x8"
    assert link["nominal_gbps"] == pytest.approx(0.985 * 8)
    assert "SYS" in link["how"]


def test_no_gpu_gives_no_figure() -> None:
    assert interconnects.nominal_link({"gpus": []})["nominal_gbps"] is None


def test_unknown_interconnect_names_the_allowed_ones() -> None:
    with pytest.raises(KeyError, match="nvlink-h100"):
        interconnects.get("nvlink-9000")
