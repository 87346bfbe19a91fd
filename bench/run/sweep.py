"""The sweep engine: runs a plan's RunSpecs one after another (locally, through
bench.run.launch) or as SLURM jobs (bench.run.slurm), with the results folder locked, the
environments provisioned, the machine's matmul peaks measured, blocked runs recorded without
starting, the progress shown, extra repeats until stable, and Ctrl-C / SIGTERM / SIGHUP
stopping it cleanly. The cli renders the report of what it leaves in the folder."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import IO, Any

import yaml

from bench import REPO_ROOT
from bench.catalog.registry import PIPELINES, PROBES, RUNNERS, RunnerInfo
from bench.errors import ConfigError, write_remedy
from bench.plan.config import SweepConfig, show_value
from bench.plan.config.custom_models import model_name
from bench.plan.config.sweep_config import BATCH_KEYS
from bench.plan.runs import RunSpec, another_repeat, config_id, search_id
from bench.records import store
from bench.records.grouping import runner_label
from bench.records.store import done_run_ids, load_records, set_aside_damaged, write_json_atomic
from bench.records.trust import coefficient_of_variation
from bench.run import capacity, environment, slurm, sweep_lock
from bench.run.envs import EnvError, ensure_env, python_for
from bench.run.launch import launch, record_without_run
from bench.run.peak import measure_peaks
from bench.run.progress import SweepProgress, outcome_detail
from contract import settings
from models import get_spec


@dataclass(frozen=True)
class RunContext:
    """What every run of a sweep launches with: the families' interpreters, the captured
    environment, the measured peaks (empty: none), the runs that cannot be launched here
    with their (status, reason)."""

    pythons: dict[str, Any]
    env: dict[str, Any]
    peaks: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    blocked: dict[str, tuple[str, str]] = field(default_factory=dict)


@dataclass
class SweepEnd:
    """How a sweep's engine ended: `code` set when the cli should exit with it now (a folder
    it cannot write: the line is printed), `signum` when a stop signal ended it, `detached`
    when its SLURM jobs were submitted and left; `lock` is the folder's, held until the
    report is written."""

    code: int | None = None
    signum: int | None = None
    detached: bool = False
    lock: IO[str] | None = None


def run_sweep(cfg: SweepConfig, runs: list[RunSpec], out: Path, *, resume: bool = False,
              retry_failed: bool = False, detach: bool = False,
              quiet_setup: bool = False, new_fingerprint: bool = False) -> SweepEnd:
    """Run the plan into out (see the module's docstring); what is left is records. A resume
    whose settings differ from the folder's fingerprint is refused (ConfigError) before
    anything is written, unless new_fingerprint (the earlier results set aside)."""
    env = environment.capture()
    try:
        lock = acquire_folder(out)  # held until this process ends (a dead one's is taken over)
        if resume:
            check_fingerprint(cfg, out, new_fingerprint)
        write_json_atomic(out / "environment.json", env)
        write_text_atomic(out / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        write_json_atomic(out / FINGERPRINT, {"version": 1, "settings": fingerprint(cfg)})
    except OSError as exc:
        return SweepEnd(code=cannot_write(out, exc))
    capacity_mode = "capacity" in cfg.mode  # alone: each run is a search's first probe
    done = (capacity.searches_done(out, cfg.scale, runs, retry_failed) if capacity_mode
            else done_run_ids(out, retry_failed)) if resume else set()
    todo = [r for r in runs if r.run_id not in done]
    if resume and not capacity_mode:  # a damaged record's run runs again; its file is kept
        try:
            for line in set_aside_damaged(out, {r.run_id for r in todo}):
                print(line, file=sys.stderr, flush=True)
        except OSError as exc:
            return SweepEnd(code=cannot_write(out, exc), lock=lock)
    what = "capacity searches" if capacity_mode else "runs"
    print(f"sweep {cfg.name}: {len(runs)} {what}, {len(runs) - len(todo)} already done, "
          f"results in {out}", flush=True)
    on_slurm = cfg.cluster["backend"] == "slurm"
    # GPUs are counted here only for runs that run here; a cluster's nodes have their own
    visible_gpus = None if on_slurm else len(env["gpus"])
    blocked = {r.run_id: why for r in todo if (why := precheck(r, visible_gpus))}
    if detach and not on_slurm:
        raise ConfigError("--detach: allowed only with cluster.backend: slurm (a local sweep "
                          "runs in this process)")
    try:
        with stop_signals_interrupt():
            pythons = interpreters([r for r in todo if r.run_id not in blocked], cfg.device,
                                   quiet_setup)
            if on_slurm:
                slurm.run_sweep(todo, blocked, pythons, out, env, cfg.cluster, detach)
                return SweepEnd(detached=detach, lock=lock)
            if capacity_mode:
                run_capacity(cfg, todo, RunContext(pythons, env, blocked=blocked), out, resume)
                return SweepEnd(lock=lock)
            peaks = measure_peaks([r for r in runs if r.run_id not in blocked], pythons, env,
                                  out)
            ctx = RunContext(pythons, env, peaks, blocked)
            with SweepProgress([r.run_id not in blocked for r in todo]) as show:
                for i, spec in enumerate(todo, 1):
                    run_and_print(spec, f"[{i}/{len(todo)}]", ctx, out, show)
                if cfg.until_stable:
                    repeat_until_stable(cfg.until_stable, runs, ctx, out, show)
    except OSError as exc:  # a full disk, a folder gone: what is written stays whole
        return SweepEnd(code=cannot_write(out, exc), lock=lock)
    except KeyboardInterrupt as exc:
        return SweepEnd(signum=getattr(exc, "signum", signal.SIGINT), lock=lock)
    return SweepEnd(lock=lock)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP (a CI cancel, a scheduler's preemption, a closed terminal): handled
    as Ctrl-C is, the running run's group killed and the finished records kept."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """While the sweep runs, SIGTERM and SIGHUP raise Stopped like Ctrl-C's KeyboardInterrupt."""
    def stop(signum: int, _frame: object) -> None:
        raise Stopped(signum)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def acquire_folder(out: Path) -> IO[str]:
    try:
        return sweep_lock.acquire(out)
    except sweep_lock.FolderBusy as exc:
        raise ConfigError(str(exc)) from None


FINGERPRINT = store.FINGERPRINT_NAME
SUPERSEDED = "superseded"
# keys that change no figure: labels, a time limit, what is sampled beside the run, where it
# runs, and how many repeats of the same configuration (they add or omit runs, never mix)
NOT_FINGERPRINTED = frozenset({"name", "description", "timeout_s", "telemetry", "cluster",
                               "repeats", "until_stable"})
_ABSENT = object()  # a key one side of a comparison does not have
# the matrix's keys: a value each is its own runs (contract/settings.py's axis keys)
AXES = frozenset(s.key_name for s in settings.config_settings() if s.key is not None
                 and s.key.axis)


def fingerprint(cfg: SweepConfig) -> dict[str, Any]:
    """Every resolved setting that changes a figure (config.yaml's keys less NOT_FINGERPRINTED),
    as JSON values."""
    settings = {k: v for k, v in cfg.to_dict().items() if k not in NOT_FINGERPRINTED}
    return json.loads(json.dumps(settings, sort_keys=True, default=str))


def fingerprint_changes(old: Any, new: Any, key: str = "") -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) of each difference; a mapping compared key by key."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = []
        for k in sorted(set(old) | set(new), key=str):
            sub = f"{key}.{k}" if key else str(k)
            found += fingerprint_changes(old.get(k, _ABSENT), new.get(k, _ABSENT), sub)
        return found
    return [] if old == new else [(key, old, new)]


