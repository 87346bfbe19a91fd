"""The scaling predictor (bench/analysis/predict.py) against published tables: for every published
point at 2 or more GPUs of TF's DGX-1 (P100) and GCE (K80) ResNet-50 tables and rossumai's
Keras measurements (tf_cnn_benchmarks and kuza55/avolkov1 make_parallel on M60 and GTX 1070
boxes), the efficiency the predictor gives from the same series' 1-GPU figure, beside the
published one, and the bus bandwidth that would reproduce the published point. Prints
markdown (docs/PERFORMANCE.md, "Predicting scaling: validation").

    python -m tools.validate_predictor [--published reference/published.csv]

The inputs, one model for every row (nothing is fitted to a row):

- T_1: the series' 1-GPU images/sec -> its batch / images/sec;
- the gradient bytes: models/resnet50's trainable parameters x 4 (the published ResNet-50 v1
  has the same 25.6 M parameters as our v1.5; only a stride moves);
- scaling: weak where the per-GPU batch stays the series' 1-GPU batch, strong where the
  global batch does (rossumai's Keras rows: a global batch of 32 split over the GPUs);
- the bus bandwidth: the nominal figure (bench/analysis/interconnects.py) of the link the gradients
  cross on that hardware (BOXES): the GPUs' PCIe link to the host where the system reduces on
  the CPU (ps=cpu: TF's DGX-1 and K80 tables ran ResNet-50 with variable_update
  parameter_server and local_parameter_device cpu), else the link between the GPUs;
- the latency, the buckets and the overlap window: bench/analysis/predict.py's, as for a sweep.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.analysis import interconnects
from bench.analysis.predict import Bandwidth, implied_busbw, predict
from bench.analysis.published import PUBLISHED, load_published
from contract.collectives import gradient_bytes

# The published tables validated: their sources' short names in reference/published.csv.
SOURCES = ("TF docs 2017", "rossumai 2017")
TARGET_PP = 5.0  # the target: within 5 percentage points of the published efficiency


@dataclass(frozen=True)
class Box:
    """A published machine: the link between its GPUs, the link from a GPU to the host, and
    what says so."""

    gpu_link: str  # a bench/analysis/interconnects.py name
    host_link: str
    why: str


# Hardware as reference/published.csv names it (a prefix) -> its links, from the sources'
# own descriptions of the machines.
BOXES: dict[str, Box] = {
    "DGX-1 8x P100": Box(
        "nvlink-p100", "pcie3",
        "NVLink hybrid cube-mesh between the GPUs; each GPU on PCIe 3.0 x16 to the host (two "
        "GPUs per PCIe switch)"),
    "GCE 8x K80": Box(
        "pcie3", "pcie3",
        "K80 boards on PCIe 3.0 x16 (two GPUs per board behind its own PCIe switch), no "
        "NVLink"),
    "az-2x-m60": Box(
        "pcie3", "pcie3",
        "Azure NV12: two Tesla M60 GPUs on PCIe 3.0 x16 boards, across the CPU sockets (SOC), "
        "no peer-to-peer (rossumai's hardware notes measured ~6 GB/s host<->device)"),
    "7gforce": Box(
        "pcie3-x1", "pcie3-x1",
        "the six GTX 1070s sit on PCIe x1 risers (rossumai's hardware notes: ~0.75 GB/s "
        "measured host<->device and peer-to-peer), so every GPU's link is PCIe 3.0 x1"),
}


def box_of(hardware: str) -> Box | None:
    return next((b for name, b in BOXES.items() if hardware.startswith(name)), None)


def reduces_on_host(row: dict[str, Any]) -> bool:
    """Whether a published row's system sums the gradients in host memory (a parameter server
    on the CPU): its system says ps=cpu, or it is from TF's 2017 tables, whose page says every
    ResNet-50 run on the DGX-1 and the K80s used variable_update parameter_server with
    local_parameter_device cpu."""
    return "ps=cpu" in row["system"] or row["source_short"] == "TF docs 2017"


def link_of(row: dict[str, Any]) -> tuple[interconnects.Interconnect, str] | None:
    """The interconnect a published row's gradients cross, and the path in a few words."""
    box = box_of(row["hardware"])
    if box is None:
        return None
    if reduces_on_host(row):
        return interconnects.get(box.host_link), "summed on the CPU: each GPU's link to the host"
    return interconnects.get(box.gpu_link), "summed on a GPU: the link between the GPUs"


def scaling_of(row: dict[str, Any], base: dict[str, Any]) -> str | None:
    """weak when the row keeps its 1-GPU baseline's per-GPU batch, strong when it keeps the
    global batch, None when neither (not comparable)."""
    if row["batch_per_gpu"] == base["batch_per_gpu"]:
        return "weak"
    if row.get("global_batch") and row["global_batch"] == base["global_batch"]:
        return "strong"
    return None


