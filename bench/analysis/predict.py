"""`run_bench.py predict RESULTS_DIR --devices 2,4,8 [--busbw GB/s | --interconnect NAME]`:
the step time, images/sec and scaling efficiency a configuration would reach at N devices,
from its measured 1-device step, its model's gradient bytes and a bus bandwidth, under a ring
all-reduce, with and without overlap of the backward pass and the communication.

The model, term by term (docs/PERFORMANCE.md validates it against published tables):

- **Compute**: T_1 = the global batch / the median images/sec of the configuration's ok
  1-device runs. images/sec rather than the median step time, because the efficiency the
  summary measures is images/sec over images/sec: a prediction from the same estimator is
  compared on the same footing (a median step would leave out the stalls the measured
  efficiency includes). At N devices each device computes its share of the batch: weak
  scaling (the default) keeps the per-device batch, so compute stays T_1; strong scaling
  splits a fixed global batch, and compute is assumed to shrink with the per-device batch,
  T_1 x (B/N)/B = T_1/N: an upper bound on its efficiency, since a small per-device batch
  runs a device below its efficient size and per-step overheads do not shrink.
- **Communication**: a ring all-reduce of S gradient bytes (trainable parameters x 4,
  contract/collectives.py) over N devices moves 2(N-1)/N x S bytes through every device's link
  (nccl-tests' bus bandwidth definition), so it takes 2(N-1)/N x S / busbw, plus a latency
  term of 2(N-1) steps x the link's per-message latency for every message. The gradients go
  in buckets of BUCKET_BYTES (PyTorch DDP's default bucket_cap_mb, 25 MiB), so ResNet-50's
  102 MB are 4 messages: the latency term is 2(N-1) x latency x messages (a probe's busbw,
  timed on one whole all-reduce of the gradient size, holds one message's latency already:
  only the others are added).
- **Overlap**: the backward pass is BACKWARD_FRACTION (2/3) of the step, the training-FLOPs
  rule bench/records/mfu.py uses (backward = 2 x forward); a bucket's all-reduce can run while the
  backward pass goes on, so only the communication beyond that window is exposed. The last
  bucket (the first layers' gradients, produced last) can only start once the backward pass
  has ended, so at least its all-reduce is exposed: without overlap T_N = T_1 + T_comm, with
  it T_N = T_1 + max(T_comm - window, T_last bucket). The two normally bracket what a
  framework gets: none overlaps more, and one that issues the all-reduce after the backward
  pass overlaps nothing.
- **Efficiency**: images/sec at N over N x images/sec at 1 (the summary's definition).

The bus bandwidth, in this order: --busbw (no latency term: a bare figure has none);
--interconnect (bench/analysis/interconnects.py: the nominal figure and the link kind's latency);
else
the folder's own all-reduce probe (records of mode allreduce: the busbw at the size nearest the
model's gradient bytes, from the probe of the runner's framework family where there is one,
else the fastest, at the same device count where it was measured, else the nearest; its
latency from a straight-line fit of time against size over the probe's buffer sizes); else the
nominal link of the box's environment capture (environment.json: NVLink or PCIe from NVML and
nvidia-smi topo -m). With none of them it assumes PCIe 4.0 x16 (ASSUMED_INTERCONNECT) and
says so on every row.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bench.analysis import interconnects
from bench.analysis.stats import summarise
from bench.catalog.registry import PROBES, RUNNERS
from bench.errors import ConfigError
from bench.plotting import pyplot, save
from bench.records.grouping import (
    batch_of,
    config_key,
    data_label,
    group_key,
    mode_of,
    runner_label,
    variant_of,
)
from bench.records.mfu import TRAINING_FLOPS_FACTOR
from bench.records.store import atomic_file, folder_damage, load_records, read_environment
from contract.collectives import MIB, bus_factor, gradient_bytes

BACKWARD_FRACTION = (TRAINING_FLOPS_FACTOR - 1) / TRAINING_FLOPS_FACTOR
BUCKET_BYTES = 25 * MIB
PROBE_MODE = "allreduce"
CSV_NAME, CHART_NAME = "predict.csv", "predict.png"
# With no --busbw, --interconnect, probe or GPU link in the folder, a prediction still comes
# out, on this stated assumption: PCIe 4.0 x16, the link between GPUs without NVLink in most of
# today's boxes; every row and the notes say it was assumed.
ASSUMED_INTERCONNECT = "pcie4"


# -- the model -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Bandwidth:
    """A bus bandwidth (GB/s, 1e9 bytes/s), a per-message latency (s) and where they came
    from, in a few words. A probe's busbw at the gradient size is one whole all-reduce's,
    its fixed cost included: `latency_included` messages' latency is already in it."""

    busbw_gbps: float
    latency_s: float
    source: str
    latency_included: int = 0


