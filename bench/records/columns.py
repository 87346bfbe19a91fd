"""The column registry: every column of summary.csv, the terminal table, report.html's summary
table and the loader's DataFrame, and every field a run's record carries, defined once.

Each Column has its key (summary.csv's column, the summary row's and the DataFrame's key), a
short header (the terminal table and report.html), a format (how the tables show a value: a
name in FORMATS), a one-sentence meaning (results/README.md, and the legend of a flag), the
views it appears in (VIEWS; by default the summary's four), how one run's value is read from
its record (`run`, default: the record's own field) and how the summary combines its ok runs'
values (`over_runs`, a name in AGGREGATES or a function; None: bench/analysis/stats.py computes it).

Adding a metric is one Column here plus the code that computes it: a per-run metric is a
`run` reader (of a value the child or bench/run/launch.py put in the record) and an `over_runs`
aggregate, and then summary.csv, the terminal table, report.html, the loader and
results/README.md (`python -m bench.records.columns --markdown`) all have it. Every view reads
COLUMNS when it renders, never a copy taken at import.

A run setting's column (`_setting`) takes its meaning from contract/settings.py, where the
setting says whether the record holds it (view `spec`: copied from the run's spec); a setting
the record holds that no entry lists is added at the end, per run.

The grouping key that makes runs a configuration is bench/records/grouping.py's, not this.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from bench import REPO_ROOT
from bench.records.grouping import data_label, runner_label, variant_of
from bench.records.placement_check import distinct_devices
from contract import result, settings
from contract.generated_block import Block

VIEWS: dict[str, str] = {
    "csv": "summary.csv: one row per configuration and device count",
    "table": "the terminal table a sweep and `run_bench.py report` print",
    "html": "report.html's summary table",
    "loader": "`bench.analysis.loader.load_results`' DataFrame: one row per run",
    "record": "a field every record carries (`bench.records.store.REQUIRED`)",
    "spec": "copied from the run's RunSpec into its record (`bench.run.launch.base_record`)",
    "child": "the child's result field copied to the record's top level "
             "(`bench.run.launch.CHILD_FIELDS`)",
}
SUMMARY_VIEWS = ("csv", "table", "html", "loader")
DISPLAY_VIEWS = ("table", "html")
README = REPO_ROOT / "results" / "README.md"
BEGIN = "<!-- columns:begin: python -m bench.records.columns --markdown writes what follows -->"
END = "<!-- columns:end -->"

Reader = Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Column:
    """One column or record field; see the module docstring."""

    key: str
    header: str  # short, for the terminal table and report.html ("" where neither shows it)
    format: str  # a name in FORMATS
    meaning: str  # one sentence, for results/README.md (and a flag's legend)
    views: tuple[str, ...] = SUMMARY_VIEWS
    run: Reader | None = None  # one run's value from its record; None: record[key]
    # how summarise combines the runs' values: a name in AGGREGATES ("config": the
    # configuration's own value, from its first run), a function of the ok runs' values,
    # or None: bench/analysis/stats.py computes it
    over_runs: str | Callable[[list[Any]], Any] | None = None
    # a table (table, html) shows it only when some row has a value (tokens/sec: token
    # models only), so tables of runs without it keep their width
    optional: bool = False


def _at(*path: str) -> Reader:
    """A reader of a nested field of a record (None where any step is missing)."""
    def read(rec: Mapping[str, Any]) -> Any:
        node: Any = rec
        for key in path:
            node = node.get(key) if isinstance(node, Mapping) else None
        return node
    return read


def _placed(rec: Mapping[str, Any]) -> int | None:
    placement = rec.get("placement")
    return len(distinct_devices(placement)) if isinstance(placement, Mapping) else None


def _departures(rec: Mapping[str, Any]) -> str | None:
    changed = _at("result", "departs_from_original")(rec)
    return ", ".join(str(c) for c in changed) if isinstance(changed, list) and changed else None


def _step_time_median(rec: Mapping[str, Any]) -> float | None:
    steps = rec.get("step_times_s") or []
    return float(statistics.median(steps)) if steps else None


def _gpu_mem_peak(rec: Mapping[str, Any]) -> int | None:
    gpus = (rec.get("telemetry") or {}).get("gpus") or []
    return max((g.get("mem_used_peak_bytes") or 0 for g in gpus), default=None)


def _memory_peak(rec: Mapping[str, Any]) -> float | None:
    """The most memory any one device (or process) of the run held: None where the record
    has no memory_per_device (an older record, or nothing measured), never 0."""
    per_device = rec.get("memory_per_device")
    values = _numbers(list(per_device.values())) if isinstance(per_device, Mapping) else []
    return max(values) if values else None


STATE_PARTS = ("params", "grads", "optimizer")


def state_split(rec: Mapping[str, Any]) -> dict[str, int] | None:
    """The model state of the device that holds the most (params + grads + optimizer, from
    the record's state_bytes_per_device, read from the framework's shards): its parts and
    `total`, and `device`; None where the record has none (older runners)."""
    per_device = rec.get("state_bytes_per_device")
    if not isinstance(per_device, Mapping) or not per_device:
        return None
    best: dict[str, Any] | None = None
    for device, parts in per_device.items():
        if not isinstance(parts, Mapping):
            continue
        split: dict[str, Any] = {k: parts.get(k) if isinstance(parts.get(k), int) else 0
                                 for k in STATE_PARTS}
        total = sum(split.values())
        if best is None or total > best["total"]:
            best = {**split, "total": total, "device": device}
    return best


def _state_per_device(rec: Mapping[str, Any]) -> int | None:
    split = state_split(rec)
    return split["total"] if split else None


def _policy_summary(rec: Mapping[str, Any]) -> str | None:
    from contract.precision_policy import summary

    policy = rec.get("precision_policy")
    return summary(policy) or None if isinstance(policy, Mapping) else None


def _numbers(values: list[Any]) -> list[float]:
    return [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]


def _median(values: list[Any]) -> float | None:
    nums = _numbers(values)
    return statistics.median(nums) if nums else None


def _any(values: list[Any]) -> bool | None:
    seen = [v for v in values if v is not None]
    return any(seen) if seen else None


def _min(values: list[Any]) -> Any:
    seen = [v for v in values if v is not None]
    return min(seen) if seen else None


def _first(values: list[Any]) -> Any:
    return next((v for v in values if v), None)


def _joined(values: list[Any]) -> str | None:
    return " ".join(str(v) for v in values if v) or None


# How summarise combines the values of a configuration's ok runs ("config" is apart: the
# value of its first run, ok or not, the same in all of them).
AGGREGATES: dict[str, Callable[[list[Any]], Any]] = {
    "median": _median, "any": _any, "min": _min, "first": _first,
}

RUN_VIEWS = ("loader", "record")
CSV_VIEWS = ("csv", "loader", "record")  # configuration fields summary.csv has
CONFIG_VIEWS = (*SUMMARY_VIEWS, "record")  # ... that the tables show too


def _field(key: str, meaning: str, views: tuple[str, ...] = RUN_VIEWS,
           run: Reader | None = None, format: str = "text") -> Column:
    """A column no table shows: per run only, or summary.csv only."""
    return Column(key, "", format, meaning, views, run)


def _child(key: str, views: tuple[str, ...] = ("record", "child")) -> Column:
    """A field the child reports, per run only: its meaning is its declaration's
    (contract/result.py)."""
    return Column(key, "", "text", result.FIELDS[key].meaning, views)


def _children(*keys: str, views: tuple[str, ...] = ("record", "child")) -> tuple[Column, ...]:
    """_child's column of each key, in the order given, all in the same views."""
    return tuple(_child(key, views) for key in keys)