def matrix_grows(key: str, old: Any, new: Any, stored: dict[str, Any],
                 current: dict[str, Any]) -> bool:
    """A change a resume may make: an axis that keeps all its earlier values and adds some
    (a device count, a runner, a batch size, a model's batch: new runs beside the old, each
    record's settings the same), or the options of a runner or the batch of a model so added.
    config.yaml then describes every record."""
    head, _, entry = key.partition(".")
    if key in AXES or (head in BATCH_KEYS and entry):  # a batch mapping's entry: a model's axis
        if isinstance(old, list) and isinstance(new, list):
            return all(v in new for v in old)
        return old is _ABSENT and head in BATCH_KEYS and _added(entry, "models", stored, current)
    return (old is _ABSENT and head == "runner_options" and entry != "" and "." not in entry
            and _added(entry, "runners", stored, current))


def _added(name: str, axis: str, stored: dict[str, Any], current: dict[str, Any]) -> bool:
    """Whether the resume adds `name` to the axis (runners, models): its entry is new too."""
    def names(values: Any) -> list[str]:
        return [model_name(v) for v in values or []]

    return name not in names(stored.get(axis)) and name in names(current.get(axis))


def _short(value: Any, width: int = 30) -> str:
    text = "(not set)" if value is _ABSENT else json.dumps(value, default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


def check_fingerprint(cfg: SweepConfig, out: Path, new_fingerprint: bool) -> None:
    """--resume into out: refuse settings that differ from its stored fingerprint (one line,
    ConfigError) unless new_fingerprint, which moves the earlier results to
    out/superseded/<time>/ (kept, never reported with the new ones). A folder from before
    fingerprints (none stored) resumes as it always did; an unreadable fingerprint is treated
    as a different one."""
    path = out / FINGERPRINT
    if not path.exists():
        return
    try:
        with open(path, "rb") as fh:  # a bounded read: a fingerprint is a few KB
            stored = json.loads(fh.read(1 << 20).decode(errors="replace"))["settings"]
        if not isinstance(stored, dict):
            raise TypeError("settings: not a mapping")
        current = fingerprint(cfg)
        changes = [c for c in fingerprint_changes(stored, current)
                   if not matrix_grows(*c, stored, current)]
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        changes = [("fingerprint.json", "(unreadable)", "(this sweep's)")]
    if not changes:
        return
    if not new_fingerprint:
        shown = "; ".join(f"{k}: {_short(a)} -> {_short(b)}" for k, a, b in changes[:8])
        more = f"; and {len(changes) - 8} more" if len(changes) > 8 else ""
        raise ConfigError(
            f"--resume: the settings differ from those of the results in {out}: {shown}{more}; "
            "allowed: the same settings (the matrix may grow), a new folder (--out NEW), or "
            f"--new-fingerprint to take the new ones (the earlier results move to "
            f"{out}/{SUPERSEDED}/)")
    refuse_while_jobs_run(out)
    aside = out / SUPERSEDED / datetime.now().strftime("%Y%m%d-%H%M%S")
    aside.mkdir(parents=True, exist_ok=True)
    moved = 0
    for entry in sorted(out.iterdir()):
        if entry.name not in (SUPERSEDED, sweep_lock.LOCK_NAME):
            entry.rename(aside / entry.name)
            moved += 1
    print(f"--new-fingerprint: {len(changes)} setting(s) changed; the earlier results "
          f"({moved} entries) moved to {aside}, kept and never reported with the new ones",
          flush=True)

def refuse_while_jobs_run(out: Path) -> None:
    """--new-fingerprint moves the earlier results aside: not while SLURM jobs of the earlier
    sweep are queued or running, which would write their records into the new runs/ (one
    line, ConfigError). Jobs SLURM cannot be asked about count as running."""
    book = slurm.read_book(out)
    live = [e.get("job_id") for e in book.values()
            if isinstance(e, dict) and not e.get("collected") and isinstance(e.get("job_id"), str)]
    if not live:
        return
    try:
        running = sorted(slurm.queued(live))
        why = ""
    except slurm.SlurmError as exc:
        running, why = sorted(live), f" (SLURM could not be asked: {exc})"
    if running:
        shown = ", ".join(running[:8]) + (f" and {len(running) - 8} more" if len(running) > 8
                                          else "")
        raise ConfigError(
            f"--new-fingerprint: {len(running)} SLURM job(s) of the earlier sweep in {out} are "
            f"still queued or running{why}: {shown}; they would write into the new results; "
            f"allowed once they have ended (`run_bench.py status {out}` collects them) or are "
            "cancelled (scancel), or a new folder (--out NEW)")


NAME_MAX = 255  # bytes of one file name (ext4, xfs, btrfs, tmpfs, NFS)


def results_folder(cfg: SweepConfig, out: str | None, resume: bool) -> Path:
    if out:
        return Path(out)
    base = REPO_ROOT / "results"
    if resume:
        earlier = sorted(p for p in base.glob(f"{cfg.name}-*")
                         if (p / "runs").is_dir() or (p / capacity.CAPACITY_DIR).is_dir())
        if not earlier:
            raise ConfigError(f"--resume: no earlier results for sweep {show_value(cfg.name)} "
                              f"in {base}; allowed: an existing folder via --out, or run "
                              "without --resume")
        return earlier[-1]
    stamp = datetime.now().strftime('%Y%m%d-%H%M%S')
    most = NAME_MAX - len(stamp) - 1  # the folder's name is one file name: <name>-<stamp>
    if len(os.fsencode(cfg.name)) > most:
        raise ConfigError(f"name: {show_value(cfg.name)} is not allowed; allowed: a name of at "
                          f"most {most} bytes (its results folder, <name>-{stamp}, is one "
                          f"file name, at most {NAME_MAX} bytes; or give --out)")
    return base / f"{cfg.name}-{stamp}"


def interpreters(runs: list[RunSpec], variant: str, quiet: bool) -> dict[str, Any]:
    """Each family's interpreter, provisioning missing environments; EnvError if it failed."""
    found: dict[str, Any] = {"harness": Path(sys.executable)}  # the naive PIL loop's
    for fam in sorted({r.family for r in runs if not r.python} - {"harness"}):
        try:
            found[fam] = ensure_env(fam, variant, quiet=quiet).python
        except (EnvError, OSError) as exc:  # OSError: the cache folder cannot be made
            found[fam] = exc
    return found


def cannot_write(out: Path, exc: OSError) -> int:
    """A full disk or a folder gone, or the terminal's reader gone (a closed pipe): one line
    naming which, exit 1; what was written stays whole."""
    if isinstance(exc, BrokenPipeError) and exc.filename is None:
        with contextlib.suppress(OSError):  # nothing more reaches the closed pipe
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"stopped: the reader of this sweep's output went away (a closed pipe, e.g. "
              f"`| head`); finished records are kept; --resume --out {out} runs the rest",
              file=sys.stderr)
        return 1
    print(f"cannot write in {out}: {exc.strerror or exc} ({exc.filename or 'a file'}); "
          f"finished records are kept; {write_remedy(exc)}, then --resume --out {out}",
          file=sys.stderr)
    return 1