def buckets(nbytes: int, bucket_bytes: int = BUCKET_BYTES) -> list[int]:
    """The messages the gradients go in: full buckets, then the rest (the last message)."""
    full, rest = divmod(nbytes, bucket_bytes)
    return [bucket_bytes] * full + ([rest] if rest else []) or [0]


def ring_seconds(nbytes: float, n: int, busbw_gbps: float, latency_s: float = 0.0,
                 messages: int = 1) -> float:
    """One ring all-reduce of nbytes (in `messages` messages) over n devices:
    2(n-1)/n x nbytes / busbw + 2(n-1) x latency x messages; 0 on one device."""
    if n <= 1:
        return 0.0
    return bus_factor(n) * nbytes / (busbw_gbps * 1e9) + 2 * (n - 1) * latency_s * messages


def communication(nbytes: int, n: int, bw: Bandwidth,
                  bucket_bytes: int = BUCKET_BYTES) -> tuple[float, float, int]:
    """(all the buckets' all-reduce time, the last bucket's, the number of buckets); the
    latency of the messages the bandwidth figure already holds is not counted again."""
    sizes = buckets(nbytes, bucket_bytes)
    charged = max(0, len(sizes) - bw.latency_included)
    total = ring_seconds(nbytes, n, bw.busbw_gbps, bw.latency_s, charged)
    last = ring_seconds(sizes[-1], n, bw.busbw_gbps, bw.latency_s)
    return total, min(last, total), len(sizes)


def compute_share(scaling: str, n: int) -> float:
    """Each device's compute at n devices over its compute on 1: 1 for weak scaling (the
    per-device batch is fixed), 1/n for strong (a fixed global batch split n ways)."""
    return 1.0 if scaling == "weak" else 1.0 / n


def images_per_step(batch: float, scaling: str, n: int) -> float:
    """Images in one step at n devices: batch is the per-device batch (weak) or global."""
    return batch * n if scaling == "weak" else batch


@dataclass(frozen=True)
class Prediction:
    num_devices: int
    compute_s: float
    comm_s: float
    last_bucket_s: float
    messages: int
    overlap_window_s: float
    step_s_no_overlap: float
    step_s_overlap: float
    images_per_sec_no_overlap: float
    images_per_sec_overlap: float
    efficiency_no_overlap: float
    efficiency_overlap: float


def predict(t1_s: float, batch: float, scaling: str, n: int, nbytes: int, bw: Bandwidth,
            backward_fraction: float = BACKWARD_FRACTION,
            bucket_bytes: int = BUCKET_BYTES) -> Prediction:
    """The step at n devices of a configuration whose 1-device step takes t1_s (module
    docstring: the model)."""
    compute = t1_s * compute_share(scaling, n)
    comm, last, messages = communication(nbytes, n, bw, bucket_bytes)
    window = backward_fraction * compute
    exposed = max(comm - window, last) if n > 1 else 0.0
    images = images_per_step(batch, scaling, n)
    ideal = n * batch / t1_s  # n x the 1-device images/sec
    no, ovl = compute + comm, compute + exposed
    return Prediction(n, compute, comm, last, messages, window, no, ovl, images / no,
                      images / ovl, images / no / ideal, images / ovl / ideal)


def implied_busbw(t1_s: float, batch: float, scaling: str, n: int, nbytes: int,
                  images_per_sec: float, latency_s: float = 0.0,
                  bucket_bytes: int = BUCKET_BYTES) -> float | None:
    """The bus bandwidth (GB/s) with which the no-overlap model reproduces a measured
    images/sec at n devices (back-solved); None where the measured step is no longer than
    the predicted compute (no communication time is left to explain)."""
    if n <= 1:
        return None
    step = images_per_step(batch, scaling, n) / images_per_sec
    left = (step - t1_s * compute_share(scaling, n)
            - 2 * (n - 1) * latency_s * len(buckets(nbytes, bucket_bytes)))
    return bus_factor(n) * nbytes / left / 1e9 if left > 0 else None