def _setting(key: str, views: tuple[str, ...] = (), header: str = "", format: str = "text",
             run: Reader | None = None, over_runs: str | None = None) -> Column:
    """The column of a run setting (contract/settings.py): its meaning is the setting's help,
    and the record holds it, copied from the run's spec (view spec), when the setting says."""
    setting = settings.setting(key)
    views = (*views, "spec") if setting.recorded else views
    return Column(key, header, format, setting.help, views, run, over_runs)


# The columns, in the order of every view (summary.csv's columns, the tables' cells).
COLUMNS: tuple[Column, ...] = (
    # the configuration
    _setting("runner", CONFIG_VIEWS, "runner", "runner", over_runs="config"),
    Column("variant", "", "text", "The runner options this configuration's runs vary in (an "
           "option axis: `runner_options.<runner>.<option>: [a, b]`), as option=value joined "
           "by spaces (`stage=3`), empty where none varies; the tables show it after the "
           "runner. The record holds it as a mapping, `variant` (`bench.records.grouping`).",
           ("csv", "loader"), variant_of, "config"),
    _setting("model", CONFIG_VIEWS, "model", over_runs="config"),
    _setting("device", CSV_VIEWS, over_runs="config"),
    _setting("virtual_devices", CSV_VIEWS, format="bool", over_runs="config"),
    _setting("num_nodes", CSV_VIEWS, format="int", run=lambda r: r.get("num_nodes") or 1,
             over_runs="config"),
    _setting("num_devices", CONFIG_VIEWS, "devices", "devices", over_runs="config"),
    Column("slurm_job_id", "", "text", "The SLURM job of each run (backend slurm), joined "
           "with spaces.", ("csv", "loader"), _at("slurm", "job_id"), _joined),
    Column("slurm_nodes", "", "text", "The nodes SLURM gave the run's job (its NodeList).",
           ("csv", "loader"), _at("slurm", "node_list"), "first"),
    Column("queued_s", "", "1f", "Seconds the run's SLURM job waited in the queue "
           "(StartTime - SubmitTime).", ("csv", "loader"), _at("slurm", "queued_s"), "median"),
    Column("placed_devices", "placed", "placed", "Distinct devices the framework reports the "
           "timed steps ran on (the record's `placement`, each name normalised: "
           "bench/records/placement_check.py): the fewest any ok run named.",
           run=_placed, over_runs="min"),
    Column("departs_from_original", "vs original", "text", "The options of a run named after "
           "a 2017 system that differ from that system's own usage (its README or example; "
           "the runner's docstring cites them), as option=value.", ("csv", "html", "loader"),
           _departures, "first"),
    Column("placement_collapsed", "", "text", "The framework's own note when it put N devices' "
           "work on fewer (keras-mxnet's cpu(i) on cpu(0)), from the runner's result.",
           ("csv", "loader"), _at("result", "placement_collapsed"), "first"),
    Column("batchnorm", "BN", "text", "BatchNorm statistics per device (per_device) or over "
           "the global batch (global), as the runner reports.",
           run=_at("result", "batchnorm"), over_runs="first"),
    _setting("scaling", CSV_VIEWS, over_runs="config"),
    _setting("batch_size_per_device", CONFIG_VIEWS, "batch", "batch", over_runs="config"),
    _setting("global_batch_size", CSV_VIEWS, format="int", over_runs="config"),
    _setting("precision", CONFIG_VIEWS, "prec", over_runs="config"),
    _setting("data", CONFIG_VIEWS, "data", "data_label", over_runs="config"),
    Column("loader_workers", "", "int", "The parallel decode workers of a real-data run's "
           "loader (`dataset.workers`).", ("csv", "loader"), _at("dataset", "workers"),
           "config"),
    # what the runs measured
    Column("status", "status", "status", "ok when any run of the configuration was ok, else "
           "its runs' statuses (failed, timeout, oom, unavailable, invalid); per run, its own.",
           (*SUMMARY_VIEWS, "record")),
    _field("runs_ok", "Runs of the configuration whose status is ok.", ("csv",), format="int"),
    _field("runs_total", "Runs of the configuration (its repeats).", ("csv",), format="int"),
    Column("images_per_sec", "img/s", "1f", "Images per second over the timed window: the "
           "median over the ok runs (per run, its own).", (*SUMMARY_VIEWS, "record", "child")),
    Column("images_per_sec_ci_low", "interval", "ci1", "The low end of the interval of the "
           "median images/sec over repeats, of the kind `interval` names "
           "(`bench.analysis.stats.median_interval`).", ("csv", *DISPLAY_VIEWS)),
    _field("images_per_sec_ci_high", "The high end of that interval.", ("csv",), format="1f"),
    _field("interval", "Which interval images_per_sec_ci_low/high are, by the ok runs: none "
           "(one run), range (two: their lowest and highest, too few for a confidence "
           "interval), or 95% bootstrap CI (three or more: the percentile bootstrap of the "
           "median).", ("csv",)),
    _field("images_per_sec_std", "The standard deviation of the ok runs' images/sec.",
           ("csv",), format="1f"),
    Column("images_per_sec_cv", "CV", "pct1", "The coefficient of variation of the ok runs' "
           "images/sec (standard deviation over mean).", ("csv", "html")),
    _field("mean_step_rate", "The median over ok runs of each run's mean of per-step rates "
           "(global batch over step time); against images/sec it shows stalls.", ("csv",),
           format="1f"),
    Column("speedup", "speedup", "speedup", "images/sec over the same configuration's median "
           "images/sec on 1 device (`bench.records.grouping.baseline_key`), the median's or the "
           "run's."),
    _field("speedup_ci_low", "The low end of the speedup's interval, of the kind "
           "speedup_interval names.", ("csv",), format="2f"),
    _field("speedup_ci_high", "The high end of that interval.", ("csv",), format="2f"),
    _field("speedup_interval", "Which interval the speedup's and the efficiency's are, by the "
           "side (this row, its 1-device row) with fewer ok runs: none, range (two: the "
           "extreme ratios of any two runs) or 95% bootstrap CI (three or more: the "
           "percentile bootstrap of the ratio of medians).", ("csv",)),
    Column("scaling_efficiency", "effic.", "efficiency", "The speedup over the ideal "
           "(linear) speedup, the device count."),
    _field("efficiency_ci_low", "The low end of the efficiency's interval (the speedup's "
           "over the device count).", ("csv",), format="pct0"),
    _field("efficiency_ci_high", "The high end of that interval.", ("csv",), format="pct0"),
    Column("real_vs_synthetic", "real/syn", "real_syn", "A real-data row's images/sec over "
           "the same configuration's on synthetic data at the same device count.",
           ("csv", *DISPLAY_VIEWS)),
    # telemetry, energy, MFU
    Column("gpu_util_pct", "GPU util %", "0f", "The GPUs' mean utilisation (%) in the timed "
           "window (NVML), the median over ok runs.", ("csv", "html", "loader"),
           _at("telemetry", "gpu_util_mean_pct"), "median"),
    Column("run_cpu_cores", "run cores", "2f", "Busy CPU cores of the run's process tree in "
           "the timed window, the median over ok runs.", ("csv", "html", "loader"),
           _at("telemetry", "host", "run_cpu_cores_mean"), "median"),
    Column("joules_per_image", "J/image", "3f", "The GPUs' energy per image in the timed "
           "window (NVML), the median over ok runs.", ("csv", "html", "loader"),
           _at("telemetry", "joules_per_image"), "median"),
    Column("mfu", "MFU", "mfu", "Model FLOPs utilisation: training FLOPs (3 x the model's "
           "forward FLOPs per image) x images/sec over the device's measured matmul peak at "
           "the run's precision, the median over ok runs.", run=_at("mfu", "mfu"),
           over_runs="median"),
    Column("peak_flops", "", "sci", "The measured matmul peak (FLOP/s) MFU is against "
           "(peaks.json).", ("csv", "loader"), _at("mfu", "peak_flops"), "median"),
    Column("mfu_flops_source", "", "text", "Where MFU's forward FLOPs per sample came from: "
           "a built-in model's spec (the standard count) or, for a user's model, the run's own "
           "count with its framework.", ("csv", "loader"), _at("mfu", "flops_source"),
           "first"),
    # tokens (token models) and memory
    Column("tokens_per_sec", "tok/s", "1f", "Tokens per second over the timed window, a token "
           "model's: samples/sec (images_per_sec) x its tokens per sample; the median over ok "
           "runs (`bench.run.launch.derive_throughput`).", (*SUMMARY_VIEWS, "record"),
           over_runs="median", optional=True),
    Column("tokens_per_sec_per_device", "tok/s/dev", "1f", "Tokens per second per device "
           "(tokens/sec over the run's device count), the median over ok runs.",
           ("csv", "html", "loader", "record"), over_runs="median", optional=True),
    Column("samples_per_sec", "", "1f", "Samples (images, token sequences) per second: "
           "images_per_sec under its general name, set on ok benchmark runs.",
           ("csv", "loader", "record"), over_runs="median"),
    Column("tokens_per_sample", "", "int", "Tokens one sample trains on (a token model's "
           "sequence length; None for images), as the child reports it or from the model's "
           "spec.", ("csv", "loader", "record", "child"), over_runs="config"),
    Column("flops_per_token", "", "sci", "Training FLOPs per token of a token model: 3 x "
           "the forward FLOPs per sample (the standard count, or a user's model's own count) "
           "over its tokens per sample.", ("csv", "loader", "record"), over_runs="first"),
    Column("memory_peak_bytes", "mem/dev", "bytes", "The most memory any one device of a run "
           "held in its timed window (its memory_per_device, from the framework's allocator; "
           "on CPU the rank's process's peak resident memory: memory_source says which), the "
           "median over ok runs; - where nothing was measured.", run=_memory_peak,
           over_runs="median", optional=True),
    Column("model_state_bytes", "state", "bytes", "The model state one device holds: "
           "parameters, gradients and optimizer state (the record's model_state, read from "
           "the framework's objects).", ("csv", "html", "loader"),
           _at("model_state", "total_bytes"), "median", optional=True),
    Column("state_per_device_bytes", "state/dev", "bytes", "The most model state one device "
           "holds: the largest params + grads + optimizer over the devices of the record's "
           "state_bytes_per_device (read from the framework's shards: a sharded strategy's "
           "1/N shows here), the median over ok runs; - where the runner does not report it.",
           ("csv", "table", "html", "loader"), _state_per_device, "median", optional=True),
    Column("precision_policy_summary", "policy", "text", "The precision policy the run "
           "followed in a few words (contract/precision_policy.summary of its "
           "precision_policy: compute, params, reduce dtypes, master weights, loss scaling; "
           "'(differs)' where it is not the harness's, '(declared)' where not read back).",
           ("csv", "html", "loader"), _policy_summary, "first", optional=True),
    # time to accuracy (mode converge, runners/converge.py)
    Column("final_accuracy", "acc", "pct1", "Mode converge: the held-out top-1 accuracy after "
           "the last epoch trained, the median over ok runs (per run, its own).",
           (*SUMMARY_VIEWS, "record", "child"), over_runs="median", optional=True),
    Column("best_accuracy", "", "pct1", "Mode converge: the best held-out accuracy of any "
           "epoch, the median over ok runs.", ("csv", "loader", "record", "child"),
           over_runs="median", optional=True),
    Column("epochs_to_target", "ep", "int", "Mode converge: the first epoch whose held-out "
           "accuracy reached target_accuracy (null when none did: target_reason says why), "
           "the median over ok runs.", (*SUMMARY_VIEWS, "record", "child"),
           over_runs="median", optional=True),
    Column("time_to_target_s", "to target", "secs", "Mode converge: wall time from the first "
           "training step to the end of the evaluation that reached target_accuracy, "
           "evaluations included (null when not reached), the median over ok runs.",
           (*SUMMARY_VIEWS, "record", "child"), over_runs="median", optional=True),
    Column("runs_reached", "", "int", "Mode converge: ok runs of the configuration that "
           "reached the target.", ("csv",), over_runs=lambda vs: sum(
               1 for v in vs if isinstance(v, (int, float))) if vs else None),
    _child("target_reason", (*RUN_VIEWS, "child")),
    _child("curve"),
    *_children("epochs_run", "train_time_s", "eval_time_s", "converge_time_s",
               "moving_stats_finite", views=(*RUN_VIEWS, "child")),
    Column("memory_source", "", "text", "What memory_per_device is, as the child read it "
           "(runners/memory.py): the allocator's peak over the timed window, the peak since "
           "the process started, or the process's resident memory, and any rank missing.",
           ("csv", "loader", "record", "child"), over_runs="first"),
    # flags (bench/records/trust.py): each meaning is the legend the terminal table prints under it
    Column("unstable", "unstable", "flag", "a run's mean of per-step rates and its images/sec "
           "(all images over the whole window) differ by more than 2%: some steps stalled",
           ("csv", *DISPLAY_VIEWS)),
    Column("not_steady", "not-steady", "flag", "a run's first fifth of timed steps ran below "
           "90% of the rest (under 10 steps: its first step below half): raise warmup_steps",
           ("csv", *DISPLAY_VIEWS)),
    Column("noisy", "noisy", "flag", "images/sec varied across repeats by more than the CV "
           "target (until_stable.target_cv, else 5%)", ("csv", *DISPLAY_VIEWS)),
    Column("starved", "STARVED", "flag", "the GPUs' mean utilisation in the timed window was "
           "below the threshold (telemetry.starved_below_pct) and no host thread was busy "
           "throughout: input or synchronisation starves them",
           run=_at("telemetry", "starved"), over_runs="any"),
    Column("host_bound", "HOST-BOUND", "flag", "the GPUs were below the STARVED threshold "
           "while one host thread kept 90% of a core or more through the timed window: the "
           "host's own per-step work (Python, kernel launches) sets the pace; a larger batch, "
           "compilation or CUDA graphs give the GPU more per launch",
           run=_at("telemetry", "host_bound"), over_runs="any"),
    Column("contended", "CONTENDED", "flag", "other processes used more than a quarter of the "
           "machine's CPUs in a run's timed window, or held its GPUs; the record's "
           "telemetry.contention names them (docs/RELIABILITY.md)", over_runs="any"),
    Column("over_peak", "MFU>100%", "flag", "a run achieved more FLOP/s than the measured "
           "peak, i.e. its throughput is above the compute bound (the devices' peak over the "
           "training FLOPs per sample): impossible, so the peak (a probe that shared the "
           "machine, another CPU's) or the model's FLOP count is wrong, and the MFU is no "
           "result (shown with ?)",
           run=_at("mfu", "over_peak"), over_runs="any"),
    Column("speedup_impossible", "SPEEDUP>N", "flag", "the speedup is above the device count "
           "by more than 5% (efficiency over 105%): N devices cannot do more than N times one "
           "device's work, so the 1-device baseline ran slow or the runs did different work; "
           "speedup and efficiency are shown with ? and are no result",
           ("csv", *DISPLAY_VIEWS)),
    Column("baseline_suspect", "BASELINE-SUSPECT", "flag", "the 1-device run the speedup and "
           "efficiency divide by was CONTENDED or unstable (baseline_flags says which): they "
           "are marked (baseline contended) and are not the device's own scaling",
           ("csv", *DISPLAY_VIEWS)),
    _field("baseline_flags", "The flags of the 1-device row under this row's speedup that make "
           "it no baseline (contended, unstable), space-separated; empty where none is on or "
           "the row is its own baseline.", ("csv",)),
    Column("input_bound", "INPUT-BOUND", "flag", "real data below 90% of the same run on "
           "synthetic data (the input pipeline sets the pace)", ("csv",)),
    Column("flags", "flags", "flags", "The row's flags that are on (the flag columns), each "
           "explained under the table.", DISPLAY_VIEWS),
    Column("reason", "", "text", "Why a run was not ok, in one line (the summary: the first "
           "reason among its runs).", ("csv", "loader", "record")),
    # per run only: the record and the loader
    _field("schema_version", "The record's schema version (`bench.records.store.SCHEMA_VERSION`).",
           ("record",)),
    _setting("run_id", RUN_VIEWS),
    _setting("sweep_id", RUN_VIEWS),
    _setting("family", RUN_VIEWS),
    _setting("repeat", RUN_VIEWS),
    _setting("warmup_steps", ("loader",)),
    _setting("measure_steps", ("loader",)),
    _setting("options", ("record",)),
    _setting("mode"),
    _setting("dataset"),
    *_children("step_times_s", "memory_per_device", "device_peak_bytes", "memory_baseline",
               "model_state", "state_bytes_per_device", "state_bytes_global", "state_source",
               "state_granularity_bytes"),
    _field("state_check", "The parent's check of state_bytes_per_device against what the "
           "runner's strategy shards (bench/records/state_check.py): per part its global "
           "size, the most one device holds, and whether 1/N or a replica was expected.",
           ("record",)),
    _child("precision_policy"),
    *_children("samples", "first_loss", "last_loss", "window_start", "window_end",
               views=(*RUN_VIEWS, "child")),
    _field("step_time_median_s", "The median timed step (s).", ("loader",), _step_time_median),
    _field("layout", "The data layout the runner used, as it reports.", ("loader",),
           _at("result", "layout")),
    _field("environment", "The host, its GPUs and the child's framework versions (the loader "
           "has a column `env_<key>` each and `version_<framework>`).", ("record",)),
    _field("wall_time_s", "The run's wall time, child start to end (s).", ("loader",)),
    _field("started_at", "When the run started (ISO 8601, UTC).", RUN_VIEWS),
    _field("finished_at", "When its record was written (ISO 8601, UTC).", RUN_VIEWS),
    _field("log_path", "The child's stdout and stderr.", RUN_VIEWS),
    _field("energy_j", "The GPUs' energy in the timed window (J, NVML).", ("loader",),
           _at("telemetry", "energy_j")),
    _field("run_rss_max_bytes", "The run's process tree's peak resident memory.", ("loader",),
           _at("telemetry", "host", "run_rss_max_bytes")),
    _field("host_cpu_util_pct", "The host's mean CPU utilisation in the timed window (%).",
           ("loader",), _at("telemetry", "host", "cpu_util_mean_pct")),
    _field("gpu_mem_peak_bytes", "The most memory any of the run's GPUs held.", ("loader",),
           _gpu_mem_peak),
    _field("telemetry_path", "The run's telemetry series, within the results folder.",
           ("loader",), _at("telemetry", "path")),
)
# a run setting the record holds and no column above lists: per run, the record only
COLUMNS += tuple(_setting(key) for key in settings.recorded()
                 if key not in {c.key for c in COLUMNS})