def validate(rows: list[dict[str, Any]], sources: tuple[str, ...] = SOURCES
             ) -> list[dict[str, Any]]:
    """One result per published point at 2+ GPUs of the sources' series that have a 1-GPU
    figure, a known box and a model in models/: the inputs, the published and predicted
    efficiencies, the misses in percentage points and the implied bus bandwidth."""
    base = {r["series"]: r for r in rows if r["gpus"] == 1 and r["images_per_sec"]}
    out = []
    for row in rows:
        one = base.get(row["series"])
        if (row["source_short"] not in sources or not row["gpus"] or row["gpus"] < 2
                or not row["images_per_sec"] or one is None):
            continue
        link = link_of(row)
        scaling = scaling_of(row, one)
        try:
            nbytes = gradient_bytes(row["model"])
        except KeyError:
            continue
        if link is None or scaling is None:
            continue
        ic, path = link
        batch = one["batch_per_gpu"]  # the 1-GPU batch: per GPU (weak) and global (strong)
        t1 = batch / one["images_per_sec"]
        n = int(row["gpus"])
        bw = Bandwidth(ic.busbw_gbps, ic.latency_s, ic.name)
        pred = predict(t1, batch, scaling, n, nbytes, bw)
        published = row["images_per_sec"] / (n * one["images_per_sec"])
        out.append({
            "series": row["series"], "system": row["system"], "hardware": row["hardware"],
            "data": row["data"], "scaling": scaling, "batch": batch, "gpus": n,
            "t1_s": t1, "gradient_bytes": nbytes, "link": ic.name,
            "busbw_gbps": ic.busbw_gbps, "latency_s": ic.latency_s, "link_why": path,
            "published_images_per_sec": row["images_per_sec"],
            "published_efficiency": published,
            "efficiency_no_overlap": pred.efficiency_no_overlap,
            "efficiency_overlap": pred.efficiency_overlap,
            "miss_no_overlap_pp": 100 * (pred.efficiency_no_overlap - published),
            "miss_overlap_pp": 100 * (pred.efficiency_overlap - published),
            "implied_busbw_gbps": implied_busbw(t1, batch, scaling, n, nbytes,
                                                row["images_per_sec"], ic.latency_s),
        })
    return out


def within(result: dict[str, Any]) -> str:
    """Which predictions are within TARGET_PP of the published efficiency."""
    no = abs(result["miss_no_overlap_pp"]) <= TARGET_PP
    ov = abs(result["miss_overlap_pp"]) <= TARGET_PP
    return {(True, True): "both", (True, False): "no overlap", (False, True): "overlap",
            (False, False): "neither"}[(no, ov)]


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _pp(x: float) -> str:
    return f"{x:+.1f}"


def markdown(results: list[dict[str, Any]]) -> str:
    """The inputs per box, the validation table and the count of points within target."""
    lines = ["Inputs (one model for every row; bench/analysis/predict.py):", ""]
    if results:
        lines += [f"- gradient bytes: {results[0]['gradient_bytes']:,} (models/resnet50: "
                  "trainable parameters x 4), for every row"]
    used: dict[str, dict[str, list[str]]] = {}
    for r in results:
        ic = f"{r['link']} ({r['busbw_gbps']:g} GB/s nominal, {r['latency_s'] * 1e6:g} us " \
             f"per message), {r['link_why']}"
        systems = used.setdefault(r["hardware"], {}).setdefault(ic, [])
        if r["system"] not in systems:
            systems.append(r["system"])
    for hw, links in used.items():
        box = box_of(hw)
        lines.append(f"- {hw}: {box.why if box else ''}. " + "; ".join(
            f"{', '.join(systems)}: {ic}" for ic, systems in links.items()))
    lines += ["", "| series | system | GPUs | scaling | T_1 ms | link | published img/s | "
              "published eff. | predicted, no overlap | predicted, overlap | miss pp (no ovl. "
              "/ ovl.) | within 5 pp | implied busbw GB/s |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        implied = r["implied_busbw_gbps"]
        lines.append(
            f"| {r['series']} | {r['system']} | {r['gpus']} | {r['scaling']} | "
            f"{r['t1_s'] * 1e3:.0f} | {r['link']} | {r['published_images_per_sec']:g} | "
            f"{_pct(r['published_efficiency'])} | {_pct(r['efficiency_no_overlap'])} | "
            f"{_pct(r['efficiency_overlap'])} | {_pp(r['miss_no_overlap_pp'])} / "
            f"{_pp(r['miss_overlap_pp'])} | {within(r)} | "
            + ("at or above the no-communication ideal" if implied is None else f"{implied:.3g}")
            + " |")
    total = len(results)
    count = {k: sum(within(r) in ok for r in results) for k, ok in (
        ("no overlap", ("both", "no overlap")), ("overlap", ("both", "overlap")),
        ("either", ("both", "no overlap", "overlap")))}
    lines += ["", f"Within {TARGET_PP:g} percentage points of the published efficiency: "
              f"{count['no overlap']} of {total} points without overlap, {count['overlap']} "
              f"with it, {count['either']} by one or the other. Miss: predicted minus "
              "published, in percentage points. Implied busbw: the bus bandwidth with which "
              "the no-overlap model gives the published images/sec exactly."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.validate_predictor",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--published", type=Path, default=PUBLISHED,
                        help=f"the published figures (default {PUBLISHED})")
    args = parser.parse_args(argv)
    print(markdown(validate(load_published(args.published))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
