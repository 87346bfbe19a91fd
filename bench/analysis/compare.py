"""`run_bench.py compare BASE NEW`: did NEW get slower or faster than BASE, configuration by
configuration, and can the difference be told from noise?

What is compared
    The benchmark-mode records of both results folders, grouped by bench.records.grouping.config_key
    (runner, variant, model, data, precision, scaling, batch, device kind, node and device
    counts): the
    rows of summary.csv. A side's figure is the median images/sec of the configuration's ok
    runs (summary.csv's); a row's ratio is NEW / BASE of the two medians.

The interval: a 95% percentile bootstrap of that ratio (with 2 repeats a side, called what it
is: the range, the extreme ratios of any two runs; bench.analysis.stats.ratio_interval)
    BASE and NEW are independent sweeps, so each side is resampled on its own and every draw
    takes the ratio of the two resampled figures (bench.records.trust.BOOTSTRAP_SAMPLES draws,
    seeded:
    the same folders always give the same interval). Each row says where its interval came
    from ("interval from"):

    - repeats: a side with two or more ok runs resamples its runs' images/sec (the median of
      each draw; bench.records.trust.ratio_ci when both sides have repeats). Runs are separate
      processes, so their spread holds what varies between runs: process start, memory
      placement, thread scheduling, what else the machine was doing.
    - steps of one run: a side with a single ok run would give one value to resample and a
      zero-width interval, which calls every difference significant. Instead that run's timed
      steps (step_times_s) are resampled: a draw is the run's images/sec times (sum of its
      step times / sum of the drawn step times), i.e. the record's own estimator (all images
      over the whole window; per-step images/sec = global batch / step time, combined as the
      window does) recomputed on resampled steps, so the interval is centred on the figure
      the record reports. Not the median of per-step rates: that estimator ignores stalls
      the headline figure paid for, and its interval could exclude the reported figure.
      Neighbouring steps are not independent (a burst of background work slows several in a
      row), so steps are drawn in circular blocks of about n^(1/3) consecutive steps (a
      moving-block bootstrap), and with steps_per_execution k, where the runner timed k steps
      at once and recorded k equal shares, the k shares are one observation (resampling them
      as k would claim k times the evidence there is). A run without step times gives no
      interval: the row is "inconclusive".

What a sceptical reader should know (the outputs repeat what applies)
    - An interval from the steps of one run says how well that run's window pins its own
      rate. It leaves out run-to-run variation, usually the larger part, so it is narrower
      than a repeat interval, and a verdict from it says "these two runs differ", not "the
      change made it slower". Gate pull requests on repeats (`--set repeats=5`, or
      until_stable).
    - The percentile bootstrap under-covers on few values: with 2 repeats a side the median
      of a draw takes 3 values. Five repeats a side is a sensible minimum for a gate.
    - Significance is practical, not statistical alone: a change counts only when its whole
      interval lies outside 1 +- threshold, so a real 1% change is "no significant change"
      at 5%, and an interval that straddles a band edge is "no significant change" too (not
      shown either way). That margin also keeps chance verdicts rare across many rows: each
      row is its own 95% interval, with no correction for the number of rows.
    - A run whose timed window other processes shared (the record's `contended`) is named on
      its row: a regression beside it is likely the machine's, not the change's.
    - Across machines a ratio mixes the change with the machine. Where the environments
      differ in GPUs (model and count, links), driver, CUDA driver, CPU (model and cores),
      framework versions (per family, from the records: what each run's child imported) or
      an environment lock, each difference is printed as a warning and written to
      compare.md; host, OS, Python and harness commit are given as context.
    - Settings outside the configuration key (warm-up and timed steps, runner options such
      as xla) are matched as the same configuration, which is how an option change is
      compared, and every difference is listed. The options of an option axis (a sweep's
      `runner_options.<runner>.<option>: [a, b]`, the record's variant) are in the key: each
      variant (deepspeed stage=3) is compared with the same variant on the other side only.

Verdicts: nothing is dropped silently
    - regression: the whole interval below 1 - threshold; improvement: above 1 + threshold;
      no significant change: anything else.
    - regression too: ok in BASE and not ok in NEW (every NEW run, or some NEW runs where
      every BASE run was ok). Stopping a configuration from running is the largest slowdown
      there is, and the status is not trusted to excuse it: "unavailable" is also what a
      new import of a missing module looks like. The row names NEW's status and reason.
    - improvement: failed in BASE, runs in NEW (fixed; no ratio).
    - not compared: failed on both sides, only in BASE, only in NEW. Listed with the reason;
      a configuration missing from one side is a different sweep, not a slower one, but the
      lost coverage is shown.

Exit status: 1 when any row is a regression, else 0; bad input is one line naming the
argument, the value and what is allowed, exit 2 (bench.plan.config.ConfigError).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import textwrap
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.analysis.converge import time_to_target_words
from bench.analysis.stats import BOOTSTRAP_CI, interval_kind, interval_name
from bench.analysis.stats import ratio_interval as stats_ratio_interval
from bench.atomic import write_text_atomic
from bench.errors import ConfigError
from bench.plotting import pyplot, save
from bench.records.grouping import batch_of, config_key, data_label, mode_of, nodes_of, runner_label
from bench.records.store import folder_damage, load_records, read_environment, runs_dir
from bench.records.trust import BOOTSTRAP_SAMPLES, CONFIDENCE, quantile
from bench.text_table import aligned

REGRESSION, IMPROVEMENT = "regression", "improvement"
NO_CHANGE, INCONCLUSIVE, NOT_COMPARED = "no significant change", "inconclusive", "not compared"
REPEATS, STEPS = "repeats", "steps"
LOCK = "environment lock"
MD_NAME, CHART_NAME = "compare.md", "compare.png"
# seeds of the two sides' draws where steps are resampled (ratio_ci has its own)
BASE_SEED, NEW_SEED = 1, 2
ALLOWED_FOLDER = "a results folder written by a sweep (with runs/)"
STEPS_CAVEAT = ("an interval from the steps of one run holds that run's own step-to-step "
                "noise, not run-to-run variation: it is narrower than a repeat interval; "
                "confirm a verdict from it with repeats (--set repeats=5)")
CONTENDED_CAVEAT = ("contended: other processes used the machine during a run's timed window "
                    "(the record's contended); a change beside it may be the machine's, not "
                    "the change's")
FEW_REPEATS_CAVEAT = ("with fewer than 5 repeats a side the interval (a range with 2, a "
                      "bootstrap CI from 3) tends to be too narrow")


@dataclass
class Side:
    """One folder's runs of one configuration."""
    records: list[dict[str, Any]]

    @property
    def ok(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r.get("status") == "ok"
                and isinstance(r.get("images_per_sec"), (int, float))
                and r["images_per_sec"] > 0]

    @property
    def failed(self) -> list[dict[str, Any]]:
        ok = {id(r) for r in self.ok}
        return [r for r in self.records if id(r) not in ok]

    @property
    def median(self) -> float | None:
        ips = [r["images_per_sec"] for r in self.ok]
        return statistics.median(ips) if ips else None

    @property
    def contended(self) -> int:
        return sum(1 for r in self.ok if r.get("contended"))

    def failure(self) -> str:
        """The first not-ok run's status and reason, with how many runs were not ok."""
        bad = self.failed
        first = bad[0]
        what = f"{first.get('status')}: {first.get('reason') or 'no reason recorded'}"
        return what if len(bad) == len(self.records) else \
            f"{len(bad)} of {len(self.records)} runs not ok ({what})"