def of_view(view: str) -> tuple[Column, ...]:
    """The columns of a view, in order (read from COLUMNS now, not at import)."""
    return tuple(c for c in COLUMNS if view in c.views)


def keys(view: str) -> tuple[str, ...]:
    """The keys of a view's columns, in order."""
    return tuple(c.key for c in of_view(view))


def column(key: str) -> Column:
    """The column of a key (KeyError if none)."""
    for c in COLUMNS:
        if c.key == key:
            return c
    raise KeyError(key)


def run_value(col: Column, rec: Mapping[str, Any]) -> Any:
    """One run's value of a column, read from its record."""
    return col.run(rec) if col.run else rec.get(col.key)


def summary_values(records: list[dict[str, Any]], ok: list[dict[str, Any]]) -> dict[str, Any]:
    """A configuration's values of the csv columns the registry combines over its runs
    (over_runs): records are all its runs, ok those whose status is ok."""
    out = {}
    for col in of_view("csv"):
        if col.over_runs == "config":
            out[col.key] = run_value(col, records[0])
        elif col.over_runs is not None:
            combine = (AGGREGATES[col.over_runs] if isinstance(col.over_runs, str)
                       else col.over_runs)
            out[col.key] = combine([run_value(col, r) for r in ok])
    return out


# -- how the tables show a value -------------------------------------------------------------

