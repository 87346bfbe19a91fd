"""A results folder belongs to one sweep; nothing outside it is written or read through it,
and no input is read without bound (issue 43, items 1, 3, 4, 8 and 9): a new sweep into another
sweep's folder is refused; the sweep's lock is opened without following a link and only as a
regular file; a record's telemetry path only inside the folder, its series tolerantly, its
chart drawn once; make-dataset's --from only as a regular file (or a folder) of bounded size."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.plan.config import show_value
from bench.run import sweep_lock
from tests.helpers.cli import run_cli
from tests.helpers.toy import config, toy


def test_a_lock_that_is_a_link_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / sweep_lock.LOCK_NAME).symlink_to(target)
    with pytest.raises(sweep_lock.FolderBusy, match=r"its lock \.sweep\.lock is a link"):
        sweep_lock.acquire(out)
    assert target.read_text() == "keep me\n"


def test_a_lock_that_is_no_regular_file_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / sweep_lock.LOCK_NAME)
    with pytest.raises(sweep_lock.FolderBusy, match="is not a regular file"):
        sweep_lock.acquire(out)


def test_a_sweep_onto_a_linked_lock_is_one_line_and_writes_nothing_through_it(
        tmp_path: Path) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / sweep_lock.LOCK_NAME).symlink_to(target)
    proc = toy("--config", str(config(tmp_path)), "--out", str(out), "--resume")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "is a link" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert target.read_text() == "keep me\n"
    assert not (out / "runs").exists()


@pytest.mark.parametrize("kind", ["character device", "FIFO"])
def test_make_dataset_from_a_device_or_fifo_is_refused_unread(kind: str, tmp_path: Path) -> None:
    source = Path("/dev/zero")
    if kind == "FIFO":
        source = tmp_path / "cifar.tar.gz"
        os.mkfifo(source)  # no writer: reading it would block for good
    proc = run_cli("make-dataset", "--source", "cifar10", "--from", str(source),
                   "--out", str(tmp_path / "out"), timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (f"error: --from: {str(source)!r} is not a regular file; "
                                   "allowed: cifar-10-python.tar.gz or the folder "
                                   "cifar-10-batches-py")


def telemetry_record(run_id: str, path: str) -> dict:
    return {"run_id": run_id, "status": "ok", "environment": {"cpu_cores": 2},
            "telemetry": {"path": path, "window_s": 1.0}}


SERIES = "t_rel,host_cpu_pct,run_cpu_cores,run_rss_bytes\n0.0,50,1,1000\n0.5,60,1,2000\n"


def test_a_telemetry_path_out_of_the_folder_is_never_read(tmp_path: Path) -> None:
    from bench.report.telemetry_chart import render_telemetry_charts, series_path

    outside = tmp_path / "outside.csv"
    outside.write_text(SERIES)
    out = tmp_path / "out"
    (out / "runs").mkdir(parents=True)
    (out / "runs" / "linked.csv").symlink_to(outside)
    records = [telemetry_record("up", "../outside.csv"),
               telemetry_record("absolute", str(outside)),
               telemetry_record("linked", "runs/linked.csv"),
               telemetry_record("passwd", "/etc/passwd")]
    assert [series_path(r, out) for r in records] == [None] * 4
    assert render_telemetry_charts(out, records) == []


def test_a_damaged_telemetry_series_is_no_chart_and_no_traceback(tmp_path: Path) -> None:
    from bench.report.telemetry_chart import render_telemetry_charts

    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "words.csv").write_text("t_rel,host_cpu_pct\nabc,def\n")
    (tmp_path / "runs" / "latin1.csv").write_bytes(b"t_rel,host_cpu_pct\n0.0,\xe9\n")
    (tmp_path / "runs" / "good.csv").write_text(SERIES)
    records = [telemetry_record(n, f"runs/{n}.csv") for n in ("words", "latin1", "good")]
    charts = render_telemetry_charts(tmp_path, records)
    assert charts == [tmp_path / "charts" / "telemetry" / "good.png"]


def test_a_telemetry_chart_is_drawn_once_while_newer_than_its_series(tmp_path: Path) -> None:
    from bench.report.telemetry_chart import render_telemetry_charts

    (tmp_path / "runs").mkdir()
    series = tmp_path / "runs" / "r.csv"
    series.write_text(SERIES)
    records = [telemetry_record("r", "runs/r.csv")]
    [chart] = render_telemetry_charts(tmp_path, records)
    os.utime(chart, (1.1e9, 1.1e9))  # drawn after the series: kept as it is
    os.utime(series, (1e9, 1e9))
    assert render_telemetry_charts(tmp_path, records) == [chart]
    assert chart.stat().st_mtime == 1.1e9
    os.utime(series, (1.2e9, 1.2e9))  # a newer series (a rerun): drawn again
    assert render_telemetry_charts(tmp_path, records) == [chart]
    assert chart.stat().st_mtime > 1.2e9


@pytest.fixture(scope="module")
def finished_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One toy sweep's results folder, for the tests that only try (and fail) to write it."""
    tmp_path = tmp_path_factory.mktemp("finished")
    out = tmp_path / "out"
    assert toy("--config", str(config(tmp_path)), "--out", str(out)).returncode == 0
    return out


