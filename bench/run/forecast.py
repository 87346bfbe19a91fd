"""The dry run's forecast: each planned run's predicted status, from what the parent can know
without importing a framework, and the estimated duration of what will run.

A run's status comes from the rules the sweep applies (bench/run/sweep.py): precheck with the
GPUs NVML sees (none counted for a SLURM sweep: its runs go to the cluster's nodes), then its
family's environment (bench/run/envs.py): built, to be built on first use (not an error), or
one that cannot be used here (a post-install build that failed before, a lock whose wheels
are for another platform). The estimate is the median wall_time_s of earlier records on this
host (the results folders beside the sweep's, read through the tolerant reader, bounded):
of the same configuration, else of the same runner and model; a run with neither has none.

The host's facts are a HostFacts, so a test gives fixed ones (HostFacts.here reads this one's).
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import REPO_ROOT
from bench.plan.config import SweepConfig
from bench.plan.runs import RunSpec, config_id
from bench.records.store import read_environment, read_record, record_files, runs_dir
from bench.run import environment
from bench.run.envs import (
    EnvError,
    cached_failure,
    family_env,
    lock_header,
    lock_problem,
    other_index,
    repo_relative,
)
from bench.run.sweep import precheck

WILL_RUN = "will run"
UNAVAILABLE = "unavailable"
INVALID = "invalid"
DEPENDS = "depends on the cluster"
RECORDED = "recorded"  # --resume: a record in the folder already; the run is skipped
STATUSES = (WILL_RUN, UNAVAILABLE, INVALID, DEPENDS, RECORDED)
ON_THE_NODES = ("it runs on the cluster's nodes (cluster.backend: slurm), whose devices this "
                "host cannot see")
# launched runs leave a duration; these are recorded without a launch (or never ran)
NOT_LAUNCHED = frozenset({"unavailable", "invalid", "cancelled"})
MAX_ENTRIES = 5000  # entries of one results root looked at
MAX_FOLDERS = 200  # newest results folders read
MAX_RECORDS = 2000  # record files read in all (only those of a planned runner and model)
MAX_BYTES = 32 * 2**20  # ... and their bytes (a record with long telemetry is large)
MAX_RANGES = 6  # run-number ranges shown for one reason


@dataclass(frozen=True)
class EnvState:
    """A family's environment as the parent sees it: `ready` (built: no build time), else to
    be built on first use (`how`), or `problem`: why the runs cannot use it here."""

    name: str  # <family>-<variant>
    ready: bool = False
    problem: str | None = None
    how: str = ""


@dataclass(frozen=True)
class HostFacts:
    """What the forecast knows of the host: its name (records of the same host time it), the
    GPUs NVML sees, each family's environment, and the folders holding earlier results."""

    host: str
    gpus: int
    env_state: Callable[[str, str], EnvState]
    results_roots: tuple[Path, ...] = ()
    cpus: int = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else (os.cpu_count() or 1)

    @classmethod
    def here(cls, out: Path) -> HostFacts:
        """This machine's facts; earlier results are looked for beside `out` and in results/."""
        roots = tuple(dict.fromkeys([Path(out).parent, REPO_ROOT / "results"]))
        return cls(platform.node(), len(environment.gpus()), env_state, roots)


@dataclass(frozen=True)
class Prediction:
    """One run's predicted status, why (None for a run that will run) and the environment
    to be built before it (None when built or not needed)."""

    status: str
    reason: str | None = None
    builds: EnvState | None = None


@dataclass
class Estimate:
    """The summed median durations of the runs that will run and have an earlier record."""

    seconds: float = 0.0
    same_config: int = 0
    same_model: int = 0
    unknown: int = 0
    unknown_limit_s: float = 0.0  # the unknown runs' timeouts summed: what they may take
    records: int = 0  # launched records of this host read
    files: int = 0  # record files read
    capped: bool = False  # a MAX_* bound stopped the reading

    @property
    def known(self) -> int:
        return self.same_config + self.same_model


# ---- the environments ----

def env_state(family: str, variant: str, machine: str | None = None,
              glibc: str | None = None) -> EnvState:
    """A family's environment on this machine (machine and glibc: platform's, unless given):
    built, to be built (from its lock or requirements), or why it cannot be used."""
    name = f"{family}-{variant}"
    try:
        env = family_env(family, variant)
    except EnvError as exc:
        return EnvState(name, problem=str(exc))
    except KeyError:
        return EnvState(name, problem=f"no environment is declared for family {family!r}")
    if env.ready:
        return EnvState(name, ready=True)
    if why := cached_failure(env, family):  # ensure_env raises it again rather than rebuild
        return EnvState(name, problem=why)
    if env.lock is not None and (why := foreign_lock(env.lock, machine, glibc)):
        return EnvState(name, problem=why)
    return EnvState(name, how=build_text(env.requirements, env.lock))