@dataclass
class Row:
    """One configuration's comparison."""
    key: tuple[Any, ...]
    label: str
    base: Side | None
    new: Side | None
    verdict: str = NOT_COMPARED
    ratio: float | None = None
    low: float | None = None
    high: float | None = None
    sources: tuple[str, str] | None = None  # (BASE's, NEW's): REPEATS or STEPS
    interval_from: str = "-"
    notes: list[str] = field(default_factory=list)


@dataclass
class Comparison:
    rows: list[Row]
    threshold: float
    environment: list[tuple[str, str, str]]  # (what, BASE, NEW): the warnings
    context: list[tuple[str, str, str]]      # host, OS, Python, commit (never a warning)
    settings: list[str]                       # settings outside the configuration key
    missing_env: list[str]                    # sides without a readable environment.json

    def count(self, verdict: str) -> int:
        return sum(1 for r in self.rows if r.verdict == verdict)

    @property
    def uses_steps(self) -> bool:
        return any(r.sources and STEPS in r.sources for r in self.rows if r.low is not None)

    @property
    def few_repeats(self) -> bool:
        return any(r.sources == (REPEATS, REPEATS) and r.base and r.new
                   and min(len(r.base.ok), len(r.new.ok)) < 5 for r in self.rows)


# ---------------------------------------------------------------- the interval

