"""Result records: one JSON file per run, written atomically, read back for resume and reports."""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from bench.atomic import atomic_file as atomic_file
from bench.atomic import write_text_atomic as write_text_atomic
from bench.records import columns

SCHEMA_VERSION = 1
STATUSES = ("ok", "failed", "timeout", "oom", "unavailable", "invalid", "cancelled")
# Statuses a plain --resume re-runs: cancelled (a SLURM job the sweep cancelled never ran to
# its end). With --retry-failed these are run again too.
RETRYABLE = ("failed", "timeout", "oom")
CANCELLED = "cancelled"

# Fields every record carries, whatever its status (None where not measured): the record
# view of the column registry (bench/records/columns.py), which check_record reads when it runs.
REQUIRED = columns.keys("record")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so a reader (or a killed sweep) never sees a half-written file."""
    text = json.dumps(json_safe(data), indent=2, sort_keys=True, default=_jsonable,
                      allow_nan=False)
    with atomic_file(path) as fh:
        fh.write(text + "\n")


def json_safe(value: Any) -> Any:
    """NaN and infinities become null: records are strict JSON that any reader accepts."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def check_record(record: dict[str, Any]) -> list[str]:
    """Problems with a record's schema; an empty list means it is well-formed."""
    problems = [f"missing field {k!r}" for k in columns.keys("record") if k not in record]
    status = record.get("status")
    if status not in STATUSES:
        problems.append(f"status {status!r} not in {STATUSES}")
    if status == "ok" and record.get("mode") == "allreduce":  # the probe: no images
        busbw = ((record.get("result") or {}).get("allreduce") or {}).get("busbw_gbps")
        if not isinstance(busbw, (int, float)) or not busbw > 0:
            problems.append(f"ok all-reduce record with busbw_gbps {busbw!r}")
    elif status == "ok":
        ips = record.get("images_per_sec")
        if not isinstance(ips, (int, float)) or not ips > 0:
            problems.append(f"ok record with images_per_sec {ips!r}")
    elif not record.get("reason"):
        problems.append(f"{status} record without a reason")
    return problems


def runs_dir(results_dir: Path) -> Path:
    return Path(results_dir) / "runs"


def record_path(results_dir: Path, run_id: str) -> Path:
    return runs_dir(results_dir) / f"{run_id}.json"


# -- the tolerant reader ---------------------------------------------------------------------
# Everything a results folder holds is read through here, bounded: a file over MAX_FILE_BYTES is
# never parsed, nesting past MAX_DEPTH is refused, and a record must pass the record schema
# (FIELDS) before any reader sees it. A file that fails is a Damaged entry: its path and a
# one-line reason, which report, compare, predict and --resume show, never a number from it.

MAX_FILE_BYTES = 16 * 2**20
MAX_DEPTH = 100
MAX_INT = 2**53  # integers JSON readers agree on; a larger one is no measurement
DAMAGED_SUFFIX = ".damaged"


class Damaged(NamedTuple):
    """A file of a results folder no reader may use: where it is and why (one line)."""

    path: Path
    reason: str

    def line(self, base: Path | None = None) -> str:
        """`damaged: runs/x.json: not JSON (...)`, the path relative to base when under it."""
        shown = self.path
        if base is not None:
            with contextlib.suppress(ValueError):
                shown = self.path.relative_to(base)
        return f"damaged: {_printable(str(shown))}: {self.reason}"


# The record schema: each field's kind (FIELDS), checked wherever the field is present and not
# null; the fields of IDENTITY and CONFIGURATION (which run, its status and the configuration
# it belongs to, bench/records/grouping.py) must be present and hold a value. The rest of the
# record view (REQUIRED) is not required here: the view grows as metrics are added, and a
# folder written by an earlier harness must still be read (check_record holds a new record to
# all of it). A field that no entry names may hold anything JSON allows.
IDENTITY = ("run_id", "status", "runner", "model", "device", "num_devices")
# ... and of a run that trains (not an all-reduce probe, which feeds no images):
CONFIGURATION = ("scaling", "batch_size_per_device", "global_batch_size", "precision", "data")
_STR = ("run_id", "sweep_id", "runner", "family", "model", "device", "scaling", "precision",
        "data", "data_label", "mode", "status", "reason", "memory_source", "target_reason",
        "state_source", "started_at", "finished_at", "log_path", "python", "attempt",
        "left_running", "launcher", "module")