def write_text_atomic(path: Path, text: str) -> None:
    """Write text through a temporary file and a rename: never half a file (store's)."""
    store.write_text_atomic(path, text)


def run_and_print(spec: RunSpec, tag: str, ctx: RunContext, out: Path,
                  show: SweepProgress | None = None, counted: bool = True,
                  words: Callable[[dict[str, Any]], str] | None = None) -> dict[str, Any]:
    """Run (or record as blocked) one spec, with its progress (a line when it starts and ends,
    or the live display; the sweep's elapsed time and estimate of what is left for a counted
    run, one of the sweep's planned runs). `words(record)`: the end line's verdict in place
    of the record's status and outcome (a capacity probe's against its budget)."""
    label = (f"{tag} pipeline {spec.runner} {spec.model} "
             f"b={spec.global_batch_size} workers={spec.dataset['workers']}"
             if spec.mode == "pipeline" and spec.dataset else
             f"{tag} allreduce {spec.runner} {spec.model} n={spec.num_devices}"
             if spec.mode == "allreduce" else
             f"{tag} {runner_label(spec)} {spec.model} n={spec.num_devices}"
             f"{f' on {spec.num_nodes} nodes' if spec.num_nodes > 1 else ''} "
             f"b={spec.global_batch_size} {spec.precision} {spec.data_label}"
             f"{f' layers={spec.model_layers}' if spec.model_layers is not None else ''}")
    show = show or SweepProgress([True], live=False)
    show.started(label)
    t0 = time.monotonic()
    if spec.run_id in ctx.blocked:
        rec = record_without_run(spec, out, ctx.env, *ctx.blocked[spec.run_id])
    else:
        rec = run_one(spec, ctx.pythons, out, ctx.env, ctx.peaks)
    took = time.monotonic() - t0
    said = (f"{words(rec)} ({took:.1f}s)" if words
            else f"{rec['status']} ({took:.1f}s) {outcome_detail(rec)}")
    show.finished(label, said, took, counted)
    return rec


