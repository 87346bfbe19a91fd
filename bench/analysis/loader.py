"""One loader for notebooks and scripts: a results folder as a tidy pandas DataFrame."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from bench.analysis.stats import summarise
from bench.records import columns
from bench.records.grouping import GROUP_FIELDS, READERS, baseline_key, config_key
from bench.records.store import load_records
from bench.records.trust import doubts

# The grouping key's fields (bench.records.grouping) are columns too: data_label (synthetic or
# real-w<workers>), batch (the one held fixed across device counts) and mode besides the
# registry's. Group on these to get summary.csv's configurations:
#   df.groupby([*GROUP_COLUMNS, "num_nodes", "num_devices"])
GROUP_COLUMNS = GROUP_FIELDS


def frame_columns() -> list[str]:
    """The DataFrame's fixed columns: the loader view of the column registry
    (bench/records/columns.py), then the grouping key's fields it lacks. Besides these, one column
    per environment key (env_<key>, env_gpus), framework version (version_<name>) and runner
    option (opt_<name>)."""
    keys = list(columns.keys("loader"))
    return keys + [f for f in GROUP_COLUMNS if f not in keys]


def _flatten(rec: dict[str, Any]) -> dict[str, Any]:
    row = {c.key: columns.run_value(c, rec) for c in columns.of_view("loader")}
    row.update({f: read(rec) for f, read in READERS.items()})
    env = rec.get("environment") or {}
    for key in ("host", "os", "cpu_model", "cpu_isa", "cpu_cores", "memory_bytes", "python",
                "harness_commit"):
        row[f"env_{key}"] = env.get(key)
    row["env_gpus"] = ", ".join(str(g.get("name") or "?") for g in env.get("gpus") or []) or None
    lock = env.get("lock") or {}
    for key in ("file", "sha256", "installer", "locked"):  # which pinned environment ran it
        row[f"env_lock_{key}"] = lock.get(key)
    for name, version in (env.get("framework") or {}).items():
        row[f"version_{name}"] = version
    for key, value in (rec.get("options") or {}).items():
        row[f"opt_{key}"] = value
    return row


def load_results(results_dir: str | Path) -> pd.DataFrame:
    """One row per run: the loader view of the column registry (bench/records/columns.py: the
    record's scalar fields, telemetry, MFU, placement), the grouping key's fields, the
    environment and options flattened, and the run's speedup and scaling efficiency against
    the 1-device throughput of its configuration: the median over repeats, summary.csv's
    images_per_sec of the row at bench.records.grouping.baseline_key. The median of a
    configuration's per-run speedups is summary.csv's speedup. `doubts`: why its
    configuration's figures are flagged, not results (bench.records.trust.doubts: an impossible
    speedup, a contended or unstable baseline, a throughput above the compute bound), the
    report's flags; None when none. Damaged records (not JSON, of the wrong types, ...) are left
    out: bench.records.store.scan_records names them."""
    records = load_records(Path(results_dir))
    df = pd.DataFrame([_flatten(r) for r in records])
    if df.empty:
        return pd.DataFrame(columns=[*frame_columns(), *DERIVED])
    rows = {config_key(row): row for row in summarise(records)}
    base = [(rows.get(baseline_key(r)) or {}).get("images_per_sec") for r in records]
    df["speedup"] = [ips / b if ips is not None and b else None
                     for ips, b in zip(df["images_per_sec"], base, strict=True)]
    df["scaling_efficiency"] = [s / n if s is not None else None
                                for s, n in zip(df["speedup"], df["num_devices"], strict=True)]
    df["doubts"] = ["; ".join(doubts(rows.get(config_key(r)) or {}).values()) or None
                    for r in records]
    return df


DERIVED = ("speedup", "scaling_efficiency", "doubts")  # load_results' columns past the registry's
HOST_COLUMNS = ("env_host", "env_os", "env_cpu_model", "env_cpu_cores", "env_gpus")


def runs_line(df: pd.DataFrame) -> str:
    """How many runs and their statuses, in words: "1 run: 1 timeout", "12 runs: 12 ok"."""
    counts = df["status"].value_counts()
    return (f"{len(df)} run{'' if len(df) == 1 else 's'}: "
            + ", ".join(f"{n} {status}" for status, n in counts.items()))


def hosts(df: pd.DataFrame) -> pd.DataFrame:
    """One row per host (HOST_COLUMNS) with its runs and each framework's versions as
    recorded: a record without versions (a run killed before it said) joins its host's row
    rather than splitting it."""
    versions = sorted(c for c in df.columns if c.startswith("version_"))
    out = df.groupby(list(HOST_COLUMNS), dropna=False).agg(
        runs=("status", "size"),
        **{v: (v, lambda s: ", ".join(sorted({str(x) for x in s.dropna()})) or None)
           for v in versions})
    return out.reset_index()