_INT = ("schema_version", "num_nodes", "num_devices", "batch_size_per_device",
        "global_batch_size", "repeat", "warmup_steps", "measure_steps", "model_layers",
        "epochs_to_target", "epochs_run", "samples", "returncode")
_BOOL = ("virtual_devices", "moving_stats_finite", "contended")
_NUM = ("images_per_sec", "tokens_per_sec", "tokens_per_sec_per_device", "samples_per_sec",
        "tokens_per_sample", "flops_per_token", "final_accuracy", "best_accuracy",
        "time_to_target_s", "train_time_s", "eval_time_s", "converge_time_s", "first_loss",
        "last_loss", "window_start", "window_end", "wall_time_s", "timeout_s")
_DICT = ("options", "dataset", "custom_model", "converge", "memory_per_device",
         "device_peak_bytes", "memory_baseline", "model_state", "state_bytes_per_device",
         "state_bytes_global", "state_granularity_bytes", "state_check", "precision_policy",
         "environment", "result", "telemetry", "placement", "placement_check", "variant",
         "slurm", "equivalence")
_LIST = ("curve", "step_times_s")
FIELDS: dict[str, str] = {
    **dict.fromkeys(_STR, "str"), **dict.fromkeys(_INT, "int"),
    **dict.fromkeys(_BOOL, "bool"), **dict.fromkeys(_NUM, "num"),
    **dict.fromkeys(_DICT, "dict"), **dict.fromkeys(_LIST, "list"),
}
# ... and the physical range of a number (a value outside it is no measurement: 1e308
# images/sec, a batch of 0): (lowest, highest), throughputs 0 or from THROUGHPUT_MIN
THROUGHPUT_MIN = 1e-9
_RATES = ("images_per_sec", "tokens_per_sec", "tokens_per_sec_per_device", "samples_per_sec")
_SECONDS = ("time_to_target_s", "train_time_s", "eval_time_s", "converge_time_s",
            "wall_time_s", "timeout_s")
RANGES: dict[str, tuple[float, float]] = {
    **dict.fromkeys(_RATES, (0, 1e12)), **dict.fromkeys(_SECONDS, (0, 1e9)),
    **dict.fromkeys(("batch_size_per_device", "global_batch_size"), (1, 10**12)),
    **dict.fromkeys(("num_devices", "num_nodes"), (1, 2**24)),
    **dict.fromkeys(("warmup_steps", "measure_steps", "samples", "epochs_run",
                     "epochs_to_target", "repeat"), (0, 10**12)),
    **dict.fromkeys(("final_accuracy", "best_accuracy"), (0, 1)),
}
KIND_TEXT = {"str": "a string", "int": "an integer", "bool": "true or false",
             "num": "a finite number", "dict": "an object", "list": "a list"}
# what each element of a list field must be
ELEMENTS = {"step_times_s": "num", "curve": "dict"}


def is_kind(value: Any, kind: str) -> bool:
    """Whether a JSON value is of a schema kind (bools are not numbers; integers are bounded)."""
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind == "int":
        return isinstance(value, int) and abs(value) <= MAX_INT
    if kind == "num":
        return (isinstance(value, int) and abs(value) <= MAX_INT) or (
            isinstance(value, float) and math.isfinite(value))
    return isinstance(value, {"dict": dict, "list": list}[kind])


def out_of_range(key: str, value: Any, mode: Any = None) -> str | None:
    """Why a number of a RANGES field is no measurement (None: it is in range); an all-reduce
    probe feeds no images (its batch sizes are 0)."""
    low, high = RANGES[key]
    if mode == "allreduce" and key in ("batch_size_per_device", "global_batch_size"):
        low = 0
    rate = key in _RATES
    if low <= value <= high and not (rate and 0 < value < THROUGHPUT_MIN):
        return None
    allowed = f"0 or {THROUGHPUT_MIN:g} to {high:g}" if rate else f"{low:g} to {high:g}"
    return f"field {key!r} {value:g} is out of range; allowed: {allowed}"