def step_observations(rec: dict[str, Any]) -> list[float]:
    """A run's timed step times as independent observations: with steps_per_execution k the
    runner recorded each timed call as k equal shares, merged back into one here."""
    times = [float(t) for t in rec.get("step_times_s") or []
             if isinstance(t, (int, float)) and math.isfinite(t) and t > 0]
    per_call = (rec.get("options") or {}).get("steps_per_execution") or 1
    if isinstance(per_call, int) and per_call > 1 and len(times) % per_call == 0:
        times = [sum(times[i:i + per_call]) for i in range(0, len(times), per_call)]
    return times


def block_length(n: int) -> int:
    """Steps per block of the moving-block bootstrap: about n^(1/3)."""
    return max(1, round(n ** (1 / 3)))


def step_draws(rec: dict[str, Any], rng: random.Random,
               samples: int = BOOTSTRAP_SAMPLES) -> list[float] | None:
    """Bootstrap draws of one run's images/sec from its own steps (circular blocks); None
    with fewer than two step observations."""
    obs = step_observations(rec)
    n = len(obs)
    if n < 2:
        return None
    size, total, draws = block_length(n), sum(obs), []
    for _ in range(samples):
        drawn, taken = 0.0, 0
        while taken < n:
            start = rng.randrange(n)
            for j in range(min(size, n - taken)):
                drawn += obs[(start + j) % n]
            taken += size
        draws.append(rec["images_per_sec"] * total / drawn)
    return draws


def repeat_draws(values: Sequence[float], rng: random.Random,
                 samples: int = BOOTSTRAP_SAMPLES) -> list[float]:
    """Bootstrap draws of the median of a side's repeats."""
    return [statistics.median(rng.choices(values, k=len(values))) for _ in range(samples)]


def side_draws(side: Side, seed: int) -> tuple[str, list[float] | None]:
    """A side's source and its bootstrap draws: repeats with two ok runs or more, else the
    steps of its one run."""
    rng = random.Random(seed)
    ok = side.ok
    if len(ok) >= 2:
        return REPEATS, repeat_draws([r["images_per_sec"] for r in ok], rng)
    return STEPS, step_draws(ok[0], rng)


def ratio_interval(base: Side, new: Side) -> tuple[tuple[str, str], float | None, float | None]:
    """The interval of NEW/BASE median images/sec and each side's source: from repeats by the
    summary's rule (bench.analysis.stats.ratio_interval: the range with 2 a side, the 95%
    bootstrap CI from 3), else the 95% bootstrap CI with a side's steps."""
    if len(base.ok) >= 2 and len(new.ok) >= 2:
        low, high, _ = stats_ratio_interval([r["images_per_sec"] for r in new.ok],
                                            [r["images_per_sec"] for r in base.ok])
        return (REPEATS, REPEATS), low, high
    base_src, base_draws = side_draws(base, BASE_SEED)
    new_src, new_draws = side_draws(new, NEW_SEED)
    if base_draws is None or new_draws is None:
        return (base_src, new_src), None, None
    ratios = sorted(n / b for n, b in zip(new_draws, base_draws, strict=True))
    tail = (1 - CONFIDENCE) / 2
    return (base_src, new_src), quantile(ratios, tail), quantile(ratios, 1 - tail)