@pytest.mark.parametrize("dry", [False, True])
def test_a_new_sweep_into_another_sweeps_folder_is_refused(
        dry: bool, tmp_path: Path, finished_sweep: Path) -> None:
    out = finished_sweep
    before = sorted(p.name for p in (out / "runs").iterdir())
    other = config(tmp_path, measure_steps=5, devices=[1])
    proc = toy("--config", str(other), "--out", str(out), *(["--dry-run"] if dry else []))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (
        f"error: --out {show_value(str(out))}: it holds another sweep's results "
        "(fingerprint.json); "
        "allowed: --resume to finish or grow that sweep (its settings), or --out a new folder")
    assert sorted(p.name for p in (out / "runs").iterdir()) == before


def test_a_report_draws_at_most_max_new_charts_flagged_runs_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    from bench.report import telemetry_chart

    (tmp_path / "runs").mkdir()
    records = []
    for i, status in enumerate(("ok", "failed", "ok")):
        (tmp_path / "runs" / f"r{i}.csv").write_text(SERIES)
        records.append({**telemetry_record(f"r{i}", f"runs/r{i}.csv"), "status": status,
                        "finished_at": f"2026-11-27T10:0{i}:00+00:00"})
    monkeypatch.setattr(telemetry_chart, "MAX_NEW", 2)
    charts = telemetry_chart.render_telemetry_charts(tmp_path, records)
    # the failed run first, then the latest; the third waits for the next report
    assert [c.stem for c in charts] == ["r1", "r2"]
    assert "telemetry charts: 1 of 3 new ones left for the next report" in capsys.readouterr().out
    assert [c.stem for c in telemetry_chart.render_telemetry_charts(tmp_path, records)] == \
        ["r1", "r2", "r0"]


def test_a_report_reads_each_record_file_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    from bench import cli
    from bench.records import store

    out = tmp_path / "f"
    shutil.copytree(Path(__file__).parent / "golden" / "converge-results", out)
    reads: list[str] = []
    real = store.read_record
    monkeypatch.setattr(store, "read_record", lambda p: reads.append(p.name) or real(p))
    assert cli.main(["report", str(out)]) == 0
    assert reads and len(reads) == len(set(reads)) == len(store.record_files(out))


def test_a_record_that_is_a_link_is_damaged_and_its_target_never_read(tmp_path: Path) -> None:
    import shutil

    from bench.records.store import scan_records

    out = tmp_path / "f"
    shutil.copytree(Path(__file__).parent / "golden" / "converge-results", out)
    first = sorted((out / "runs").glob("*__r0.json"))[0]
    outside = tmp_path / "outside.json"
    first.rename(outside)  # a whole record, outside the folder, linked in under its name
    first.symlink_to(outside)
    records, damaged = scan_records(out)
    assert [(d.path, d.reason) for d in damaged] == [
        (first, "a link (a results folder's files are read only as its own)")]
    assert first.stem not in {r["run_id"] for r in records}


def test_a_telemetry_series_that_cannot_be_written_leaves_no_temporary(tmp_path: Path) -> None:
    from bench.run.telemetry import write_series

    path = tmp_path / "runs" / "r.telemetry.csv"
    path.mkdir(parents=True)  # in the way of the rename, as a full disk is of the write
    with pytest.raises(OSError) as info:
        write_series(path, [{"t": 1.0}], None, None)
    assert info.value.filename == str(path)  # the series named, not "a record"
    assert sorted(p.name for p in path.parent.iterdir()) == ["r.telemetry.csv"]


def test_a_record_that_contradicts_its_sweeps_fingerprint_is_damaged_and_runs_again(
        tmp_path: Path) -> None:
    import json

    from bench.records.store import scan_records

    cfg, out = config(tmp_path), tmp_path / "out"
    assert toy("--config", str(cfg), "--out", str(out)).returncode == 0
    edited = sorted((out / "runs").glob("*__n1__*__r0.json"))[0]
    rec = json.loads(edited.read_text())
    edited.write_text(json.dumps({**rec, "measure_steps": 500}))
    _, damaged = scan_records(out)
    assert [(d.path, d.reason) for d in damaged] == [
        (edited, "field 'measure_steps' '500' is not its sweep's (fingerprint.json: '3')")]
    resumed = toy("--config", str(cfg), "--out", str(out), "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "2 runs, 1 already done" in resumed.stdout
    assert json.loads(edited.read_text())["measure_steps"] == 3  # run again
    assert edited.with_name(edited.name + ".damaged").exists()  # the edited one kept beside


def test_a_record_whose_runner_or_model_contradicts_its_run_id_is_damaged(
        tmp_path: Path) -> None:
    import json

    from bench.records.store import read_record

    rec = json.loads(sorted((Path(__file__).parent / "golden" / "converge-results" / "runs")
                            .glob("*__r0.json"))[0].read_text())
    path = tmp_path / f"{rec['run_id']}.json"
    path.write_text(json.dumps({**rec, "runner": "tf_mirrored", "model": "resnet50"}))
    assert read_record(path) == (None, "field 'runner' 'tf_mirrored' is not in its run id; "
                                       "field 'model' 'resnet50' is not in its run id")