# -- bandwidth sources -----------------------------------------------------------------------

def probe_latency(sizes: list[dict[str, Any]], n: int) -> float:
    """The per-message latency a probe's sizes imply: the intercept of a least-squares line
    of time against bytes is one all-reduce's fixed cost, 2(n-1) latency steps of a ring."""
    pts = [(r["bytes"], r["time_s"]) for r in sizes
           if isinstance(r.get("bytes"), (int, float)) and isinstance(r.get("time_s"),
                                                                      (int, float))]
    if len(pts) < 2 or n <= 1:
        return 0.0
    mx = statistics.fmean(b for b, _ in pts)
    my = statistics.fmean(t for _, t in pts)
    var = sum((b - mx) ** 2 for b, _ in pts)
    if var == 0:
        return 0.0
    slope = sum((b - mx) * (t - my) for b, t in pts) / var
    return max(0.0, (my - slope * mx) / (2 * (n - 1)))


def probe_figure(rec: dict[str, Any], nbytes: int) -> tuple[float, int, float] | None:
    """(busbw GB/s, the buffer size it was measured at, latency s) of a probe record at the
    size nearest nbytes (on a log scale); None without a usable figure."""
    ar = (rec.get("result") or {}).get("allreduce") or {}
    sizes = [r for r in ar.get("sizes") or []
             if isinstance(r.get("busbw_gbps"), (int, float)) and r["busbw_gbps"] > 0
             and isinstance(r.get("bytes"), (int, float)) and r["bytes"] > 0]
    n = rec.get("num_devices") or 0
    if sizes:
        near = min(sizes, key=lambda r: abs(math.log(r["bytes"] / nbytes)))
        return near["busbw_gbps"], int(near["bytes"]), probe_latency(sizes, n)
    busbw = ar.get("busbw_gbps")
    if isinstance(busbw, (int, float)) and busbw > 0:
        return busbw, int(ar.get("gradient_bytes") or nbytes), 0.0
    return None


def probe_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The folder's ok all-reduce probe records."""
    return [r for r in records if mode_of(r) == PROBE_MODE and r.get("status") == "ok"]


def family_of(runner: str) -> str | None:
    info = RUNNERS.get(runner) or PROBES.get(runner)
    return info.family if info else None


def probe_bandwidth(probes: list[dict[str, Any]], runner: str, device: str, n: int,
                    nbytes: int) -> Bandwidth | None:
    """The probe figure for a configuration of `runner` on `device` at n devices: the probe
    of the runner's framework family where the folder has one, else the fastest; measured at
    n devices, else at the nearest count measured; the median over its repeats."""
    mine = [p for p in probes if p.get("device") == device and probe_figure(p, nbytes)]
    if not mine:
        return None
    family = family_of(runner)
    same = [p for p in mine if p.get("family") == family or family_of(p["runner"]) == family]
    pool = same or mine
    counts = sorted({p["num_devices"] for p in pool})
    at = min(counts, key=lambda c: (abs(math.log(c / n)), -c)) if n > 1 else max(counts)
    by_probe: dict[str, list[tuple[float, int, float]]] = defaultdict(list)
    for p in pool:
        if p["num_devices"] == at:
            by_probe[p["runner"]].append(probe_figure(p, nbytes))  # type: ignore[arg-type]
    name, figs = max(by_probe.items(),
                     key=lambda kv: statistics.median(f[0] for f in kv[1]))
    busbw = statistics.median(f[0] for f in figs)
    size = figs[0][1]
    why = "" if same else f" (no {family or runner} probe: the fastest)"
    where = f"at {at} devices" + ("" if at == n else f", used for {n}")
    return Bandwidth(busbw, statistics.median(f[2] for f in figs),
                     f"probe {name}{why} {where}: {busbw:.3g} GB/s at "
                     f"{size / 1e6:.3g} MB",
                     latency_included=1)