class Format(NamedTuple):
    """How a column's value is shown: what results/README.md says, and the renderer, from the
    column, the summary row and the view (table or html)."""

    describe: str
    render: Callable[[Column, Mapping[str, Any], str], str]


def _number(spec: str, suffix: str = "") -> Callable[[Column, Mapping[str, Any], str], str]:
    def render(col: Column, row: Mapping[str, Any], view: str) -> str:
        value = row.get(col.key)
        return format(value, spec) + suffix if _numbers([value]) else "-"
    return render


def _text(col: Column, row: Mapping[str, Any], view: str) -> str:
    value = row.get(col.key)
    return "-" if value is None or value == "" else str(value)


def _devices(col: Column, row: Mapping[str, Any], view: str) -> str:
    kind = "vcpu" if row.get("virtual_devices") else row.get("device")
    nodes = row.get("num_nodes") or 1
    if nodes > 1:  # 2 nodes x 4 devices: "2x4 gpu" (8 in all)
        return f"{nodes}x{row[col.key] // nodes} {kind}"
    return f"{row[col.key]} {kind}"


def _placed_cell(col: Column, row: Mapping[str, Any], view: str) -> str:
    n = row.get(col.key)
    return "-" if n is None else f"{n}" + ("*" if row.get("placement_collapsed") else "")