def describe_sources(sources: tuple[str, str], base: Side, new: Side) -> str:
    """Where an interval came from and what it is, in words: repeats (n vs m), steps of one
    run (k vs l steps), or each side's own when they differ; then its name (range (2
    repeats), 95% bootstrap CI)."""
    def one(src: str, side: Side) -> str:
        return (f"{len(side.ok)} repeats" if src == REPEATS
                else f"steps of one run ({len(step_observations(side.ok[0]))})")

    if sources == (REPEATS, REPEATS):
        kind = interval_kind(min(len(base.ok), len(new.ok)))
        return f"repeats ({len(base.ok)} vs {len(new.ok)}): {interval_name(kind)}"
    if sources == (STEPS, STEPS):
        return (f"steps of one run ({len(step_observations(base.ok[0]))} vs "
                f"{len(step_observations(new.ok[0]))}): {BOOTSTRAP_CI}")
    return f"BASE {one(sources[0], base)}, NEW {one(sources[1], new)}: {BOOTSTRAP_CI}"


# ---------------------------------------------------------------- verdicts

def verdict_of(low: float | None, high: float | None, threshold: float) -> str:
    if low is None or high is None:
        return INCONCLUSIVE
    if high < 1 - threshold:
        return REGRESSION
    if low > 1 + threshold:
        return IMPROVEMENT
    return NO_CHANGE


def compare_row(key: tuple[Any, ...], base: Side | None, new: Side | None,
                threshold: float) -> Row:
    row = Row(key, label_of((base or new).records[0]), base, new)  # type: ignore[union-attr]
    if base is not None and new is not None and not (base.ok and new.ok) and any(
            r.get("mode") == "converge" for r in base.records + new.records):
        row.notes.append("time to accuracy: " + "; ".join(
            f"{name} {time_to_target_words(side.records)}" for name, side in (("BASE", base),
                                                                              ("NEW", new))))
    if base is None or new is None:
        row.notes.append("only in BASE" if new is None else "only in NEW")
        return row
    if not base.ok and not new.ok:
        row.notes.append(f"failed on both sides; NEW {new.failure()}")
        return row
    if not new.ok:
        row.verdict = REGRESSION
        row.notes.append(f"ok in BASE, failed in NEW: {new.failure()}")
        return row
    if not base.ok:
        row.verdict = IMPROVEMENT
        row.notes.append(f"runs in NEW, failed in BASE: {base.failure()}")
        return row
    row.ratio = new.median / base.median  # type: ignore[operator]
    row.sources, row.low, row.high = ratio_interval(base, new)
    row.interval_from = describe_sources(row.sources, base, new)
    row.verdict = verdict_of(row.low, row.high, threshold)
    if row.low is None:
        row.notes.append("no interval: a single run with fewer than 2 timed step readings")
    if new.failed and not base.failed:
        row.verdict = REGRESSION
        row.notes.append(f"new failures: {new.failure()}")
    elif new.failed or base.failed:
        row.notes.append("not ok: " + "; ".join(
            f"{name} {side.failure()}" for name, side in (("BASE", base), ("NEW", new))
            if side.failed))
    if base.records[0].get("mode") == "converge" or new.records[0].get("mode") == "converge":
        row.notes.append("time to accuracy: " + "; ".join(
            f"{name} {time_to_target_words(side.records)}" for name, side in (("BASE", base),
                                                                              ("NEW", new))))
    for name, side in (("BASE", base), ("NEW", new)):
        if side.contended:
            row.notes.append(f"{name} contended ({side.contended}/{len(side.ok)} runs)")
    return row


def label_of(rec: dict[str, Any]) -> str:
    """A configuration in a few words: runner (and variant) model data precision batch device
    x count."""
    batch = f"b{batch_of(rec)}" + ("/dev" if rec.get("scaling") == "weak" else " global")
    kind = "vcpu" if rec.get("virtual_devices") and rec.get("device") == "cpu" else \
        rec.get("device")
    nodes = nodes_of(rec)
    count = f"{rec['num_devices']} {kind}" + (f" x {nodes} nodes" if nodes > 1 else "")
    words = " ".join(str(p) for p in (runner_label(rec), rec["model"], data_label(rec),
                                      rec["precision"], batch, count))
    return f"converge {words}" if rec.get("mode") == "converge" else words


