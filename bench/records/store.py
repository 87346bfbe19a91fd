"""Result records: one JSON file per run, written atomically, read back for resume and reports."""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

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


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "w", **kwargs: Any) -> Iterator[IO[Any]]:
    """A file to write that appears at path only whole: a temporary name beside it, fsynced
    and renamed; created with the process umask's permissions (mkstemp's 0600 would hide the
    results from a colleague). A failed write (a full disk) removes the temporary and leaves
    the last good file; the OSError names path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # 0o666 & ~umask
        with os.fdopen(fd, mode, **kwargs) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename in (None, str(tmp), tmp):
            exc.filename = str(path)  # the file the user knows, not the temporary
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Write text through atomic_file: never half a file."""
    with atomic_file(path) as fh:
        fh.write(text)


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


def load_records(results_dir: Path) -> list[dict[str, Any]]:
    """Every readable record in a results folder, in run-id order (unreadable ones skipped)."""
    records = []
    for path in sorted(runs_dir(results_dir).glob("*.json")):
        if path.name.endswith((".spec.json", ".result.json")):
            continue
        try:
            rec = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(rec, dict) and "run_id" in rec:
            records.append(rec)
    return records


def done_run_ids(results_dir: Path, retry_failed: bool = False) -> set[str]:
    """Runs that --resume skips: those with a record (but retryable ones if asked)."""
    return {
        r["run_id"] for r in load_records(results_dir)
        if r.get("status") != CANCELLED and not (retry_failed and r.get("status") in RETRYABLE)
    }
