"""Atomic, readable output and no stray processes (issue 29, classes 4 and 5): every file of a
results folder is readable by the group and others under the default umask; a write that
fails (a full disk, a folder this user cannot write) leaves the last good file, no temporary,
and one line naming the path; a descendant that detached with setsid ends with its run; a
second Ctrl-C during the shutdown or the report ends quietly. Real processes throughout."""

from __future__ import annotations

import ctypes
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.records.store import load_records, runs_dir
from tests.helpers.cli import REPO
from tests.helpers.toy import TOY, alive, config, nothing_left, run_until_second_run, toy

GOLDEN = REPO / "tests" / "golden" / "converge-results"
CLI = [sys.executable, str(REPO / "run_bench.py")]


def temporaries(folder: Path) -> list[str]:
    return [str(p) for p in folder.rglob("*") if p.name.endswith(".tmp")]


def golden_copy(tmp_path: Path) -> Path:
    """A real sweep's records (12 converge runs) to write reports from."""
    out = tmp_path / "golden"
    shutil.copytree(GOLDEN, out)
    return out


@pytest.mark.parametrize("umask, readable", [(0o022, True), (0o077, False)])
def test_every_file_of_a_sweep_has_the_umask_permissions(tmp_path: Path, umask: int,
                                                         readable: bool) -> None:
    """Records (written by the parent and by the child), environment.json, peaks.json,
    config.yaml, the report: 0o666 & ~umask, never mkstemp's 0600 under umask 022."""
    out = tmp_path / "out"
    cfg = config(tmp_path, devices=[1])
    proc = subprocess.run([*TOY, "--config", str(cfg), "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=180,
                          preexec_fn=lambda: os.umask(umask))
    assert proc.returncode == 0, proc.stderr
    files = [p for p in out.rglob("*") if p.is_file()]
    names = {p.name for p in files}
    assert {"environment.json", "config.yaml", "fingerprint.json", "summary.csv",
            "report.html"} <= names
    assert any(n.endswith(".result.json") for n in names)  # the child's own write
    assert len(load_records(out)) == 1
    for p in files:
        mode = stat.S_IMODE(p.stat().st_mode)
        if p.name == ".sweep.lock":
            continue
        assert mode & 0o600 == 0o600, (p, oct(mode))
        assert bool(mode & 0o044 == 0o044) is readable and not mode & umask, (p, oct(mode))


def full_disk(size: int):  # noqa: ANN201 - a preexec_fn
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes fail with EFBIG, as on ENOSPC
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    return limit


@pytest.mark.slow  # a real sweep end to end: the fast set's budget
def test_a_full_disk_during_the_end_of_sweep_report_is_one_line(tmp_path: Path) -> None:
    """Room for the records but not for the report's charts: one line naming the file, exit
    1, every record whole, no temporary left anywhere."""
    first, out = tmp_path / "first", tmp_path / "out"
    cfg = config(tmp_path, devices=[1])
    assert toy("--config", str(cfg), "--out", str(first)).returncode == 0
    run_files = [p for p in first.rglob("*") if p.is_file() and "charts" not in p.parts
                 and p.suffix != ".html" and p.suffix != ".csv"]
    limit = max(p.stat().st_size for p in run_files) + 1024
    charts = [p for p in (first / "charts").rglob("*.png") if p.stat().st_size > limit]
    assert charts, "no chart larger than the records: the limit would not hit the report"
    proc = subprocess.run([*TOY, "--config", str(cfg), "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=180,
                          preexec_fn=full_disk(limit))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"cannot write {out}") and "run_bench.py report" in line, line
    assert "Traceback" not in proc.stderr
    [rec] = load_records(out)
    assert rec["status"] == "ok"
    assert temporaries(out) == []
    # with room, the report is written in full
    again = subprocess.run([*CLI, "report", str(out)], cwd=REPO, capture_output=True,
                           text=True, timeout=180)
    assert again.returncode == 0, again.stderr


def test_a_full_disk_during_report_keeps_the_last_good_summary(tmp_path: Path) -> None:
    out = golden_copy(tmp_path)
    ok = subprocess.run([*CLI, "report", str(out)], cwd=REPO, capture_output=True, text=True,
                        timeout=180)
    assert ok.returncode == 0, ok.stderr
    good = (out / "summary.csv").read_bytes()
    next(runs_dir(out).glob("*.json")).unlink()  # the summary would change
    proc = subprocess.run([*CLI, "report", str(out)], cwd=REPO, capture_output=True,
                          text=True, timeout=180, preexec_fn=full_disk(64))
    assert proc.returncode == 1, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert str(out / "summary.csv") in line and "Traceback" not in proc.stderr, line
    assert (out / "summary.csv").read_bytes() == good
    assert temporaries(out) == []


def drop_dac_override() -> None:
    """In the child: root without CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH (dropped from the
    bounding set, so exec does not give them back) obeys a folder's mode bits as anyone."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (1, 2):
        libc.prctl(24, cap, 0, 0, 0)  # PR_CAPBSET_DROP


def as_a_colleague(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=180, preexec_fn=drop_dac_override if os.geteuid() == 0
                          else None)


def read_only(folder: Path) -> None:
    for p in [folder, *folder.rglob("*")]:
        p.chmod(0o555 if p.is_dir() else 0o444)
    probe = subprocess.run([sys.executable, "-c", f"open({str(folder / 'x')!r}, 'w')"],
                           capture_output=True, preexec_fn=drop_dac_override
                           if os.geteuid() == 0 else None)
    if probe.returncode == 0:  # root without CAP_SETPCAP: no folder is unwritable to it
        pytest.skip("this host cannot make a folder unwritable to the tests")


@pytest.fixture(scope="module")
def toy_sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-run toy sweep's folder, made once; tests copy it before they change it."""
    tmp_path = tmp_path_factory.mktemp("toy_sweep")
    out = tmp_path / "out"
    proc = toy("--config", str(config(tmp_path, devices=[1])), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.parametrize("command", [["report"], ["predict", "--busbw", "10"]])
def test_an_unwritable_folder_is_one_line_naming_the_path(tmp_path: Path, toy_sweep: Path,
                                                          command: list[str]) -> None:
    """A colleague's report or predict on a folder they may read but not write."""
    out = tmp_path / "out"
    shutil.copytree(toy_sweep, out)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    read_only(out)
    try:
        proc = as_a_colleague(command[0], str(out), *command[1:])
    finally:
        for p in [out, *out.rglob("*")]:
            p.chmod(0o755 if p.is_dir() else 0o644)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {out}/") and "Permission denied" in line, line
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_a_detached_descendant_ends_with_its_run(tmp_path: Path) -> None:
    """A helper the run started in a session of its own (setsid) is re-parented to the
    run's guard, killed when the run ends normally, and named in left_running."""
    out, pids = tmp_path / "out", tmp_path / "detached.pid"
    cfg = config(tmp_path, devices=[1], options={"detached_pid_file": str(pids)})
    proc = toy("--config", str(cfg), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    helper = int(pids.read_text())
    [rec] = load_records(out)
    assert rec["status"] == "ok", rec["reason"]
    assert "1 had left its process group" in rec["left_running"], rec.get("left_running")
    assert not alive(helper)


@pytest.mark.slow  # a real sweep end to end: the fast set's budget
def test_a_detached_descendant_of_a_hung_run_dies_at_the_timeout(tmp_path: Path) -> None:
    out, pids = tmp_path / "out", tmp_path / "detached.pid"
    cfg = config(tmp_path, "hang", devices=[1], timeout_s=3,
                 options={"detached_pid_file": str(pids)})
    proc = toy("--config", str(cfg), "--out", str(out))
    assert proc.returncode == 3, proc.stderr  # a timed-out run fails the sweep
    [rec] = load_records(out)
    assert rec["status"] == "timeout"
    deadline = time.monotonic() + 2
    while alive(int(pids.read_text())) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(int(pids.read_text()))


@pytest.mark.slow  # a real sweep end to end: the fast set's budget
def test_ctrl_c_again_and_again_during_shutdown_and_report_ends_quietly(
        tmp_path: Path) -> None:
    """SIGINT every 50 ms from the first one until the sweep exits: through the kill of the
    running run and the report. No traceback, exit 130, the records whole, no temporary."""
    proc, out, pids, _ = run_until_second_run(tmp_path)
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        proc.send_signal(signal.SIGINT)
        time.sleep(0.05)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert len([ln for ln in err.splitlines() if ln.strip()]) <= 2, err  # stopped; and again
    assert {r["num_devices"]: r["status"] for r in load_records(out)} == {1: "ok"}
    assert temporaries(out) == []
    nothing_left(out, pids, within_s=5)