def _batch(col: Column, row: Mapping[str, Any], view: str) -> str:
    return (f"{row['batch_size_per_device']}/dev" if row.get("scaling") == "weak"
            else f"{row['global_batch_size']} glob")


def _status(col: Column, row: Mapping[str, Any], view: str) -> str:
    total = row.get("runs_total") or 0
    return str(row[col.key]) + (f" ({row['runs_ok']}/{total})" if total > 1 else "")


# how an interval's cell names its kind (bench/analysis/stats.py's; the legend under the table
# says what each is)
INTERVAL_TAGS = {"range": "range", "95% bootstrap CI": "CI"}


def _interval(col: Column, row: Mapping[str, Any], view: str) -> str:
    low, high = row.get(col.key), row.get(col.key.removesuffix("_low") + "_high")
    if _numbers([low, high]) != [low, high]:
        return "-"
    tag = INTERVAL_TAGS.get(row.get("interval") or "")
    return (f"{tag} " if tag else "") + f"{low:.1f}-{high:.1f}"


def _real_syn(col: Column, row: Mapping[str, Any], view: str) -> str:
    ratio = row.get(col.key)
    if ratio is None:
        return "-"
    return f"{ratio:.2f}" + (" INPUT-BOUND" if row.get("input_bound") else "")


def _bytes(col: Column, row: Mapping[str, Any], view: str) -> str:
    value: Any = row.get(col.key)
    if not _numbers([value]):
        return "-"
    return f"{value / 2**30:.2f} GiB" if value >= 2**30 else f"{value / 2**20:.1f} MiB"