def foreign_lock(lock: Path, machine: str | None = None, glibc: str | None = None) -> str | None:
    """Why a lock's hash-checked install cannot work on this machine (its wheels are for
    another processor, or a newer glibc), or None."""
    wanted = lock_header(lock).get("platform", "")
    m = re.fullmatch(r"(\w+)-manylinux_(\d+)_(\d+)", wanted)
    if not m:
        return None
    machine = machine or platform.machine()
    if glibc is None:
        lib, version = platform.libc_ver()
        glibc = version if lib == "glibc" else ""
    if machine != m.group(1):
        return (f"{repo_relative(lock)} pins the wheels of {m.group(1)} Linux; this machine is "
                f"{machine}: its hash-checked install would find none")
    need = (int(m.group(2)), int(m.group(3)))
    have = tuple(int(p) for p in glibc.split(".")[:2] if p.isdigit())
    if len(have) == 2 and have < need:
        return (f"{repo_relative(lock)} pins wheels that need glibc {need[0]}.{need[1]}; this "
                f"machine has {glibc}")
    return None


def build_text(requirements: Path, lock: Path | None) -> str:
    """How an environment would be built: from its lock, or from its requirements (why)."""
    if lock is not None:
        stale = lock_problem(requirements)
        return f"from {repo_relative(lock)}" + (f" ({stale})" if stale else "")
    if other_index(requirements):
        return f"from {repo_relative(requirements)} (its package index is not locked)"
    return (f"from {repo_relative(requirements)}, unpinned (no lock for Python "
            f"{platform.python_version()})")


# ---- the statuses ----

def predict(runs: list[RunSpec], cfg: SweepConfig, facts: HostFacts) -> list[Prediction]:
    """Each run's Prediction, by the sweep's rules (see the module's docstring)."""
    on_slurm = cfg.cluster["backend"] == "slurm"
    visible = None if on_slurm else facts.gpus
    states: dict[str, EnvState] = {}
    found = []
    for spec in runs:
        if why := precheck(spec, visible):
            status, reason = why
            if reason.endswith("NVML sees 0"):
                reason += " (no GPU on this machine)"
            found.append(Prediction(status, reason))
            continue
        state = None
        if not spec.python and spec.family != "harness":  # a family's interpreter
            if spec.family not in states:
                states[spec.family] = facts.env_state(spec.family, cfg.device)
            state = states[spec.family]
        if state is not None and state.problem:
            found.append(Prediction(UNAVAILABLE, f"{spec.family} environment: {state.problem}"))
        elif on_slurm:
            found.append(Prediction(DEPENDS, ON_THE_NODES))
        else:
            built = state is None or state.ready
            found.append(Prediction(WILL_RUN, builds=None if built else state))
    return found


def already_recorded(runs: list[RunSpec], predicted: list[Prediction], done: set[str],
                     out: Path) -> list[Prediction]:
    """--resume: a run whose record the folder holds is skipped, whatever it would do."""
    why = f"a record in {out} already (--resume keeps it)"
    return [Prediction(RECORDED, why) if spec.run_id in done else p
            for spec, p in zip(runs, predicted, strict=True)]


# ---- the estimate ----

def estimate(runs: list[RunSpec], predicted: list[Prediction], facts: HostFacts) -> Estimate:
    """The duration of the runs that will run, from earlier records of this host: per run the
    median wall_time_s of the same configuration (mode, device, run id but its repeat), else
    of the same runner and model (mode and device too); a run with neither counts unknown."""
    going = [r for r, p in zip(runs, predicted, strict=True) if p.status == WILL_RUN]
    est = Estimate()
    if not going:
        return est
    exact, rough = earlier_durations(facts, {(r.runner, r.model) for r in going}, est)
    for spec in going:
        if times := exact.get(config_key(spec.mode, spec.device, spec.run_id)):
            est.seconds += statistics.median(times)
            est.same_config += 1
        elif times := rough.get((spec.mode, spec.device, spec.runner, spec.model)):
            est.seconds += statistics.median(times)
            est.same_model += 1
        else:
            est.unknown += 1
            est.unknown_limit_s += spec.timeout_s
    return est


def config_key(mode: str, device: str, run_id: str) -> tuple[str, str, str]:
    return mode, device, config_id(run_id)