def run_capacity(cfg: SweepConfig, firsts: list[RunSpec], ctx: RunContext, out: Path,
                 resume: bool = False) -> list[dict[str, Any]]:
    """Capacity mode (bench/run/capacity.py): each search from its first probe, every probe
    launched as run_one launches a run (its record under out/probes/), a line per probe and
    one per search's end; the capacity records written and returned."""
    found = []
    probing = RunContext(ctx.pythons, ctx.env)  # a probe is never blocked, measures no peak
    for i, first in enumerate(firsts, 1):
        sid = search_id(first, cfg.scale)
        tag = f"[{i}/{len(firsts)}]"
        print(f"{tag} capacity search {sid} ({cfg.scale}: start {cfg.capacity['start']}, max "
              f"{cfg.capacity['max']}, resolution {cfg.capacity['resolution']}; "
              f"{capacity.limit_text(cfg.device, cfg.device_memory)})", flush=True)

        def launch_probe(spec: RunSpec, probes: Path, tag: str = tag) -> dict[str, Any]:
            return run_and_print(spec, f"{tag}   probe", probing, probes, counted=False,
                                 words=lambda probe_rec: capacity.probe_words(
                                     capacity.judge(probe_rec, cfg.device_memory)))

        rec = capacity.run_search(first, cfg, out, launch_probe,
                                  ctx.blocked.get(first.run_id), reuse=resume)
        print(f"{tag} {sid}: {capacity.outcome_text(rec)}", flush=True)
        found.append(rec)
    return found