def _seconds(col: Column, row: Mapping[str, Any], view: str) -> str:
    value: Any = row.get(col.key)
    if not _numbers([value]):
        return "-"
    return f"{value:.1f} s" if value < 60 else f"{int(value // 60)}:{int(value % 60):02d}"


def _doubted(spec: str, suffix: str = "") -> Callable[[Column, Mapping[str, Any], str], str]:
    """A speedup or efficiency cell: the number, then ? when speedup_impossible (the flags
    cell names it), and the 1-device baseline's doubts (baseline_flags) in brackets: a
    flagged figure is never shown plain."""
    number = _number(spec, suffix)

    def render(col: Column, row: Mapping[str, Any], view: str) -> str:
        text = number(col, row, view)
        if text == "-":
            return text
        if row.get("speedup_impossible"):
            text += "?"
        if row.get("baseline_flags"):
            text += f" (baseline {', '.join(str(row['baseline_flags']).split())})"
        return text
    return render


def _mfu(col: Column, row: Mapping[str, Any], view: str) -> str:
    text = _number(".1%")(col, row, view)
    return text + "? over peak" if row.get("over_peak") and text != "-" else text


def _flags(col: Column, row: Mapping[str, Any], view: str) -> str:
    return ",".join(c.header for c in flags_on(row, view)) or "-"