def earlier_durations(facts: HostFacts, wanted: set[tuple[str, str]], est: Estimate
                      ) -> tuple[dict[tuple[str, ...], list[float]],
                                 dict[tuple[str, ...], list[float]]]:
    """The wall times of earlier launched runs of this host, by configuration and by runner
    and model; only record files named for a wanted (runner, model) are read, the newest
    MAX_FOLDERS folders, at most MAX_RECORDS files and MAX_BYTES."""
    exact: dict[tuple[str, ...], list[float]] = {}
    rough: dict[tuple[str, ...], list[float]] = {}
    marks = tuple(f"{runner}__{model}__" for runner, model in wanted)
    size = 0
    for folder in results_folders(facts.results_roots, est):
        env, _ = read_environment(folder)
        folder_host = env.get("host") if env else None
        if folder_host is not None and folder_host != facts.host:
            continue
        for path in record_files(folder):
            if not any(mark in path.name for mark in marks):
                continue
            with contextlib.suppress(OSError):
                size += path.stat().st_size
            if est.files >= MAX_RECORDS or size > MAX_BYTES:
                est.capped = True
                return exact, rough
            est.files += 1
            rec, _ = read_record(path)
            if rec is None or (seconds := launched_seconds(rec, folder_host, facts.host)) is None:
                continue
            est.records += 1
            mode = rec.get("mode") or "benchmark"
            exact.setdefault(config_key(mode, rec["device"], rec["run_id"]), []).append(seconds)
            rough.setdefault((mode, rec["device"], rec["runner"], rec["model"]),
                             []).append(seconds)
    return exact, rough


def launched_seconds(rec: dict[str, Any], folder_host: str | None, host: str) -> float | None:
    """A record's wall time when it is a launched run of this host (its own environment's
    host, else its folder's), else None."""
    own = rec.get("environment") if isinstance(rec.get("environment"), dict) else {}
    if (own.get("host") or folder_host) != host or rec["status"] in NOT_LAUNCHED:
        return None
    seconds = rec.get("wall_time_s")
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
        return None
    return float(seconds)


def results_folders(roots: tuple[Path, ...], est: Estimate) -> list[Path]:
    """The results folders (those with a runs/ folder) under roots, newest first, at most
    MAX_FOLDERS of them."""
    found = []
    for root in roots:
        with contextlib.suppress(OSError), os.scandir(root) as entries:
            for n, entry in enumerate(entries):
                if n >= MAX_ENTRIES:  # a crowded parent (--out /tmp/x): enough looked at
                    est.capped = True
                    break
                with contextlib.suppress(OSError):
                    if entry.is_dir() and (runs := runs_dir(Path(entry.path))).is_dir():
                        found.append((runs.stat().st_mtime, Path(entry.path)))
    found.sort(reverse=True)
    if len(found) > MAX_FOLDERS:
        est.capped = True
    return [path for _, path in found[:MAX_FOLDERS]]


# ---- the text ----

def run_numbers(numbers: list[int], most: int = MAX_RANGES) -> str:
    """Run numbers as ranges: #1-#8, #17, #20-#24 (at most `most` ranges, then ...)."""
    ranges: list[list[int]] = []
    for n in sorted(numbers):
        if ranges and n == ranges[-1][1] + 1:
            ranges[-1][1] = n
        else:
            ranges.append([n, n])
    shown = [f"#{a}" if a == b else f"#{a}-#{b}" for a, b in ranges[:most]]
    return ", ".join(shown + (["..."] if len(ranges) > most else []))


GPU_COUNT = re.compile(r"^needs (\d+) GPUs; (NVML sees .*)$")  # precheck's reason


def reason_lines(predicted: list[Prediction]) -> list[str]:
    """Each distinct (status, reason) once, with how many runs and which (in plan order);
    precheck's GPU-count reasons as one, naming every count (the counts of a sweep interleave:
    apart, each would list every fourth run)."""
    by_reason: dict[tuple[str, str], list[int]] = {}
    counts: dict[tuple[str, str], set[int]] = {}
    for i, p in enumerate(predicted, 1):
        if p.reason is None:
            continue
        key = (p.status, p.reason)
        if m := GPU_COUNT.match(p.reason):
            key = (p.status, m.group(2))
            counts.setdefault(key, set()).add(int(m.group(1)))
        by_reason.setdefault(key, []).append(i)
    lines = []
    for (status, reason), nums in by_reason.items():
        if (status, reason) in counts:
            needed = [str(n) for n in sorted(counts[status, reason])]
            said = (" or ".join(needed) if len(needed) < 3
                    else f"{', '.join(needed[:-1])} or {needed[-1]}")
            reason = f"needs {said} GPU{'' if needed == ['1'] else 's'}; {reason}"
        lines.append(f"  {status} ({len(nums)} run{'s' if len(nums) > 1 else ''}: "
                     f"{run_numbers(nums)}): {reason}")
    return lines


