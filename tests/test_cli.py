"""The CLI end to end with the toy runner: failures become records, the sweep goes on,
--resume skips finished runs, Ctrl-C keeps what is done."""

from __future__ import annotations

import csv
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bench.records.store import check_record, load_records
from bench.report.charts import CHARTS
from tests.helpers.cli import REPO, run_cli


def toy_config(tmp_path: Path, behaviour: str, **extra: object) -> Path:
    cfg = {"name": "toy", "runners": ["toy"], "models": ["probe"], "devices": [1, 2],
           "batch_size_per_device": 8, "warmup_steps": 1, "measure_steps": 3,
           "timeout_s": 60,
           "runner_options": {"toy": {"python": sys.executable, "behaviour": behaviour}}}
    cfg.update(extra)
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def toy_cli(*args: str, timeout: float = 120, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tests.children.cli_with_toy", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def ok_sweep(tmp_path_factory: pytest.TempPathFactory
             ) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One toy sweep that goes well (1 and 2 devices), shared by the tests that read it."""
    tmp_path = tmp_path_factory.mktemp("ok_sweep")
    out = tmp_path / "out"
    return out, toy_cli("--config", str(toy_config(tmp_path, "ok")), "--out", str(out))


def test_ok_sweep_writes_records_summary_and_charts(
        ok_sweep: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    out, proc = ok_sweep
    assert proc.returncode == 0, proc.stderr
    assert "[1/2] toy probe n=1" in proc.stdout and "[2/2] toy probe n=2" in proc.stdout
    assert f"results: {out}" in proc.stdout
    assert {r["status"] for r in load_records(out)} == {"ok"}
    assert len((out / "summary.csv").read_text().splitlines()) == 3
    assert {p.name for p in (out / "charts").glob("*.png")} == set(CHARTS)
    assert yaml.safe_load((out / "config.yaml").read_text())["runners"] == ["toy"]


def test_crashes_become_records_and_sweep_finishes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = toy_cli("--config", str(toy_config(tmp_path, "crash")), "--out", str(out))
    assert proc.returncode == 3, proc.stderr  # failed runs fail the sweep (docs/CI.md)
    records = load_records(out)
    assert [r["status"] for r in records] == ["failed", "failed"]
    assert "Not ok:" in proc.stdout and "crashed on purpose" in proc.stdout


def test_timeout_is_recorded_and_sweep_finishes(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = toy_cli("--config", str(toy_config(tmp_path, "hang_above_1", timeout_s=3)),
                   "--out", str(out))
    assert proc.returncode == 3, proc.stderr  # a timed-out run fails the sweep
    status = {r["num_devices"]: r["status"] for r in load_records(out)}
    assert status == {1: "ok", 2: "timeout"}
    # the last line says what to do next, and that command works (issue 42, item 5)
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("next: 1 run(s) timed out; run them again with more time: "
                           "python run_bench.py --config "), last
    assert last.endswith("--resume --retry-failed --set timeout_s=6"), last
    again = toy_cli(*shlex.split(last.split("python run_bench.py ", 1)[1]),
                    env={"MGBENCH_TOY_BEHAVIOUR": "ok"})
    assert again.returncode == 0, again.stdout + again.stderr
    assert {r["num_devices"]: r["status"] for r in load_records(out)} == {1: "ok", 2: "ok"}


def test_resume_skips_finished_runs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    config = str(toy_config(tmp_path, "ok", devices=[1]))
    assert toy_cli("--config", config, "--out", str(out)).returncode == 0
    before = (out / "runs").glob("*__n1__*r0.json").__next__().stat().st_mtime_ns
    proc = toy_cli("--config", config, "--out", str(out), "--resume", "--set", "devices=[1,2]")
    assert proc.returncode == 0, proc.stderr
    assert "2 runs, 1 already done" in proc.stdout
    after = (out / "runs").glob("*__n1__*r0.json").__next__().stat().st_mtime_ns
    assert after == before and len(load_records(out)) == 2


def test_retry_failed_reruns_failures(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cfg = str(toy_config(tmp_path, "crash", devices=[1]))
    assert toy_cli("--config", cfg, "--out", str(out)).returncode == 3
    assert {r["status"] for r in load_records(out)} == {"failed"}
    # the same settings (a resume refuses others), the cause of the failure gone
    proc = toy_cli("--config", cfg, "--out", str(out), "--resume",
                   "--retry-failed", env={"MGBENCH_TOY_BEHAVIOUR": "ok"})
    assert "0 already done" in proc.stdout and proc.returncode == 0, proc.stderr
    assert {r["status"] for r in load_records(out)} == {"ok"}


def test_ctrl_c_keeps_finished_records(tmp_path: Path) -> None:
    out = tmp_path / "out"
    pid_file = tmp_path / "grandchild.pid"
    cfg = toy_config(tmp_path, "hang_above_1", timeout_s=600)
    raw = yaml.safe_load(cfg.read_text())
    raw["runner_options"]["toy"]["pid_file"] = str(pid_file)
    cfg.write_text(yaml.safe_dump(raw))
    proc = subprocess.Popen([sys.executable, "-m", "tests.children.cli_with_toy", "--config",
                             str(cfg), "--out", str(out)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            # a test run started as a background job inherits SIGINT ignored;
                            # the CLI must see Ctrl-C as a user's terminal delivers it
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert pid_file.exists(), "the second run never started"
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stdout + stderr
    assert "--resume" in stderr and "Traceback" not in stderr
    records = load_records(out)
    assert [(r["num_devices"], r["status"]) for r in records] == [(1, "ok")]
    grandchild = int(pid_file.read_text())
    time.sleep(0.2)
    state = ""
    if Path(f"/proc/{grandchild}/stat").exists():
        state = Path(f"/proc/{grandchild}/stat").read_text().rsplit(")", 1)[1].split()[0]
    assert state in ("", "Z", "X"), "the interrupted run's processes live on"


def test_gpu_runs_without_gpus_are_unavailable(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = toy_cli("--config", str(toy_config(tmp_path, "ok", device="gpu")), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    if os.path.exists("/dev/nvidia0"):
        return  # a GPU machine: this check is about machines without one
    reasons = {r["reason"] for r in load_records(out)}
    assert reasons == {"needs 1 GPUs; NVML sees 0", "needs 2 GPUs; NVML sees 0"}


@pytest.fixture(scope="module")
def listing() -> subprocess.CompletedProcess[str]:
    """`run_bench.py list`, once for the tests that read it."""
    return run_cli("list", timeout=60)


def test_list_shows_runners_models_and_families(
        listing: subprocess.CompletedProcess[str]) -> None:
    proc = listing
    assert proc.returncode == 0, proc.stderr
    for word in ("tf_mirrored", "family=tf", "minigooglenet", "resnet50", "params=1,656,250"):
        assert word in proc.stdout


def test_setup_unknown_family_is_exit_2() -> None:
    proc = run_cli("setup", "cntk", timeout=60)
    assert proc.returncode == 2 and "family 'cntk'" in proc.stderr and "allowed: tf" in proc.stderr


def test_report_on_a_folder_without_runs_is_exit_2(tmp_path: Path) -> None:
    proc = run_cli("report", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and "has no runs/ folder" in proc.stderr
    # a path that is not there is said as compare says it (issue 42, item 8)
    proc = run_cli("report", str(tmp_path / "no" / "such"), timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip() == (
        f"error: report: {str(tmp_path / 'no' / 'such')!r} does not exist; allowed: a results "
        "folder written by a sweep"), proc.stderr


def test_compare_help_says_95_percent_once() -> None:
    """Issue 42, item 7: the description is printed as written (no %-formatting): 95%."""
    proc = run_cli("compare", "--help", timeout=60)
    assert "95% bootstrap" in proc.stdout and "%%" not in proc.stdout, proc.stdout


def test_keras_cntk_is_listed_and_recorded_unavailable(
        tmp_path: Path, listing: subprocess.CompletedProcess[str]) -> None:
    """A runner that can never run here: `list` says why, a sweep naming it gets records."""
    assert listing.returncode == 0, listing.stderr
    line = next(ln for ln in listing.stdout.splitlines() if ln.strip().startswith("keras_cntk"))
    assert "unavailable" in line and "CNTK 2.7 ships wheels only for Python 2.7, 3.5 and 3.6" \
        in listing.stdout
    proc = run_cli("--config", "configs/cpu-smoke.yaml", "--set", "runners=[keras_cntk]",
                   "--out", str(tmp_path), timeout=120)
    assert proc.returncode == 0, proc.stderr
    records = load_records(tmp_path)
    assert [r["num_devices"] for r in sorted(records, key=lambda r: r["num_devices"])] == [1, 2]
    for rec in records:
        assert rec["status"] == "unavailable" and "Python 3.6" in rec["reason"]


def test_pipeline_mode_times_the_naive_loop_and_reports_it(tmp_path: Path,
                                                           real_dataset: Path) -> None:
    """A pipeline-only sweep through the CLI: the PIL baseline runs in the harness's own
    interpreter (no framework environment), once, whatever the worker counts."""
    cfg = tmp_path / "p.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": "pipes", "mode": "pipeline", "pipelines": ["pil_loop"],
        "models": ["minigooglenet"], "batch_size_per_device": 8, "warmup_steps": 1,
        "pipeline_steps": 40, "dataset": {"path": str(real_dataset), "workers": [1, 2]}}))
    out = tmp_path / "out"
    proc = run_cli("run", "--config", str(cfg), "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (rec,) = load_records(out)
    assert check_record(rec) == []
    assert rec["status"] == "ok" and rec["mode"] == "pipeline" and rec["runner"] == "pil_loop"
    assert rec["samples"] == 320 and rec["images_per_sec"] > 0
    assert rec["dataset"]["workers"] == 0 and rec["result"]["image_size"] == 32
    assert rec["result"]["dataset_images"] == 48
    # images per CPU second of the process tree, read from /proc in 10 ms clock ticks: a
    # window under one tick reads 0 CPU seconds and falls back to images/sec per worker
    result = rec["result"]
    assert result["cpu_seconds"] is not None and result["cores"] >= 1
    if result["cpu_seconds"] > 0:
        assert result["per_core_basis"].startswith("CPU seconds")
        assert result["images_per_sec_per_core"] == pytest.approx(320 / result["cpu_seconds"])
    else:
        assert result["images_per_sec_per_core"] == pytest.approx(rec["images_per_sec"])
    assert "Input pipelines alone" in proc.stdout and "pil_loop" in proc.stdout
    rows = list(csv.DictReader((out / "pipelines.csv").open()))
    assert [(r["pipeline"], r["loader_workers"], r["vs_baseline"]) for r in rows] == [
        ("pil_loop", "0", "1.0")]
    assert (out / "charts" / "pipelines.png").stat().st_size > 0


@pytest.mark.parametrize(("target", "expected"), [(0.99, 2), (1e-9, 4)])
def test_until_stable_adds_repeats_until_the_cv_target_or_the_maximum(
        tmp_path: Path, target: float, expected: int) -> None:
    out = tmp_path / "out"
    # 20 ms of wall clock per step: a microsecond step preempted once under load made two
    # repeats differ past a cv of 99% (seen once in the full suite)
    cfg = toy_config(tmp_path, "ok", devices=[1], repeats=2,
                     until_stable={"target_cv": target, "max_repeats": 4},
                     runner_options={"toy": {"python": sys.executable, "behaviour": "ok",
                                             "busy_s": 0.02}})
    proc = toy_cli("--config", str(cfg), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    recs = load_records(out)
    assert sorted(r["repeat"] for r in recs) == list(range(expected))
    assert proc.stdout.count("[until_stable: cv") == expected - 2
    with open(out / "summary.csv") as fh:
        row = next(csv.DictReader(fh))
    assert row["runs_total"] == str(expected)


def test_sweep_clock_estimates_what_is_left_from_launched_runs() -> None:
    from bench.run.progress import SweepClock
    from bench.run.progress import clock_text as _clock

    clock = SweepClock([True, False, True, True])  # the second is recorded without a launch
    assert clock.tick(10.0).endswith("~0:20 left]")  # 2 launched runs left at 10 s each
    assert clock.tick(0.0).endswith("~0:20 left]")  # a blocked run changes no estimate
    assert clock.tick(20.0).endswith("~0:15 left]")  # mean of 10 and 20
    last = clock.tick(30.0)
    assert last.startswith("[4/4 done, ") and "left" not in last
    assert _clock(3725) == "1:02:05" and _clock(65) == "1:05"


def test_progress_lines_say_how_much_is_done(
        ok_sweep: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    proc = ok_sweep[1]
    assert proc.returncode == 0, proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[")]
    assert "[1/2 done, " in lines[0] and "left]" in lines[0]
    assert "[2/2 done, " in lines[1] and "left" not in lines[1]


def test_list_says_what_a_runner_needs_before_it_runs(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]
                                                      ) -> None:
    """Issue 42, item 11: tf_cnn_benchmarks was listed "ready" where every dry run said it is
    unavailable without a checkout; list asks the runner's own pre-launch check."""
    from bench.cli import main

    monkeypatch.delenv("TF_CNN_BENCHMARKS_DIR", raising=False)
    assert main(["list"]) == 0
    out = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(out) if line.startswith("  tf_cnn_benchmarks "))
    assert "needs setup" in out[at], out[at]
    assert out[at + 1].startswith("      before it runs: no tensorflow/benchmarks checkout")
    plain = next(line for line in out if line.startswith("  torch_ddp "))
    assert "needs setup" not in plain
