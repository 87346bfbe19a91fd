"""Fault injection through real child processes (docs/RELIABILITY.md keeps the table): each
case asserts the record, the exit code, and that nothing of the run is left running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bench.records.store import load_records, runs_dir
from tests.helpers.cli import REPO, run_cli
from tests.helpers.toy import TOY, alive, config, nothing_left, run_until_second_run, toy


def statuses(out: Path) -> dict[int, str]:
    return {r["num_devices"]: r["status"] for r in load_records(out)}


@pytest.mark.parametrize("behaviour, status, words", [
    ("crash", "failed", "the toy runner crashed on purpose"),
    ("garbage", "failed", "unreadable result"),
    ("nan", "invalid", "last_loss is nan"),
    ("oom_real", "oom", "MemoryError"),
    ("import_error", "unavailable", "tensorflow_that_is_not_installed"),
])
def test_a_failing_run_is_a_record_and_leaves_nothing(tmp_path: Path, behaviour: str,
                                                      status: str, words: str) -> None:
    out, pids = tmp_path / "out", tmp_path / "worker.pid"
    cfg = config(tmp_path, behaviour, devices=[1], options={"worker_pid_file": str(pids)})
    proc = toy("--config", str(cfg), "--out", str(out))
    # a run that failed, ran out of memory or is invalid fails the sweep; unavailable does not
    assert proc.returncode == (0 if status == "unavailable" else 3), proc.stderr
    [rec] = load_records(out)
    assert rec["status"] == status and words in rec["reason"], rec["reason"]
    nothing_left(out, pids)


def test_a_worker_left_running_by_a_finished_run_is_killed(tmp_path: Path) -> None:
    out, pids = tmp_path / "out", tmp_path / "worker.pid"
    cfg = config(tmp_path, devices=[1], options={"worker_pid_file": str(pids)})
    assert toy("--config", str(cfg), "--out", str(out)).returncode == 0
    [rec] = load_records(out)
    assert rec["status"] == "ok" and "killed" in rec["left_running"]
    nothing_left(out, pids, within_s=2)


def test_a_hang_past_the_timeout_is_killed_with_its_children(tmp_path: Path) -> None:
    out, pids = tmp_path / "out", tmp_path / "hang.pid"
    cfg = config(tmp_path, "hang", devices=[1], timeout_s=3, options={"pid_file": str(pids)})
    proc = toy("--config", str(cfg), "--out", str(out))
    assert proc.returncode == 3, proc.stderr
    assert statuses(out) == {1: "timeout"}
    nothing_left(out, pids, within_s=2)


def test_a_missing_environment_is_unavailable_before_any_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = run_cli("--config", "configs/cpu-smoke.yaml", "--set", "runners=[torch_ddp]",
                   "--set", "devices=[1]", "--out", str(out),
                   env={"MGBENCH_ENV_DIR": "/dev/null/envs"})  # a folder that cannot exist
    assert proc.returncode == 0, proc.stderr
    [rec] = load_records(out)
    assert rec["status"] == "unavailable" and "torch environment" in rec["reason"]
    assert "/dev/null/envs" in rec["reason"]


def test_a_stale_result_of_another_attempt_is_never_read(tmp_path: Path) -> None:
    """A straggler (an orphan of a killed sweep) writes its result while this attempt runs;
    this attempt's child writes none: the record must say so, not take the straggler's."""
    out = tmp_path / "out"
    cfg = config(tmp_path, "quiet_exit", devices=[1], options={"busy_s": 1.0})
    fake = {"status": "ok", "images_per_sec": 1e9, "samples": 24, "timed_steps": 3,
            "step_times_s": [0.1] * 3, "window_s": 0.3, "first_loss": 1.0, "last_loss": 1.0,
            "placement": {"toy:shard0": 8}}

    def straggle() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            specs = list(runs_dir(out).glob("*.spec.json")) if out.exists() else []
            if specs:
                run_id = specs[0].name[: -len(".spec.json")]
                for name in (f"{run_id}.result.json", f"{run_id}.0badcafe.result.json"):
                    (runs_dir(out) / name).write_text(json.dumps(fake))
                return
            time.sleep(0.05)

    thread = threading.Thread(target=straggle)
    thread.start()
    proc = toy("--config", str(cfg), "--out", str(out))
    thread.join()
    assert proc.returncode == 3, proc.stderr
    [rec] = load_records(out)
    assert rec["status"] == "failed" and "without writing a result" in rec["reason"]


def resume_finishes(out: Path, cfg: Path) -> None:
    first = next(runs_dir(out).glob("*__n1__*r0.json")).stat().st_mtime_ns
    proc = toy("--config", str(cfg), "--out", str(out), "--resume")
    assert proc.returncode == 0, proc.stderr
    assert "2 runs, 1 already done" in proc.stdout
    assert statuses(out) == {1: "ok", 2: "ok"}
    assert next(runs_dir(out).glob("*__n1__*r0.json")).stat().st_mtime_ns == first


def test_kill_9_of_the_parent_kills_the_run_and_resume_finishes(tmp_path: Path) -> None:
    proc, out, pids, cfg = run_until_second_run(tmp_path)
    worker = int(pids.read_text())
    assert alive(worker)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    nothing_left(out, pids, within_s=5)
    assert not alive(worker)
    resume_finishes(out, cfg)


# SIGINT in the fast set; SIGTERM and SIGHUP go the same way (the fast set's budget)
@pytest.mark.parametrize("sig, code", [
    (signal.SIGINT, 130), pytest.param(signal.SIGTERM, 143, marks=pytest.mark.slow),
    pytest.param(signal.SIGHUP, 129, marks=pytest.mark.slow)])
def test_a_stop_signal_keeps_finished_records_and_resume_finishes(
        tmp_path: Path, sig: signal.Signals, code: int) -> None:
    proc, out, pids, cfg = run_until_second_run(tmp_path)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert f"interrupted ({sig.name})" in err and "--resume" in err
    assert statuses(out) == {1: "ok"}
    nothing_left(out, pids, within_s=5)
    resume_finishes(out, cfg)


@pytest.mark.slow  # a sweep, its kill and a resume: the fast set's budget
def test_two_sweeps_on_one_folder_the_second_is_refused(tmp_path: Path) -> None:
    proc, out, _, cfg = run_until_second_run(tmp_path)
    try:
        second = toy("--config", str(cfg), "--out", str(out), "--resume")
        assert second.returncode == 2
        [line] = second.stderr.strip().splitlines()
        assert f"pid {proc.pid}" in line and "another sweep" in line
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    # the holder gone, its lock is free again: a resume takes the folder over
    resume_finishes(out, cfg)


@pytest.mark.slow  # a sweep, its kill and a resume: the fast set's budget
def test_a_lock_left_by_a_killed_sweep_is_taken_over(tmp_path: Path) -> None:
    proc, out, pids, cfg = run_until_second_run(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert json.loads((out / ".sweep.lock").read_text())["pid"] == proc.pid  # left behind
    nothing_left(out, pids, within_s=5)
    resume_finishes(out, cfg)


def test_disk_full_while_a_record_is_written_leaves_no_half_record(tmp_path: Path) -> None:
    from tests.helpers.cli import run_child

    path = tmp_path / "runs" / "r.json"
    out = run_child(sys.executable, "tests/children/write_record_disk_full.py", str(path))
    assert out["outcome"].startswith("OSError")
    assert out["files"] == ["r.json"]  # no temporary file left beside it
    assert json.loads(path.read_text()) == {"run_id": "r", "status": "ok"}  # the old record


def test_a_cpu_hog_beside_the_run_is_named_and_flags_it_contended(tmp_path: Path) -> None:
    out = tmp_path / "out"
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        cfg = config(tmp_path, devices=[1], measure_steps=4, options={"busy_s": 0.5})
        proc = toy("--config", str(cfg), "--out", str(out))
    finally:
        hog.kill()
        hog.wait()
    assert proc.returncode == 0, proc.stderr
    [rec] = load_records(out)
    contention = rec["telemetry"]["contention"]
    assert rec["contended"] is True, contention
    assert contention["other_cpu_cores_mean"] > 0.5
    assert any(p["pid"] == hog.pid for p in contention["top_other_processes"])
    assert f"pid {hog.pid}" in contention["reason"]
    assert "CONTENDED" in proc.stdout


def test_disk_full_during_a_sweep_stops_it_with_one_line_and_resume_finishes(
        tmp_path: Path) -> None:
    """The CLI under a file-size limit (a full disk, as writes see it) just above its
    environment.json and config.yaml: every record write fails. One line, exit 1, no half
    record; then --resume with room finishes. Below config.yaml's size: one line too."""
    import resource

    first, out = tmp_path / "first", tmp_path / "out"
    cfg = config(tmp_path, devices=[1])
    assert toy("--config", str(cfg), "--out", str(first)).returncode == 0
    limit = max((first / name).stat().st_size for name in ("environment.json", "config.yaml"))
    limit += 256
    record = next(runs_dir(first).glob("*__n1__*r0.json")).stat().st_size
    assert record > limit  # so the record is what cannot be written

    def full_disk(size: int = limit) -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))

    early = subprocess.run([*TOY, "--config", str(cfg), "--out", str(tmp_path / "early")],
                           cwd=REPO, capture_output=True, text=True, timeout=180,
                           preexec_fn=lambda: full_disk(64))
    assert early.returncode == 1, early.stderr
    [line] = early.stderr.strip().splitlines()
    assert "cannot write" in line and "--resume" in line

    proc = subprocess.run([*TOY, "--config", str(cfg), "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=180, preexec_fn=full_disk)
    assert proc.returncode == 1, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "cannot write" in line and "--resume" in line
    assert load_records(out) == []
    assert not [p.name for p in runs_dir(out).iterdir() if p.name.endswith(".tmp")]
    nothing_left(out)
    resume = toy("--config", str(cfg), "--out", str(out), "--resume")
    assert resume.returncode == 0, resume.stderr
    assert statuses(out) == {1: "ok"}