def environment_bandwidth(results_dir: Path) -> Bandwidth | None:
    """The nominal link of the box the sweep ran on (environment.json), if it names one."""
    env = read_environment(Path(results_dir))[0]  # None where missing or damaged
    link = interconnects.nominal_link(env) if env else {}
    if not link.get("nominal_gbps"):
        return None
    kind = "nvlink-p100" if str(link["link"]).startswith("NVLink") else "pcie3"
    return Bandwidth(link["nominal_gbps"], interconnects.get(kind).latency_s,
                     f"nominal {link['link']} from environment.json: "
                     f"{link['nominal_gbps']:.3g} GB/s")


BUSBW_RANGE = (1e-6, 1e6)  # GB/s: 1 kB/s to 1 PB/s; past either a figure means nothing


def fixed_bandwidth(busbw: float | None, interconnect: str | None) -> Bandwidth | None:
    """The bandwidth --busbw or --interconnect names (ConfigError on a bad one); None when
    neither was given."""
    if busbw is not None:
        if not (isinstance(busbw, (int, float)) and BUSBW_RANGE[0] <= busbw <= BUSBW_RANGE[1]):
            raise ConfigError(f"busbw: {busbw!r} is not allowed; allowed: a bus bandwidth in "
                              f"GB/s, from {BUSBW_RANGE[0]:g} (1 kB/s) to {BUSBW_RANGE[1]:g} "
                              "(1 PB/s)")
        return Bandwidth(float(busbw), 0.0, f"--busbw {busbw:g} GB/s (no latency term)")
    if interconnect is not None:
        try:
            ic = interconnects.get(interconnect)
        except KeyError:
            raise ConfigError(f"interconnect: {interconnect!r} is not allowed; allowed: "
                              f"{', '.join(interconnects.names())}") from None
        return Bandwidth(ic.busbw_gbps, ic.latency_s,
                         f"{ic.name} ({ic.description}): nominal {ic.busbw_gbps:g} GB/s, "
                         f"{ic.latency_s * 1e6:g} us per message")
    return None


# -- a results folder ------------------------------------------------------------------------

def parse_devices(text: str) -> list[int]:
    """'2,4,8' -> [2, 4, 8]; ConfigError naming the value and what is allowed."""
    allowed = "comma-separated device counts, integers >= 1 (e.g. 2,4,8)"
    parts = [p.strip() for p in str(text).split(",")]
    counts = []
    for part in parts:
        if not part.isdigit() or int(part) < 1:
            raise ConfigError(f"devices: {part!r} (in {text!r}) is not allowed; "
                              f"allowed: {allowed}")
        if int(part) in counts:
            raise ConfigError(f"devices: {int(part)} is given twice in {text!r}; "
                              f"allowed: {allowed}, each once")
        counts.append(int(part))
    return sorted(counts)


@dataclass(frozen=True)
class Baseline:
    """A configuration's 1-device step, from its ok 1-device, 1-node benchmark runs."""

    key: tuple[Any, ...]
    runner: str
    model: str
    data_label: str
    precision: str
    scaling: str
    batch: int  # per device (weak) or global (strong), as grouping.batch_of
    device: str
    virtual_devices: bool
    t1_s: float
    runs: int
    gradient_bytes: int

    variant: str = ""  # the options of an option axis (grouping.variant_of): stage=3

    @property
    def label(self) -> str:
        batch = f"{self.batch}/dev" if self.scaling == "weak" else f"{self.batch} global"
        runner = f"{self.runner} {self.variant}" if self.variant else self.runner
        return f"{runner} {self.model} {self.data_label} {self.precision} b={batch}"