def _what(value: Any) -> str:
    """A value's kind in words, for a reason (never the value itself: it may be huge)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer" + (" out of range" if abs(value) > MAX_INT else "")
    if isinstance(value, float):
        return "a number" if math.isfinite(value) else "a non-finite number"
    kinds: dict[type, str] = {str: "a string", list: "a list", dict: "an object"}
    return kinds.get(type(value), "a value")


def _short(text: str, limit: int = 40) -> str:
    text = _printable(text)
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _printable(text: str) -> str:
    """text that any terminal encoding can print: lone surrogates and controls escaped."""
    return "".join(c if c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF
                   else c.encode("unicode_escape", "backslashreplace").decode("ascii")
                   for c in text)


def record_problems(rec: Any, name: str | None = None) -> list[str]:
    """What keeps a parsed file from being a record (empty: it is one): an object holding
    the fields of IDENTITY, each field of its schema kind (FIELDS), run_id its file's name
    (name, the file name without .json) and status one of STATUSES."""
    if not isinstance(rec, dict):
        return [f"top level is {_what(rec)}, not an object"]
    needed = IDENTITY if rec.get("mode") == "allreduce" else IDENTITY + CONFIGURATION
    missing = [k for k in needed if k not in rec]
    problems = []
    if missing:
        problems.append(f"missing field{'s' if len(missing) > 1 else ''} "
                        f"{', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    for key, value in rec.items():
        kind = FIELDS.get(key)
        if value is None:
            if key in needed:
                problems.append(f"field {key!r} is null; allowed: {KIND_TEXT[kind or 'str']}")
        elif kind and not is_kind(value, kind):
            problems.append(f"field {key!r} is {_what(value)}; allowed: {KIND_TEXT[kind]}"
                            f"{'' if key in needed else ' or null'}")
        elif key in ELEMENTS and not all(is_kind(v, ELEMENTS[key]) for v in value):
            problems.append(f"field {key!r} holds an element that is not "
                            f"{KIND_TEXT[ELEMENTS[key]]}")
        elif key in RANGES and (why := out_of_range(key, value, rec.get("mode"))):
            problems.append(why)
    status = rec.get("status")
    if isinstance(status, str) and status not in STATUSES:
        problems.append(f"status {_short(status)} is not one of {', '.join(STATUSES)}")
    if status == "ok":  # an ok run holds its figure (check_record's rule)
        figure, value = (("busbw_gbps", _probe_busbw(rec)) if rec.get("mode") == "allreduce"
                         else ("images_per_sec", rec.get("images_per_sec")))
        if not (is_kind(value, "num") and value is not None and value > 0):
            problems.append(f"an ok record whose {figure} is {_what(value)}; allowed: a "
                            "number above 0")
    run_id = rec.get("run_id")
    if isinstance(run_id, str) and name is not None and run_id != name:
        problems.append(f"run_id {_short(run_id)} is not the file's name")
    elif isinstance(run_id, str) and HARNESS_ID.search(run_id):
        problems += _contradicts_its_id(rec, run_id.split("__"))
    env = rec.get("environment")
    if isinstance(env, dict):
        problems += [f"field 'environment': {p}" for p in environment_problems(env)]
    return problems


# a run id the harness made (bench/plan/runs.py make_run_id): parts joined by "__", the repeat last
HARNESS_ID = re.compile(r"__r\d+$")


def _contradicts_its_id(rec: dict[str, Any], parts: list[str]) -> list[str]:
    """The fields a harness-made run id names (runner, model) where the record holds another
    value: an edited or misplaced record."""
    return [f"field {key!r} {_short(rec[key])} is not in its run id"
            for key in ("runner", "model") if isinstance(rec.get(key), str)
            and rec[key] not in parts]


# what the readers of an environment capture (environment.json, a record's environment) use
ENVIRONMENT_FIELDS = {"host": "str", "os": "str", "cpu_model": "str", "cpu_isa": "str",
                      "cpu_cores": "int",
                      "memory_bytes": "int", "python": "str", "harness_commit": "str",
                      "gpus": "list", "framework": "dict", "gpu_topology": "dict",
                      "lock": "dict"}
GPU_FIELDS = {"name": "str", "pcie_max_gen": "int", "pcie_max_width": "int"}


def environment_problems(env: dict[str, Any]) -> list[str]:
    """What keeps an environment capture from being read: a field of another kind than its
    readers use (ENVIRONMENT_FIELDS, and GPU_FIELDS of each GPU)."""
    problems = [f"{k} is {_what(env[k])}; allowed: {KIND_TEXT[kind]} or null"
                for k, kind in ENVIRONMENT_FIELDS.items()
                if env.get(k) is not None and not is_kind(env[k], kind)]
    gpus = env.get("gpus")
    for gpu in gpus if isinstance(gpus, list) else []:
        if not isinstance(gpu, dict):
            problems.append(f"a GPU is {_what(gpu)}; allowed: an object")
            break
        problems += [f"a GPU's {k} is {_what(gpu[k])}; allowed: {KIND_TEXT[kind]} or null"
                     for k, kind in GPU_FIELDS.items()
                     if gpu.get(k) is not None and not is_kind(gpu[k], kind)]
    framework = env.get("framework")
    if isinstance(framework, dict) and not all(isinstance(v, str) or v is None
                                               for v in framework.values()):
        problems.append("a framework version is not a string")
    topo = env.get("gpu_topology")
    if isinstance(topo, dict) and not isinstance(topo.get("nvidia_smi_topo_m") or "", str):
        problems.append("gpu_topology.nvidia_smi_topo_m is not a string")
    return problems


def _probe_busbw(rec: dict[str, Any]) -> Any:
    result = rec.get("result")
    probe = result.get("allreduce") if isinstance(result, dict) else None
    return probe.get("busbw_gbps") if isinstance(probe, dict) else None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def read_json(path: Path, max_bytes: int = MAX_FILE_BYTES) -> tuple[Any, str | None]:
    """A JSON file's value, read bounded: (value, None), or (None, a one-line reason) when it
    is a link or not a regular file, is over max_bytes, not UTF-8, not strict JSON (NaN,
    Infinity), or nested deeper than MAX_DEPTH."""
    try:
        info = os.lstat(path)  # a link is not followed: nothing outside the folder is read
        if stat.S_ISLNK(info.st_mode):
            return None, "a link (a results folder's files are read only as its own)"
        if not stat.S_ISREG(info.st_mode):
            return None, "not a regular file"
        if info.st_size > max_bytes:
            return None, f"{info.st_size:,} bytes; allowed: at most {max_bytes:,}"
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    if len(data) > max_bytes:
        return None, f"over {max_bytes:,} bytes"
    if not data.strip():
        return None, "empty file"
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})"
    try:
        value = json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        return None, f"nested deeper than {MAX_DEPTH} levels"
    except ValueError as exc:  # JSONDecodeError included
        return None, f"not JSON ({_printable(str(exc))[:80]})"
    problem = _walk_problem(value)
    return (None, problem) if problem else (value, None)


def _walk_problem(value: Any) -> str | None:
    """Nesting past MAX_DEPTH, a string no terminal can print (a lone surrogate) or a number
    that overflowed to infinity (1e400): the first such problem of a parsed value, found
    without recursion."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            return f"nested deeper than {MAX_DEPTH} levels"
        if isinstance(node, dict):
            for k, v in node.items():
                if _surrogate(k):
                    return "a key holds a lone surrogate (not text)"
                stack.append((v, depth + 1))
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
        elif isinstance(node, str) and _surrogate(node):
            return "a string holds a lone surrogate (not text)"
        elif isinstance(node, float) and not math.isfinite(node):
            return "a number too large for a float (a non-finite number)"
    return None


