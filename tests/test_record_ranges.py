"""Numbers of the right kind but no measurement (1e308 or 5e-324 images/sec, a batch of 0) are
damaged with the field, the value and the range, and report and predict go on without them
(issue 43, item 4)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bench.records.store import read_record, scan_records
from tests.helpers.cli import REPO, run_cli

GOLDEN = REPO / "tests" / "golden" / "converge-results"
ABSURD = [("images_per_sec", 1e308, "0 or 1e-09 to 1e+12"),
          ("images_per_sec", 5e-324, "0 or 1e-09 to 1e+12"),
          ("batch_size_per_device", 0, "1 to 1e+12"),
          ("global_batch_size", 0, "1 to 1e+12"),
          ("wall_time_s", -1.0, "0 to 1e+09"),
          ("final_accuracy", 1.5, "0 to 1")]


def absurd_folder(tmp_path: Path) -> tuple[Path, list[Path]]:
    """The golden converge folder with one more record per ABSURD value."""
    out = tmp_path / "f"
    shutil.copytree(GOLDEN, out)
    first = sorted((out / "runs").glob("*__r0.json"))[0]
    rec = json.loads(first.read_text())
    written = []
    for i, (field, value, _) in enumerate(ABSURD):
        run_id = rec["run_id"][:-3] + f"__r{10 + i}"
        path = out / "runs" / f"{run_id}.json"
        path.write_text(json.dumps({**rec, "run_id": run_id, "repeat": 10 + i, field: value}))
        written.append(path)
    return out, written


@pytest.mark.parametrize(("field", "value", "allowed"), ABSURD)
def test_a_number_out_of_its_physical_range_is_damaged_naming_it(
        tmp_path: Path, field: str, value: float, allowed: str) -> None:
    rec = json.loads(sorted(GOLDEN.glob("runs/*__r0.json"))[0].read_text())
    path = tmp_path / f"{rec['run_id']}.json"
    path.write_text(json.dumps({**rec, field: value}))
    got, reason = read_record(path)
    assert got is None
    assert reason == f"field {field!r} {value:g} is out of range; allowed: {allowed}"


def test_an_all_reduce_probe_keeps_its_batch_of_0() -> None:
    from bench.records.store import out_of_range

    assert out_of_range("global_batch_size", 0, "allreduce") is None
    assert out_of_range("global_batch_size", 0, "benchmark") is not None


def test_report_and_predict_name_absurd_records_and_go_on(tmp_path: Path) -> None:
    out, written = absurd_folder(tmp_path)
    records, damaged = scan_records(out)
    assert sorted(d.path for d in damaged) == sorted(written) and records
    for proc in (run_cli("report", str(out)), run_cli("predict", str(out))):
        both = proc.stdout + proc.stderr
        assert "Traceback" not in both and proc.returncode in (0, 2), both[-2000:]
        assert all(f"{p.name}: field " in proc.stderr for p in written), both