def repeat_until_stable(rule: dict[str, Any], runs: list[RunSpec], ctx: RunContext, out: Path,
                        show: SweepProgress | None = None) -> None:
    """Extra repeats, one per unsettled configuration per round (so slow drift spreads over
    all of them), until each one's CV of images/sec is at most target_cv or it has
    max_repeats runs. A configuration with fewer than two ok runs is left alone."""
    first: dict[str, RunSpec] = {}
    for spec in runs:
        if spec.mode != "allreduce":  # the probes measure no images/sec: they run `repeats`
            first.setdefault(config_id(spec.run_id), spec)
    while True:
        records = load_records(out)
        by_config: dict[str, list[dict[str, Any]]] = {}
        for rec in records:
            by_config.setdefault(config_id(rec["run_id"]), []).append(rec)
        todo = []
        for cid, spec in first.items():
            recs = by_config.get(cid, [])
            ok = [r["images_per_sec"] for r in recs if r["status"] == "ok"]
            cv = coefficient_of_variation(ok)
            if spec.run_id in ctx.blocked or cv is None or cv <= rule["target_cv"] \
                    or len(recs) >= rule["max_repeats"]:
                continue
            todo.append((another_repeat(spec, max(r["repeat"] for r in recs) + 1), cv))
        if not todo:
            return
        for spec, cv in todo:
            run_and_print(spec, f"[until_stable: cv {cv:.1%} > {rule['target_cv']:.1%}, "
                                f"repeat {spec.repeat + 1}/{rule['max_repeats']}]",
                          ctx, out, show, counted=False)


def precheck(spec: RunSpec, visible_gpus: int | None) -> tuple[str, str] | None:
    """(status, reason) for a run that cannot be launched here (visible_gpus: the GPUs NVML
    sees, None when the runs go to a cluster's nodes); None if it can."""
    info = {"pipeline": PIPELINES, "allreduce": PROBES}.get(spec.mode, RUNNERS)[spec.runner]
    if why := dataset_missing(spec):
        return "unavailable", why
    if info.unavailable:
        return "unavailable", info.unavailable
    if spec.num_nodes > 1 and info.multi_node is None:
        return "invalid", (f"{spec.runner} is single-machine by design (its replicas live in "
                           "one process on one host's devices); it cannot span "
                           f"{spec.num_nodes} nodes")
    if spec.num_nodes > 1 and info.multi_node_unavailable:
        return "unavailable", (f"{spec.runner} across nodes ({info.multi_node}): "
                               f"{info.multi_node_unavailable}")
    if spec.mode == "converge" and not info.converges:
        takers = ", ".join(r.name for r in RUNNERS.values() if r.converges)
        return "unavailable", (f"{spec.runner} does not train to accuracy (mode converge): "
                               f"{info.no_converge or 'it times training steps only'}; "
                               f"runners that do: {takers or 'none yet'}")
    if spec.mode in ("benchmark", "converge") and (why := model_unavailable(spec, info)):
        return "unavailable", why
    if spec.precision not in info.precisions:
        return "invalid", (f"{spec.runner} supports precision {', '.join(info.precisions)}, "
                           f"not {spec.precision}")
    if spec.precision == "tf32" and spec.device != "gpu":
        return "invalid", ("precision tf32 is NVIDIA GPU tensor-core math (Ampere and newer); "
                           "on CPU float32 is always IEEE: use fp32")
    if spec.device == "gpu" and visible_gpus is not None and spec.num_devices > visible_gpus:
        return "unavailable", f"needs {spec.num_devices} GPUs; NVML sees {visible_gpus}"
    if spec.python and visible_gpus is not None and (why := interpreter_problem(spec.python)):
        return "unavailable", f"runner_options.{spec.runner}.python: {why}"
    if info.launch_check is not None and visible_gpus is not None \
            and (why := info.launch_check(spec)):
        return "unavailable", why
    return None


