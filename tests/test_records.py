"""Records: schema, atomic writes, loading, and what --resume skips."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from bench.records.store import (
    REQUIRED,
    check_record,
    done_run_ids,
    load_records,
    record_path,
    write_json_atomic,
)


def full(run_id: str, status: str = "ok", **kw: object) -> dict:
    rec = {k: None for k in REQUIRED}
    rec.update(runner="r", model="m", device="cpu", num_devices=1, scaling="weak",
               batch_size_per_device=8, global_batch_size=8, precision="fp32", data="synthetic")
    rec.update(run_id=run_id, status=status, images_per_sec=10.0 if status == "ok" else None,
               reason=None if status == "ok" else "why")
    rec.update(kw)
    return rec


def test_check_record() -> None:
    assert check_record(full("a")) == []
    assert check_record(full("a", status="failed")) == []
    assert "status 'weird'" in " ".join(check_record(full("a", status="weird")))
    assert check_record(full("a", images_per_sec=0.0))
    assert check_record(full("a", status="timeout", reason=None))
    partial = full("a")
    del partial["environment"]
    assert check_record(partial) == ["missing field 'environment'"]


def test_atomic_write_leaves_no_temp_files(tmp_path: Path) -> None:
    path = tmp_path / "runs" / "x.json"
    write_json_atomic(path, {"a": float("nan"), "p": Path("/x")})
    assert json.loads(path.read_text()) == {"a": None, "p": "/x"}
    assert [p.name for p in path.parent.iterdir()] == ["x.json"]


def test_failed_write_keeps_previous_record(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    write_json_atomic(path, {"v": 1})
    with contextlib.suppress(TypeError):
        write_json_atomic(path, {"v": object()})
    assert json.loads(path.read_text()) == {"v": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_load_skips_garbage_and_side_files(tmp_path: Path) -> None:
    write_json_atomic(record_path(tmp_path, "a"), full("a"))
    runs = tmp_path / "runs"
    (runs / "b.json").write_text("{not json")
    (runs / "c.spec.json").write_text(json.dumps({"run_id": "c"}))
    (runs / "d.result.json").write_text(json.dumps({"run_id": "d"}))
    assert [r["run_id"] for r in load_records(tmp_path)] == ["a"]


def test_resume_skips_done_and_can_retry_failures(tmp_path: Path) -> None:
    for run_id, status in [("a", "ok"), ("b", "timeout"), ("c", "failed"), ("d", "unavailable"),
                           ("e", "oom")]:
        write_json_atomic(record_path(tmp_path, run_id), full(run_id, status))
    assert done_run_ids(tmp_path) == {"a", "b", "c", "d", "e"}
    assert done_run_ids(tmp_path, retry_failed=True) == {"a", "d"}
    assert done_run_ids(tmp_path / "missing") == set()