def baselines(records: list[dict[str, Any]]) -> tuple[list[Baseline], list[str]]:
    """The configurations with ok 1-device benchmark runs, and notes on those skipped."""
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for rec in records:
        if (mode_of(rec) == "benchmark" and rec.get("status") == "ok"
                and rec.get("num_devices") == 1 and (rec.get("num_nodes") or 1) == 1
                and rec.get("images_per_sec")):
            groups[group_key(rec)].append(rec)
    out, notes = [], []
    for key, recs in sorted(groups.items(), key=lambda kv: tuple(map(str, kv[0]))):
        first = recs[0]
        try:
            nbytes = gradient_bytes(first["model"])
        except KeyError:
            notes.append(f"{first['runner']} {first['model']}: skipped, model "
                         f"{first['model']!r} is not in models/ (no gradient size)")
            continue
        ips = statistics.median(r["images_per_sec"] for r in recs)
        out.append(Baseline(key, first["runner"], first["model"], data_label(first),
                            first["precision"], first["scaling"], batch_of(first),
                            first["device"], bool(first.get("virtual_devices")),
                            first["global_batch_size"] / ips, len(recs), nbytes,
                            variant_of(first)))
    return out, notes


@dataclass
class Forecast:
    """What `predict` found in a folder: one row per configuration with a 1-device run and
    per device count asked for (the inputs, both predictions, the measured figures where the
    folder has that count), the summary rows of its benchmark runs by config_key (the
    measured points), and notes (configurations skipped, assumptions that apply)."""

    rows: list[dict[str, Any]]
    measured: dict[tuple[Any, ...], dict[str, Any]]
    notes: list[str]
    baselines: list[Baseline]


def predict_folder(results_dir: Path, devices: list[int], busbw: float | None = None,
                   interconnect: str | None = None) -> Forecast:
    """The predictions for a results folder (ConfigError when it has no ok 1-device run)."""
    results_dir = Path(results_dir)
    if not (results_dir / "runs").is_dir():
        raise ConfigError(f"results_dir: {str(results_dir)!r} has no runs/ folder; allowed: "
                          "a results folder written by a sweep")
    fixed = fixed_bandwidth(busbw, interconnect)
    records = load_records(results_dir)
    bases, notes = baselines(records)
    if not bases:
        raise ConfigError(f"results_dir: {str(results_dir)!r} has no ok 1-device benchmark "
                          "run; allowed: a results folder whose sweep ran devices: [1, ...] "
                          "(the prediction starts from the measured 1-device step)")
    probes = probe_records(records)
    env_bw = None if fixed else environment_bandwidth(results_dir)
    measured = {config_key(r): r for r in summarise(
        [r for r in records if mode_of(r) == "benchmark"])}
    rows, missing = [], []
    assumed = fixed_bandwidth(None, ASSUMED_INTERCONNECT)
    assert assumed is not None
    assumed = replace(assumed, source=f"assumed {assumed.source}")
    for base in bases:
        for n in devices:
            bw = fixed or probe_bandwidth(probes, base.runner, base.device, n,
                                          base.gradient_bytes)
            bw = bw or (env_bw if base.device == "gpu" else None)
            if bw is None:
                if f"{base.label} ({base.device})" not in missing:
                    missing.append(f"{base.label} ({base.device})")
                bw = assumed
            pred = predict(base.t1_s, base.batch, base.scaling, n, base.gradient_bytes, bw)
            seen = measured.get((*base.key, 1, n)) or {}
            rows.append({
                "key": base.key, "runner": base.runner, "variant": base.variant,
                "model": base.model,
                "data": base.data_label, "precision": base.precision,
                "scaling": base.scaling, "batch": base.batch, "device": base.device,
                "t1_s": base.t1_s, "t1_runs": base.runs,
                "gradient_bytes": base.gradient_bytes, "busbw_gbps": bw.busbw_gbps,
                "latency_s": bw.latency_s, "bandwidth_source": bw.source, **asdict(pred),
                "measured_images_per_sec": seen.get("images_per_sec"),
                "measured_efficiency": seen.get("scaling_efficiency"),
            })
    if missing:
        notes.append(
            f"no bus bandwidth for {'; '.join(missing)}: "
            f"{assumed.source.replace('assumed', 'ASSUMED', 1)}; for a "
            f"measured one run mode: allreduce into {results_dir} (its probes' bus bandwidth), "
            f"or pass --busbw GB/s or --interconnect NAME ({', '.join(interconnects.names())})")
    if any(b.scaling == "strong" for b in bases):
        notes.append("strong scaling: each device's compute is taken to shrink with its share "
                     "of the global batch (T_1/N), an upper bound: small per-device batches "
                     "run below a device's efficient size")
    if any(b.virtual_devices for b in bases):
        notes.append("virtual CPU devices: N of them share one host's cores, so the measured "
                     "points fall far below a prediction made for N devices each as fast as "
                     "the one measured")
    return Forecast(rows, measured, notes, bases)