def dataset_missing(spec: RunSpec) -> str | None:
    """Why a run's dataset folder cannot be read yet (config validation lets a folder not
    made yet through), with the command that makes it; None when it has its manifest."""
    if not spec.dataset:
        return None
    path = Path(spec.dataset["path"])
    if (path / "manifest.json").is_file():
        return None
    if spec.mode == "converge":
        make = (f"python run_bench.py make-dataset --source digits --out {show_path(path)} (or "
                "--source cifar10 --from cifar-10-python.tar.gz: docs/CONVERGENCE.md)")
    else:
        make = (f"python run_bench.py prepare-data --src JPEG_CLASS_FOLDERS --out "
                f"{show_path(path)} (a demo source: make-dataset; docs/USAGE.md, \"Real data\")")
    return f"dataset.path {show_path(path)} is not made yet; make it first: {make}"


def interpreter_problem(python: str) -> str | None:
    """Why a user's interpreter cannot start a run on this machine (None if it can). Not
    asked of SLURM runs: their nodes' filesystem is theirs to check."""
    path = Path(python).expanduser()
    if not path.exists():
        return f"{show_path(path)} does not exist on this machine"
    if not path.is_file() or not os.access(path, os.X_OK):
        return f"{show_path(path)} is not an executable file"
    return None


def show_path(path: Path) -> str:
    text = str(path)
    return text if len(text) <= 120 else f"{text[:117]}..."


def model_unavailable(spec: RunSpec, info: RunnerInfo) -> str | None:
    """Why a runner cannot train the run's model (a user's model of another framework, a
    workload it does not build, token ids on real data), or None."""
    entry = spec.custom_model
    if entry:
        framework = entry["framework"]
        if framework in info.custom_models:
            kind = entry["input"]["kind"]
        else:
            takers = [r.name for r in RUNNERS.values() if framework in r.custom_models]
            own = (f"it takes {' or '.join(info.custom_models)} models" if info.custom_models
                   else "it builds only the models of models/ (its code is written around "
                   "their builders)")
            return (f"{spec.model} is a {framework} model; {spec.runner} cannot run it: {own}"
                    f" (a {framework} model runs on {', '.join(takers) or 'no runner yet'})")
    else:
        model = get_spec(spec.model)
        if model.workload not in info.workloads:
            why = info.era or f"it builds {' and '.join(info.workloads)} models"
            return f"{spec.model} is a {model.workload} model; {spec.runner}: {why}"
        kind = model.input_kind
    if kind == "tokens" and spec.data == "real":
        return (f"data real: the prepared datasets are images; {spec.model} takes token ids "
                "(it trains on synthetic tokens)")
    return None


def run_one(spec: RunSpec, pythons: dict[str, Any], out: Path, env: dict[str, Any],
            peaks: dict[tuple[str, str], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Launch one run in its family's interpreter, or record why there is none."""
    python = python_for(spec, pythons)
    if isinstance(python, Exception) or python is None:
        return record_without_run(spec, out, env, "unavailable",
                                  f"{spec.family} environment: {python}")
    return launch(spec, python, out, env, (peaks or {}).get((str(python), spec.precision)))