# ---------------------------------------------------------------- inputs

def check_threshold(threshold: float) -> float:
    if not 0 < threshold < 1:  # NaN fails too
        raise ConfigError(f"--threshold: {threshold!r} is not allowed; allowed: a fraction "
                          "between 0 and 1, both excluded (0.05 means 5%)")
    return threshold


def load_side(name: str, folder: str) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """A folder's benchmark-mode and converge-mode records by configuration; ConfigError naming
    the argument when it is not a results folder with any."""
    path = Path(folder)
    if not path.exists():
        raise ConfigError(f"{name}: {folder!r} does not exist; allowed: {ALLOWED_FOLDER}")
    if not runs_dir(path).is_dir():
        raise ConfigError(f"{name}: {folder!r} has no runs/ folder; allowed: {ALLOWED_FOLDER}")
    by_config: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for rec in load_records(path):
        try:
            if mode_of(rec) == "benchmark":
                by_config[config_key(rec)].append(rec)
            elif mode_of(rec) == "converge":  # never one configuration with a benchmark's
                by_config[("converge", *config_key(rec))].append(rec)
        except KeyError:  # a record without the configuration's fields cannot be matched
            continue
    if not by_config:
        raise ConfigError(f"{name}: {folder!r} has no benchmark records in runs/; allowed: "
                          f"{ALLOWED_FOLDER} of mode benchmark (or both) or converge")
    return by_config


def load_environment(folder: str) -> dict[str, Any] | None:
    """A folder's environment.json, None where it has none or it is damaged (read_environment
    names the damage; cmd_compare prints it)."""
    return read_environment(Path(folder))[0]


def damage_lines(*folders: str) -> list[str]:
    """One line per damaged file of each folder (records, environment.json) compare skips."""
    return [item.line() for folder in folders for item in folder_damage(Path(folder))]


# ---------------------------------------------------------------- environments

def _gpu_names(env: dict[str, Any]) -> str:
    names = Counter(g.get("name") or "?" for g in env.get("gpus") or [])
    return ", ".join(f"{n}x {name}" for name, n in sorted(names.items())) or "none"


def _gpu_field(key: str) -> Any:
    def read(env: dict[str, Any]) -> str:
        return ", ".join(sorted({str(g.get(key)) for g in env.get("gpus") or []})) or "none"
    return read


def _gpu_links(env: dict[str, Any]) -> str:
    links = Counter(f"PCIe gen{g.get('pcie_max_gen')} x{g.get('pcie_max_width')}, "
                    f"{g.get('nvlinks_active') or 0} NVLinks" for g in env.get("gpus") or [])
    return "; ".join(f"{n}x {what}" for what, n in sorted(links.items())) or "none"


# what is warned of when it differs (GPU, driver, CPU), each with how it is read
MACHINE = (("GPUs", _gpu_names), ("GPU driver", _gpu_field("driver_version")),
           ("CUDA driver", _gpu_field("cuda_driver_version")), ("GPU links", _gpu_links),
           ("CPU", lambda e: str(e.get("cpu_model"))),
           ("CPU vector extensions", lambda e: str(e.get("cpu_isa") or "not recorded")),
           ("CPU cores", lambda e: str(e.get("cpu_cores"))))
# what is given as context only: it differs between any two machines or commits
CONTEXT = (("host", "host"), ("OS", "os"), ("Python", "python"),
           ("harness commit", "harness_commit"))


def frameworks(records: list[dict[str, Any]]) -> dict[str, dict[str, str]]:
    """Per family, each package's version(s) the runs' children reported (records'
    environment.framework) and, as "environment lock", the lock their environment was
    installed from (environment.lock)."""
    seen: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
    for rec in records:
        env = rec.get("environment") or {}
        fam = rec.get("family") or rec.get("runner") or "?"
        for pkg, version in (env.get("framework") or {}).items():
            seen[fam][pkg].add(str(version))
        lock = env.get("lock") or {}
        if lock.get("sha256"):
            seen[fam][LOCK].add(str(lock["sha256"])[:12])
    return {fam: {pkg: ", ".join(sorted(v)) for pkg, v in pkgs.items()}
            for fam, pkgs in seen.items()}