# -- output ----------------------------------------------------------------------------------

def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.1f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def format_table(rows: list[dict[str, Any]], notes: list[str]) -> str:
    """The predictions as text: a block per configuration, then the sources and the model."""
    out: list[str] = []
    by_config: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by_config[(runner_label(r), r["model"], r["data"], r["precision"], r["scaling"],
                   r["batch"], r["device"])].append(r)
    sources: dict[str, None] = {}
    for (runner, model, data, prec, scaling, batch, device), pts in by_config.items():
        first = pts[0]
        b = f"{batch}/dev" if scaling == "weak" else f"{batch} global"
        out += ["", f"{runner} {model} {data} {prec} b={b} ({device}): 1-device step "
                f"{_ms(first['t1_s'])} ms ({first['t1_runs']} run"
                f"{'s' if first['t1_runs'] > 1 else ''}), gradients "
                f"{first['gradient_bytes'] / 1e6:.1f} MB"]
        lines = [("devices", "busbw GB/s", "comm ms", "step ms", "img/s", "effic.",
                  "step ms", "img/s", "effic.", "measured")]
        lines.append(("", "", "", "no overlap", "", "", "overlap", "", "", "effic."))
        for r in pts:
            sources[r["bandwidth_source"]] = None
            lines.append((str(r["num_devices"]), f"{r['busbw_gbps']:.3g}", _ms(r["comm_s"]),
                          _ms(r["step_s_no_overlap"]), f"{r['images_per_sec_no_overlap']:.1f}",
                          _pct(r["efficiency_no_overlap"]), _ms(r["step_s_overlap"]),
                          f"{r['images_per_sec_overlap']:.1f}", _pct(r["efficiency_overlap"]),
                          _pct(r["measured_efficiency"])))
        widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
        out += ["  " + "  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True))
                for line in lines]
    out += ["", "bandwidth:", *(f"  {s}" for s in sources)]
    out += ["model: ring all-reduce, 2(N-1)/N x gradient bytes / busbw + 2(N-1) x latency per "
            f"message ({BUCKET_BYTES // MIB} MiB buckets); overlap: the backward pass "
            f"({BACKWARD_FRACTION:.0%} of the step) hides communication, all but the last "
            "bucket's (bench/analysis/predict.py)"]
    out += [f"note: {n}" for n in notes]
    return "\n".join(out).lstrip("\n")


CSV_FIELDS = (
    "runner", "variant", "model", "data", "precision", "scaling", "batch", "device",
    "num_devices", "t1_s", "t1_runs", "gradient_bytes", "busbw_gbps", "latency_s",
    "bandwidth_source",
    "messages", "compute_s", "comm_s", "last_bucket_s", "overlap_window_s",
    "step_s_no_overlap", "images_per_sec_no_overlap", "efficiency_no_overlap",
    "step_s_overlap", "images_per_sec_overlap", "efficiency_overlap",
    "measured_images_per_sec", "measured_efficiency",
)


def write_csv(results_dir: Path, rows: list[dict[str, Any]]) -> Path:
    path = Path(results_dir) / CSV_NAME
    with atomic_file(path, newline="") as fh:  # whole or not at all, umask's permissions
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for r in rows:
            writer.writerow({k: ("" if r.get(k) is None else
                                 round(r[k], 6) if isinstance(r[k], float) else r[k])
                             for k in CSV_FIELDS})
    return path