def count_line(predicted: list[Prediction], facts: HostFacts, on_slurm: bool) -> str:
    counts = {s: sum(p.status == s for p in predicted) for s in STATUSES}
    shown = ", ".join(f"{n} {s}" for s, n in counts.items() if n or s == WILL_RUN)
    gpus = "GPUs: the cluster's nodes'" if on_slurm else f"GPUs: NVML sees {facts.gpus}"
    return f"predicted: {shown} (of {len(predicted)} runs; host {facts.host}, {gpus})"


def duration_text(seconds: float) -> str:
    """~40 s, ~14 min, ~2.5 h."""
    if seconds < 90:
        return f"~{seconds:.0f} s"
    return f"~{seconds / 60:.0f} min" if seconds < 5400 else f"~{seconds / 3600:.1f} h"


def estimate_line(est: Estimate, going: int) -> str:
    bound = (f", at most {duration_text(est.unknown_limit_s).lstrip('~')} by their timeouts"
             if est.unknown_limit_s else "")
    if est.known == 0:
        return (f"estimated: unknown for the {going} run{'s' if going > 1 else ''} that will "
                f"run (no earlier record of them on this host{bound})")
    size = duration_text(est.seconds)
    where = "from earlier records on this host"
    if est.same_model:
        where += (f": {est.same_config} of the same configuration, {est.same_model} of the "
                  "same runner and model")
    if est.capped:
        where += f"; the newest {est.files} record files read, no more"
    line = f"estimated: {size} for {est.known} of {going} runs that will run ({where})"
    if est.unknown:
        line += (f"; {est.unknown} {'have' if est.unknown > 1 else 'has'} no earlier record"
                 f"{bound}")
    return line


def summary_lines(runs: list[RunSpec], predicted: list[Prediction], cfg: SweepConfig,
                  facts: HostFacts) -> list[str]:
    """After the plan's table: each reason once with its runs, the counts per status, the
    environments to build and the estimated duration of what will run."""
    on_slurm = cfg.cluster["backend"] == "slurm"
    lines = []
    if reasons := reason_lines(predicted):
        lines += ["", "why (each reason once, with the runs it covers):", *reasons]
    lines += ["", count_line(predicted, facts, on_slurm)]
    if line := shared_cores_line(runs, predicted, facts):
        lines.append(line)
    builds = sorted({p.builds for p in predicted if p.builds}, key=lambda s: s.name)
    if builds:
        lines.append("environments to build first (on first use, minutes each): "
                     + ", ".join(s.name for s in builds))
        lines += [f"  {s.name}: {s.how}" for s in builds]
    going = sum(p.status == WILL_RUN for p in predicted)
    if on_slurm:
        lines.append("estimated: none here (the runs' time is the cluster nodes')")
    elif "capacity" in cfg.mode:
        lines.append("estimated: none for capacity searches (their probes follow from the "
                     "probes' results)")
    elif going:
        lines.append(estimate_line(estimate(runs, predicted, facts), going))
        if cfg.until_stable:
            lines.append("  (until_stable may add repeats beyond these)")
    else:
        lines.append("estimated: nothing will run")
    return lines


def shared_cores_line(runs: list[RunSpec], predicted: list[Prediction], facts: HostFacts
                      ) -> str | None:
    """A note where runs that will run here put more virtual CPU devices on one node than the
    host has CPUs: they share cores, so their speedup measures the sharing, not scaling."""
    over = sorted({r.devices_per_node for r, p in zip(runs, predicted, strict=True)
                   if p.status == WILL_RUN and r.device == "cpu" and r.num_nodes == 1
                   and r.devices_per_node > facts.cpus})
    if not over:
        return None
    return (f"note: {', '.join(map(str, over))} virtual CPU devices share this host's "
            f"{facts.cpus} CPUs: those runs' speedup measures the devices sharing cores, not "
            "scaling (records say virtual_devices: true)")


__all__ = ["DEPENDS", "INVALID", "UNAVAILABLE", "WILL_RUN", "EnvState", "Estimate",
           "HostFacts", "Prediction", "RECORDED", "already_recorded", "env_state", "estimate",
           "predict", "run_numbers", "summary_lines"]