def environment_differences(base_env: dict[str, Any] | None, new_env: dict[str, Any] | None,
                            base_recs: list[dict[str, Any]], new_recs: list[dict[str, Any]]
                            ) -> list[tuple[str, str, str]]:
    """(what, BASE value, NEW value) for each machine fact and framework version that
    differs. Versions only where both sides' runs of a family reported some (a run that
    failed before its framework loaded reports none: not a difference), the lock where
    both sides name one."""
    diffs = []
    if base_env is not None and new_env is not None:
        for what, read in MACHINE:
            b, n = read(base_env), read(new_env)
            if b != n:
                diffs.append((what, b, n))
    base_fw, new_fw = frameworks(base_recs), frameworks(new_recs)
    for fam in sorted(set(base_fw) & set(new_fw)):
        b_pkgs, n_pkgs = base_fw[fam], new_fw[fam]
        both_versions = set(b_pkgs) - {LOCK} and set(n_pkgs) - {LOCK}
        for pkg in sorted(set(b_pkgs) | set(n_pkgs)):
            if pkg == LOCK and not (LOCK in b_pkgs and LOCK in n_pkgs) or \
                    pkg != LOCK and not both_versions:
                continue
            b, n = b_pkgs.get(pkg, "absent"), n_pkgs.get(pkg, "absent")
            if b != n:
                diffs.append((f"{pkg} ({fam})", b, n))
    return diffs


def context_of(base_env: dict[str, Any] | None, new_env: dict[str, Any] | None
               ) -> list[tuple[str, str, str]]:
    return [(what, str((base_env or {}).get(key, "unknown")),
             str((new_env or {}).get(key, "unknown"))) for what, key in CONTEXT]


def settings_differences(rows: list[Row]) -> list[str]:
    """Settings outside the configuration key that differ (steps, runner options), each
    with the configurations it concerns."""
    found: dict[tuple[str, str, str], list[str]] = defaultdict(list)
    both = [r for r in rows if r.base and r.new]
    for row in both:
        b, n = row.base.records[0], row.new.records[0]  # type: ignore[union-attr]
        pairs = [(k, b.get(k), n.get(k)) for k in ("warmup_steps", "measure_steps")]
        bo, no = b.get("options") or {}, n.get("options") or {}
        pairs += [(f"{b['runner']}.{k}", bo.get(k), no.get(k)) for k in sorted({*bo, *no})]
        for what, bv, nv in pairs:
            if bv != nv:
                found[(what, str(bv), str(nv))].append(row.label)
    out = []
    for (what, bv, nv), labels in sorted(found.items()):
        where = (f"all {len(labels)} configurations" if len(labels) == len(both)
                 else "; ".join(labels))
        out.append(f"{what}: {bv} -> {nv} ({where})")
    return out


# ---------------------------------------------------------------- the comparison

def compare(base: str, new: str, threshold: float) -> Comparison:
    """Every configuration of either folder, compared; ConfigError on bad input."""
    check_threshold(threshold)
    base_by, new_by = load_side("base", base), load_side("new", new)
    if not set(base_by) & set(new_by):
        def some(by: dict[tuple[Any, ...], list[dict[str, Any]]]) -> str:
            labels = sorted(label_of(v[0]) for v in by.values())
            return "; ".join(labels[:3]) + (f"; ... ({len(labels)})" if len(labels) > 3 else "")
        raise ConfigError(f"base, new: {base!r} and {new!r} have no configuration in common "
                          f"(BASE: {some(base_by)}; NEW: {some(new_by)}); allowed: results "
                          "folders sharing a configuration (runner, model, data, precision, "
                          "batch, device kind and count)")
    rows = [compare_row(key, Side(base_by[key]) if key in base_by else None,
                        Side(new_by[key]) if key in new_by else None, threshold)
            for key in sorted(set(base_by) | set(new_by), key=_sortable)]
    base_env, new_env = load_environment(base), load_environment(new)
    base_recs = [r for recs in base_by.values() for r in recs]
    new_recs = [r for recs in new_by.values() for r in recs]
    return Comparison(
        rows=rows, threshold=threshold,
        environment=environment_differences(base_env, new_env, base_recs, new_recs),
        context=context_of(base_env, new_env), settings=settings_differences(rows),
        missing_env=[name for name, env in (("BASE", base_env), ("NEW", new_env))
                     if env is None])