def _surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def read_record(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """One record file: (record, None) when it passes the schema, else (None, the reason)."""
    value, reason = read_json(path)
    if reason:
        return None, reason
    problems = record_problems(value, path.name.removesuffix(".json"))
    if problems:
        return None, "; ".join(problems[:2]) + (f" (+{len(problems) - 2} more)"
                                                if len(problems) > 2 else "")
    return value, None


def record_files(results_dir: Path) -> list[Path]:
    """The record files of a results folder (not a run's .spec.json or .result.json)."""
    return [p for p in sorted(runs_dir(results_dir).glob("*.json"))
            if not p.name.endswith((".spec.json", ".result.json"))]


_SCANS: dict[Path, tuple[list[dict[str, Any]], list[Damaged]]] | None = None


@contextlib.contextmanager
def one_scan() -> Iterator[None]:
    """Within it, each results folder's records are read once: a report reads them from
    several places, and nothing writes them meanwhile (3,000 records: 5 reads were half of
    report's time)."""
    global _SCANS
    outer = _SCANS
    _SCANS = {} if outer is None else outer
    try:
        yield
    finally:
        _SCANS = outer


def scan_records(results_dir: Path) -> tuple[list[dict[str, Any]], list[Damaged]]:
    """The tolerant reader of a results folder's records: (every valid record in run-id
    order, every damaged file with its reason); read once within one_scan."""
    if _SCANS is None:
        return _scan(results_dir)
    key = Path(results_dir).resolve()
    if key not in _SCANS:
        _SCANS[key] = _scan(results_dir)
    records, damaged = _SCANS[key]
    return list(records), list(damaged)


def _scan(results_dir: Path) -> tuple[list[dict[str, Any]], list[Damaged]]:
    records, damaged = [], []
    sweep = sweep_settings(results_dir)
    for path in record_files(results_dir):
        rec, reason = read_record(path)
        if rec is not None and (reason := not_the_sweeps(rec, sweep)):
            rec = None
        if rec is None:
            damaged.append(Damaged(path, reason or "unreadable"))
        else:
            records.append(rec)
    return records, damaged


# what every benchmark and converge record of a sweep holds as its fingerprint.json says
SWEEP_WIDE = ("warmup_steps", "measure_steps", "device", "scaling", "precision")
FINGERPRINT_NAME = "fingerprint.json"  # written by bench/run/sweep.py


def sweep_settings(results_dir: Path) -> dict[str, Any]:
    """The folder's fingerprint settings (fingerprint.json, read bounded); {} without one."""
    path = Path(results_dir) / FINGERPRINT_NAME
    value = read_json(path)[0] if path.exists() else None
    settings = value.get("settings") if isinstance(value, dict) else None
    return settings if isinstance(settings, dict) else {}


def not_the_sweeps(rec: dict[str, Any], sweep: dict[str, Any]) -> str | None:
    """Why a record is not one of its folder's sweep (a field that contradicts the
    fingerprint: an edited or stray record), or None; pipeline and probe records count their
    own steps."""
    if rec.get("mode") not in (None, "benchmark", "converge"):
        return None
    for key in SWEEP_WIDE:
        want, have = sweep.get(key), rec.get(key)
        if want is None or have is None or have == want or (
                isinstance(want, list) and have in want):
            continue
        return f"field {key!r} {_short(str(have))} is not its sweep's (fingerprint.json: " \
               f"{_short(str(want))})"
    return None


def load_records(results_dir: Path) -> list[dict[str, Any]]:
    """Every valid record in a results folder, in run-id order; damaged ones are never
    returned (scan_records names them)."""
    return scan_records(results_dir)[0]


def read_environment(results_dir: Path) -> tuple[dict[str, Any] | None, Damaged | None]:
    """A results folder's environment.json: (its object, None); (None, None) when there is
    none; (None, the damage) when it cannot be used."""
    path = Path(results_dir) / "environment.json"
    if not path.exists():
        return None, None
    value, reason = read_json(path)
    if reason is None and not isinstance(value, dict):
        reason = f"top level is {_what(value)}, not an object"
    if reason is None and (problems := environment_problems(value)):
        reason = "; ".join(problems[:2])
    return (None, Damaged(path, reason)) if reason else (value, None)


def folder_damage(results_dir: Path) -> list[Damaged]:
    """Every damaged file of a results folder a report reads: its records and environment.json."""
    damaged = scan_records(results_dir)[1]
    env_damage = read_environment(results_dir)[1]
    return damaged + ([env_damage] if env_damage else [])


def set_aside_damaged(results_dir: Path, run_ids: set[str]) -> list[str]:
    """Before --resume re-runs them: each damaged record file of a run in run_ids renamed to
    <name>.json.damaged (beside it; a number added if one is there), so the new record never
    overwrites it. One line per damaged record file (set aside or not)."""
    lines = []
    for item in scan_records(results_dir)[1]:
        run_id = item.path.name.removesuffix(".json")
        if run_id not in run_ids:
            lines.append(f"{item.line()} (not a run of this sweep: left as it is)")
            continue
        target = item.path.with_name(item.path.name + DAMAGED_SUFFIX)
        n = 1
        while target.exists():
            n += 1
            target = item.path.with_name(f"{item.path.name}{DAMAGED_SUFFIX}.{n}")
        os.replace(item.path, target)
        lines.append(f"{item.line()} (kept as {target.name}; the run is run again)")
    return lines


def done_run_ids(results_dir: Path, retry_failed: bool = False) -> set[str]:
    """Runs that --resume skips: those with a valid record (but retryable ones if asked); a run
    whose record is missing, damaged or incomplete is not done."""
    return {
        r["run_id"] for r in load_records(results_dir)
        if r.get("status") != CANCELLED and not (retry_failed and r.get("status") in RETRYABLE)
    }