FORMATS: dict[str, Format] = {
    "text": Format("as it is", _text),
    "int": Format("an integer", _text),
    "bool": Format("True or False", _text),
    "0f": Format("no decimals", _number(".0f")),
    "1f": Format("1 decimal", _number(".1f")),
    "2f": Format("2 decimals", _number(".2f")),
    "3f": Format("3 decimals", _number(".3f")),
    "sci": Format("3 significant digits", _number(".3g")),
    "x2": Format("2 decimals and x (1.80x)", _number(".2f", "x")),
    "speedup": Format("2 decimals and x (1.80x); ? when speedup_impossible, (baseline "
                      "contended) when baseline_suspect: `10.90x? (baseline contended)`",
                      _doubted(".2f", "x")),
    "efficiency": Format("a percentage (90%), marked as the speedup is: `545%? (baseline "
                         "contended)`", _doubted(".0%")),
    "mfu": Format("a percentage, 1 decimal (31.0%); `120.0%? over peak` when over_peak",
                  _mfu),
    "pct0": Format("a percentage (90%)", _number(".0%")),
    "pct1": Format("a percentage, 1 decimal (31.0%)", _number(".1%")),
    "secs": Format("seconds, 1 decimal, as m:ss from a minute (74:10)", _seconds),
    "ci1": Format("its kind (range, CI: `interval`), then low-high, 1 decimal", _interval),
    "devices": Format("count and kind (2 vcpu: virtual CPU devices, 2 gpu; 2x4 gpu: 2 nodes "
                      "of 4)", _devices),
    "placed": Format("a count, * when the framework collapsed the devices (its note under "
                     "the table)", _placed_cell),
    "batch": Format("the batch held fixed: 32/dev (weak scaling) or 64 glob (strong)",
                    _batch),
    "runner": Format("the runner, then the options its configuration varies in (`deepspeed "
                     "stage=3`)", lambda col, row, view: runner_label(row)),
    "data_label": Format("`synthetic` or `real-w<loader workers>`",
                         lambda col, row, view: data_label(row)),
    "status": Format("the status, (ok runs/runs) when repeated", _status),
    "real_syn": Format("2 decimals, INPUT-BOUND when input-bound", _real_syn),
    "flag": Format("True or False; the tables name it under flags when True", _text),
    "flags": Format("the headers of the flags that are on, or -", _flags),
    "bytes": Format("bytes as GiB (2 decimals) from 1 GiB, else MiB (1 decimal); bytes in "
                    "summary.csv", _bytes),
}