def _sortable(key: tuple[Any, ...]) -> tuple[str, ...]:
    return tuple(f"{v:>12}" if isinstance(v, int) else str(v) for v in key)


# ---------------------------------------------------------------- outputs

def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _interval(row: Row) -> str:
    return "-" if row.low is None else f"[{row.low:.3f}, {row.high:.3f}]"


def counts(cmp: Comparison) -> str:
    """N regressions, M improvements."""
    reg, imp = cmp.count(REGRESSION), cmp.count(IMPROVEMENT)
    return f"{reg} regression{'s' * (reg != 1)}, {imp} improvement{'s' * (imp != 1)}"


def details(cmp: Comparison) -> str:
    """The other verdicts' counts and what significant means."""
    rest = [f"{cmp.count(v)} {v}" for v in (NO_CHANGE, INCONCLUSIVE, NOT_COMPARED)
            if cmp.count(v)]
    return (f"{len(cmp.rows)} configurations" + "".join(f", {r}" for r in rest)
            + f"; significant: the interval of NEW/BASE images/sec outside "
              f"1 +- {cmp.threshold:g}")


def caveats(cmp: Comparison) -> list[str]:
    out = []
    if cmp.uses_steps:
        out.append(STEPS_CAVEAT)
    if cmp.few_repeats:
        out.append(FEW_REPEATS_CAVEAT)
    if any(s.contended for r in cmp.rows for s in (r.base, r.new) if s):
        out.append(CONTENDED_CAVEAT)
    out += [f"{side} has no readable environment.json: GPUs, driver and CPU not compared"
            for side in cmp.missing_env]
    return out


def table_cells(row: Row) -> tuple[str, ...]:
    return (row.label, _num(row.base and row.base.median, ".1f"),
            _num(row.new and row.new.median, ".1f"), _num(row.ratio, ".3f"), _interval(row),
            row.interval_from, row.verdict, "; ".join(row.notes))


HEADER = ("configuration", "BASE img/s", "NEW img/s", "NEW/BASE", "interval",
          "interval from", "verdict", "notes")