def render_chart(results_dir: Path, forecast: Forecast) -> Path:
    """charts/predict.png: per model, each configuration's predicted efficiency against the
    device count without overlap (dashed) and with it (solid), its measured points beside."""
    plt = pyplot()
    rows = forecast.rows
    models = sorted({r["model"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(7 * len(models), 5), squeeze=False)
    for ax, model in zip(axes[0], models, strict=True):
        configs: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
        for r in rows:
            if r["model"] == model:
                configs[r["key"]].append(r)
        for key, pts in configs.items():
            first, more = pts[0], [p for p in pts if p["num_devices"] > 1]
            xs = [1] + [p["num_devices"] for p in more]
            b = (f"{first['batch']}/dev" if first["scaling"] == "weak"
                 else f"{first['batch']} global")
            label = (f"{runner_label(first)} {first['precision']} b={b}"
                     + ("" if first["data"] == "synthetic" else f" {first['data']}"))
            line, = ax.plot(xs, [1.0] + [p["efficiency_overlap"] for p in more], "-",
                            label=f"{label}: predicted, overlap")
            ax.plot(xs, [1.0] + [p["efficiency_no_overlap"] for p in more], "--",
                    color=line.get_color(), label=f"{label}: predicted, no overlap")
            seen = sorted((m for k, m in forecast.measured.items()
                           if k[:-2] == key and k[-2] == 1
                           and m.get("scaling_efficiency") is not None),
                          key=lambda m: m["num_devices"])
            if seen:
                ax.plot([m["num_devices"] for m in seen],
                        [m["scaling_efficiency"] for m in seen], "o", color=line.get_color(),
                        markersize=7, label=f"{label}: measured")
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.set_xticks(sorted({1, *(r["num_devices"] for r in rows), *(
            m["num_devices"] for m in forecast.measured.values() if m["model"] == model)}))
        ax.set_title(model)
        ax.set_xlabel("devices")
        ax.set_ylabel("scaling efficiency")
        ax.set_ylim(0, 1.05)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    virtual = any(b.virtual_devices for b in forecast.baselines)
    fig.suptitle("Predicted scaling efficiency (ring all-reduce) and measured points"
                 + ("\nvirtual CPU devices: the measured ones share one host's cores"
                    if virtual else ""), fontsize=11)
    return save(fig, Path(results_dir) / "charts" / CHART_NAME, plt)


def strategies_text(results_dir: Path, devices: list[int], model: str | None = None,
                    precision: str = "fp32") -> str:
    """`predict --strategies`: bench/analysis/strategies.py's forecast on the folder's probe
    records (ConfigError without any ok probe, or for an unknown model or precision)."""
    from bench.analysis import strategies
    from contract.precision_policy import harness_policy
    from models import get_spec

    if not (Path(results_dir) / "runs").is_dir():
        raise ConfigError(f"results_dir: {str(results_dir)!r} has no runs/ folder; allowed: "
                          "a results folder written by a sweep")
    probes = probe_records(load_records(Path(results_dir)))
    if not probes:
        raise ConfigError(f"results_dir: {str(results_dir)!r} has no ok all-reduce probe "
                          "record; allowed: a folder a mode: allreduce sweep ran into (its "
                          "probes measure the collectives the strategies are priced on)")
    model = model or probes[0]["model"]
    try:
        params = get_spec(model).trainable_params
    except KeyError:
        raise ConfigError(f"model: {model!r} is not a known model") from None
    try:
        policy = harness_policy(precision)
    except KeyError:
        raise ConfigError(f"precision: {precision!r} is not allowed; allowed: fp32, tf32, "
                          "bf16, fp16") from None
    reduce_dtype, gather_dtype = policy["reduce"] or "float32", policy["params"] or "float32"
    rows = strategies.forecast(probes, params, devices, reduce_dtype, gather_dtype)
    return strategies.format_forecast(rows, params, model, reduce_dtype, gather_dtype)


def cmd_predict(args: argparse.Namespace) -> int:
    """`run_bench.py predict`: print the table, write predict.csv and charts/predict.png;
    with --strategies, the strategies' communication table instead."""
    devices = parse_devices(args.devices)
    results_dir = Path(args.results_dir)
    for item in folder_damage(results_dir):  # one line each, never a number from them
        print(item.line(), file=sys.stderr)
    if getattr(args, "strategies", False):
        print(strategies_text(results_dir, devices, getattr(args, "model", None),
                              getattr(args, "precision", "fp32")))
        return 0
    forecast = predict_folder(results_dir, devices, getattr(args, "busbw", None),
                              getattr(args, "interconnect", None))
    print(format_table(forecast.rows, forecast.notes))
    csv_path = write_csv(results_dir, forecast.rows)
    chart = render_chart(results_dir, forecast)
    print(f"\npredictions: {csv_path}\nchart:       {chart}")
    return 0