def cells(view: str, rows: list[Mapping[str, Any]] | None = None) -> tuple[Column, ...]:
    """The cells of a table (table or html), in order: its columns but the flags, which
    are shown together in the flags cell; given the table's rows, an optional column only
    when some row has a value."""
    return tuple(c for c in of_view(view) if c.format != "flag" and not (
        rows is not None and c.optional and all(r.get(c.key) is None for r in rows)))


def cell(col: Column, row: Mapping[str, Any], view: str) -> str:
    """A summary row's cell of a column in a table view, as its format shows it."""
    return FORMATS[col.format].render(col, row, view)


def flags(view: str | None = None) -> tuple[Column, ...]:
    """The flag columns (of a view, or all), in order."""
    return tuple(c for c in COLUMNS if c.format == "flag" and (view is None or view in c.views))


def flags_on(row: Mapping[str, Any], view: str | None = None) -> list[Column]:
    """The flag columns (of a view, or all) that are on in a summary row."""
    return [c for c in flags(view) if row.get(c.key)]


# -- report.html's core table, its details table and its legend ------------------------------

# The core table's columns (report.html: it fits 1,280 px); the html view's other cells go to
# the collapsed details table.
CORE = ("runner", "model", "num_devices", "status", "images_per_sec", "images_per_sec_ci_low",
        "speedup", "scaling_efficiency", "mfu", "memory_peak_bytes", "flags")
# What a legend says of a column whose meaning describes one end of a pair.
LEGEND_MEANING = {
    "images_per_sec_ci_low": "The interval of img/s over repeats, of the kind it names: range "
                             "(2 repeats: their lowest and highest) or CI (3 or more: the 95% "
                             "percentile bootstrap of the median); - with one run.",
}


def core_and_details(rows: list[Mapping[str, Any]]) -> tuple[tuple[Column, ...],
                                                             tuple[Column, ...]]:
    """The html view's cells (cells("html", rows)) split into the core table's, in CORE's
    order, and the rest, in the registry's."""
    shown = cells("html", rows)
    core = tuple(c for key in CORE for c in shown if c.key == key)
    return core, tuple(c for c in shown if c not in core)


def legend(cols: tuple[Column, ...]) -> list[tuple[str, str]]:
    """(header, definition) of each column, from its meaning and its format's description;
    the flags cell's entry is followed by each flag's."""
    out = []
    for col in cols:
        meaning = LEGEND_MEANING.get(col.key, col.meaning)
        out.append((col.header, f"{meaning.rstrip('.')}. Shown: "
                                f"{FORMATS[col.format].describe}."))
        if col.format == "flags":
            out += [(flag.header, flag.meaning) for flag in flags("html")]
    return out


# -- results/README.md -----------------------------------------------------------------------

def _md(text: str) -> str:
    """Text for a markdown table cell: | escaped, and < > outside `code` spans too."""
    parts = text.replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;")
                    for i, p in enumerate(parts))


def markdown() -> str:
    """The column tables of results/README.md."""
    shown = [c for c in COLUMNS if set(c.views) & {"csv", *DISPLAY_VIEWS}]
    rest = [c for c in COLUMNS if c not in shown]
    lines = ["Where a column is (`in`):", "", *(f"- `{v}`: {text}" for v, text in VIEWS.items()),
             "", "Summary columns, in the order of summary.csv and of the tables' cells:", "",
             "| column | header | shown as | in | meaning |", "|---|---|---|---|---|"]
    lines += [f"| `{c.key}` | {_md(c.header)} | {_md(FORMATS[c.format].describe)} | "
              f"{' '.join(c.views)} | {_md(c.meaning)} |" for c in shown]
    lines += ["", "Per run only (the loader's DataFrame and the record):", "",
              "| field | in | meaning |", "|---|---|---|"]
    lines += [f"| `{c.key}` | {' '.join(c.views)} | {_md(c.meaning)} |" for c in rest]
    return "\n".join(lines)


BLOCK = Block("python -m bench.records.columns", README, BEGIN, END, markdown)


def with_markdown(text: str) -> str:
    """text (results/README.md) with markdown() between its BEGIN and END markers."""
    return BLOCK.into(text)


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.records.columns --markdown [PATH]`: write the column tables into PATH
    (results/README.md) between its markers; --check: exit 1 if PATH is out of date."""
    return BLOCK.main(argv, main.__doc__)


if __name__ == "__main__":
    sys.exit(main())