def format_terminal(cmp: Comparison) -> str:
    lines = aligned([HEADER, *(table_cells(r) for r in cmp.rows)])
    return "\n".join(lines)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def markdown(cmp: Comparison, base: str, new: str) -> str:
    """compare.md: the summary line first, the table, the environment and settings
    differences, the caveats; ready for a pull-request comment."""
    out = [f"**{counts(cmp)}** ({details(cmp)})", "",
           f"BASE `{Path(base).resolve().name}` vs NEW `{Path(new).resolve().name}`; chart: "
           f"{CHART_NAME}", "",
           "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for row in cmp.rows:
        cells = [_md_cell(c) for c in table_cells(row)]
        if row.verdict in (REGRESSION, IMPROVEMENT):
            cells[6] = f"**{cells[6]}**"
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "### Environment differences", ""]
    out += ([f"- {what}: `{b}` -> `{n}`" for what, b, n in cmp.environment]
            or ["none in GPUs, driver, CUDA driver, CPU or framework versions"])
    out += ["", "Context: " + "; ".join(f"{what} `{b}` -> `{n}`" if b != n else f"{what} `{b}`"
                                       for what, b, n in cmp.context)]
    if cmp.settings:
        out += ["", "### Settings differences (outside the configuration key)", ""]
        out += [f"- {_md_cell(s)}" for s in cmp.settings]
    notes = caveats(cmp)
    if notes:
        out += ["", "### Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"


CAPTION_CHARS = 110  # 9-point characters across the 9-inch figure, margins left
COLOURS = {REGRESSION: "#c0392b", IMPROVEMENT: "#27ae60", NO_CHANGE: "#34495e",
           INCONCLUSIVE: "#7f8c8d", NOT_COMPARED: "#7f8c8d"}


def chart(cmp: Comparison, path: Path) -> Path:
    """chart_figure written to path."""
    return save(chart_figure(cmp), path, pyplot())


def chart_figure(cmp: Comparison) -> Any:
    """NEW/BASE with its interval per configuration in both folders (horizontal), the
    1 +- threshold band shaded; rows without a ratio carry their note. The caption is wrapped
    to the figure's width (long configuration labels narrow the axes)."""
    rows = [r for r in cmp.rows if r.base and r.new][::-1]
    fig, ax = pyplot().subplots(figsize=(9, 1.6 + 0.45 * len(rows)))
    t = cmp.threshold
    ax.axvspan(1 - t, 1 + t, color="#95a5a6", alpha=0.25)
    ax.axvline(1.0, color="#7f8c8d", linewidth=1)
    xs = [1 - 2 * t, 1 + 2 * t]
    for y, row in enumerate(rows):
        colour = COLOURS[row.verdict]
        if row.ratio is None:
            ax.text(0.01, y, row.notes[0] if row.notes else row.verdict, va="center",
                    color=colour, fontsize=8, transform=ax.get_yaxis_transform())
            continue
        xs += [row.ratio, *(v for v in (row.low, row.high) if v is not None)]
        if row.low is not None:
            steps = STEPS in (row.sources or ())
            ax.errorbar(row.ratio, y, xerr=[[row.ratio - row.low], [row.high - row.ratio]],
                        fmt="o", color=colour, capsize=4, mfc="white" if steps else colour)
        else:
            ax.plot(row.ratio, y, "o", color=colour, fillstyle="none")
    ax.set_yticks(range(len(rows)), [r.label for r in rows], fontsize=8)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    span = max(xs) - min(xs)
    ax.set_xlim(min(xs) - 0.05 * span, max(xs) + 0.05 * span)
    ax.set_title(counts(cmp), fontsize=10)
    caption = (f"NEW / BASE images/sec, interval: range with 2 repeats a side, else "
               f"{BOOTSTRAP_CI} (open marker: from the steps of one run); shaded: 1 "
               f"\u00b1 {t:g}, no significant change")
    fig.supxlabel(textwrap.fill(caption, CAPTION_CHARS), fontsize=9)
    return fig


def out_folder(out: str | None, new: str) -> Path:
    path = Path(out) if out else Path(new)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out: {str(path)!r} is not a folder; allowed: a folder (made if "
                          "missing) for compare.md and compare.png")
    return path


def cmd_compare(args: argparse.Namespace) -> int:
    """Compare, print, write compare.md and compare.png; 1 on a regression, else 0."""
    for line in damage_lines(args.base, args.new):
        print(line, file=sys.stderr)
    if Path(args.base).resolve() == Path(args.new).resolve():
        print(f"note: BASE and NEW are the same folder ({args.base}): every ratio is 1 by "
              "construction", file=sys.stderr)
    cmp = compare(args.base, args.new, args.threshold)
    out = out_folder(args.out, args.new)
    print(format_terminal(cmp))
    if cmp.environment:
        print("warning: the environments differ; a ratio mixes the change with the machine:",
              file=sys.stderr)
        for what, b, n in cmp.environment:
            print(f"warning:   {what}: {b} -> {n}", file=sys.stderr)
    for line in cmp.settings:
        print(f"note: settings differ: {line}")
    for line in caveats(cmp):
        print(f"note: {line}")
    try:
        out.mkdir(parents=True, exist_ok=True)
        md = out / MD_NAME
        write_text_atomic(md, markdown(cmp, args.base, args.new))
        png = chart(cmp, out / CHART_NAME)
    except OSError as exc:
        raise ConfigError(f"--out: cannot write in {str(out)!r} ({exc.strerror or exc}); "
                          "allowed: a folder this user can write") from None
    print(f"\n{counts(cmp)} ({details(cmp)})")
    print(f"wrote {md} and {png}")
    return 1 if cmp.count(REGRESSION) else 0
