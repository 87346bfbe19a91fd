"""A resume that refuses to mix (issue 29, class 2): the sweep's fingerprint (every setting that
changes a figure) is stored in the results folder; `--resume` with other settings exits 2
before anything is written, naming each change, unless `--new-fingerprint` takes the new ones
(the earlier results set aside in superseded/). Real sweeps of the toy runner through the CLI."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from bench.records.store import load_records, runs_dir
from tests.helpers.toy import config, toy


def first_sweep(tmp_path: Path, **extra: object) -> tuple[Path, Path]:
    """A one-run toy sweep into tmp_path/out: (its folder, its config file)."""
    out, cfg = tmp_path / "out", config(tmp_path, devices=[1], **extra)
    proc = toy("--config", str(cfg), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert (out / "fingerprint.json").exists()
    return out, cfg


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """first_sweep once for the module: (its folder, its config file); not to be changed."""
    return first_sweep(tmp_path_factory.mktemp("swept"))


def copy_of(swept: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """The module's first sweep copied into tmp_path/out: (the copy, the config file)."""
    out = tmp_path / "out"
    shutil.copytree(swept[0], out)
    return out, swept[1]


def snapshot(out: Path) -> dict[str, tuple[int, bytes]]:
    """Every file of the folder but the lock: (mtime, bytes)."""
    return {str(p.relative_to(out)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(out.rglob("*")) if p.is_file() and p.name != ".sweep.lock"}


def test_a_resume_with_other_settings_is_refused_before_anything_is_written(
        tmp_path: Path, swept: tuple[Path, Path]) -> None:
    out, cfg = copy_of(swept, tmp_path)
    before = snapshot(out)
    proc = toy("--config", str(cfg), "--out", str(out), "--resume", "--set", "measure_steps=5",
               "--set", "batch_size_per_device=16", "--set", "runner_options.toy.busy_s=0.01")
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert "measure_steps: 3 -> 5" in line
    assert "batch_size_per_device: [8] -> [16]" in line
    assert "runner_options.toy.busy_s: 0.0 -> 0.01" in line
    assert "--out NEW" in line and "--new-fingerprint" in line
    assert "Traceback" not in proc.stderr and "sweep toy" not in proc.stdout
    assert snapshot(out) == before  # config.yaml, fingerprint.json, records: untouched


@pytest.mark.slow  # a real sweep end to end: the fast set's budget
def test_a_resume_that_changes_only_labels_and_limits_runs_on(tmp_path: Path) -> None:
    out, cfg = first_sweep(tmp_path)
    proc = toy("--config", str(cfg), "--out", str(out), "--resume", "--set", "timeout_s=30",
               "--set", "description=relabelled", "--set", "telemetry.enabled=false",
               "--set", "devices=[2]")
    # the matrix may grow (test_cli's resume test), not lose or swap a value: refused
    assert proc.returncode == 2 and "devices: [1] -> [2]" in proc.stderr, proc.stderr
    proc = toy("--config", str(cfg), "--out", str(out), "--resume", "--set", "timeout_s=30",
               "--set", "description=relabelled", "--set", "telemetry.enabled=false")
    assert proc.returncode == 0, proc.stderr
    assert "1 runs, 1 already done" in proc.stdout


@pytest.mark.slow  # a real sweep end to end: the fast set's budget
def test_new_fingerprint_sets_the_earlier_results_aside(tmp_path: Path) -> None:
    out, cfg = first_sweep(tmp_path)
    [old] = load_records(out)
    proc = toy("--config", str(cfg), "--out", str(out), "--resume", "--new-fingerprint",
               "--set", "measure_steps=4")
    assert proc.returncode == 0, proc.stderr
    assert "--new-fingerprint: 1 setting(s) changed" in proc.stdout
    [new] = load_records(out)  # only the new settings' run is reported
    assert new["measure_steps"] == 4 and old["measure_steps"] == 3
    [aside] = (out / "superseded").iterdir()
    [kept] = load_records(aside)
    assert kept == old  # the earlier record, whole, beside
    stored = json.loads((out / "fingerprint.json").read_text())["settings"]
    assert stored["measure_steps"] == 4
    assert yaml.safe_load((out / "config.yaml").read_text())["measure_steps"] == 4
    rows = (out / "summary.csv").read_text().splitlines()
    assert len(rows) == 2  # the header and the new configuration's row, no mix
    # the same settings again: a plain resume, nothing set aside, nothing run
    again = toy("--config", str(cfg), "--out", str(out), "--resume", "--set", "measure_steps=4")
    assert again.returncode == 0 and "1 already done" in again.stdout, again.stderr


def test_new_fingerprint_without_resume_is_one_line(tmp_path: Path) -> None:
    cfg = config(tmp_path, devices=[1])
    proc = toy("--config", str(cfg), "--out", str(tmp_path / "out"), "--new-fingerprint")
    assert proc.returncode == 2
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("error: --new-fingerprint:") and "--resume" in line
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # a real sweep end to end: the fast set's budget
def test_a_folder_from_before_fingerprints_resumes_and_gets_one(tmp_path: Path) -> None:
    out, cfg = first_sweep(tmp_path)
    (out / "fingerprint.json").unlink()
    first = next(runs_dir(out).glob("*r0.json")).stat().st_mtime_ns
    proc = toy("--config", str(cfg), "--out", str(out), "--resume")
    assert proc.returncode == 0, proc.stderr
    assert "1 runs, 1 already done" in proc.stdout
    assert next(runs_dir(out).glob("*r0.json")).stat().st_mtime_ns == first
    assert json.loads((out / "fingerprint.json").read_text())["settings"]["measure_steps"] == 3
    # and from now on it refuses to mix
    proc = toy("--config", str(cfg), "--out", str(out), "--resume", "--set", "warmup_steps=2")
    assert proc.returncode == 2 and "warmup_steps: 1 -> 2" in proc.stderr


def test_a_damaged_fingerprint_is_a_difference_not_a_traceback(
        tmp_path: Path, swept: tuple[Path, Path]) -> None:
    out, cfg = copy_of(swept, tmp_path)
    for damage in (b"\xff\xfe not json", b'{"settings": [1, 2]}', b"[" * 100_000):
        (out / "fingerprint.json").write_bytes(damage)
        proc = toy("--config", str(cfg), "--out", str(out), "--resume")
        assert proc.returncode == 2, proc.stderr
        [line] = proc.stderr.strip().splitlines()
        assert "fingerprint.json" in line and "--new-fingerprint" in line, line


def test_the_fingerprint_leaves_out_only_what_changes_no_figure() -> None:
    """Every key of config.yaml is in the fingerprint but the documented few."""
    from bench.plan.config import validate
    from bench.run.sweep import NOT_FINGERPRINTED, fingerprint

    cfg = validate({"name": "toy", "runners": ["torch_ddp"], "models": ["probe"],
                    "devices": [1], "batch_size_per_device": 8})
    documented = {"name", "description", "timeout_s", "telemetry", "cluster", "repeats",
                  "until_stable"}
    assert documented == NOT_FINGERPRINTED
    assert set(fingerprint(cfg)) == set(cfg.to_dict()) - NOT_FINGERPRINTED
    for key in ("runners", "models", "devices", "nodes", "batch_size_per_device", "scaling",
                "data", "precision", "device", "warmup_steps", "measure_steps",
                "runner_options", "dataset", "mode", "converge", "capacity",
                "pipeline_steps", "probes"):
        assert key in fingerprint(cfg), key


@pytest.mark.slurm
def test_new_fingerprint_waits_for_the_earlier_sweeps_slurm_jobs(
        tmp_path: Path, local_slurm: dict[str, str], swept: tuple[Path, Path]) -> None:
    """--new-fingerprint on a folder whose book holds a job SLURM still runs: exit 2 naming
    the job, nothing moved; once the job has ended the new settings are taken. A real job on
    the local cluster stands for the earlier sweep's run."""
    out, cfg = copy_of(swept, tmp_path)
    job = subprocess.run(["sbatch", "--parsable", f"--output={tmp_path}/job-%j.out",
                          "--wrap", "sleep 120"], env=local_slurm, cwd=tmp_path,
                         capture_output=True, text=True, timeout=60, check=True
                         ).stdout.strip().split(";")[0]
    book = {"earlier__run": {"job_id": job, "collected": False}}
    (out / "slurm_jobs.json").write_text(json.dumps(book))
    before = snapshot(out)
    try:
        proc = toy("--config", str(cfg), "--out", str(out), "--resume", "--new-fingerprint",
                   "--set", "measure_steps=5", env=local_slurm)
        assert proc.returncode == 2, proc.stderr
        [line] = proc.stderr.strip().splitlines()
        assert line.startswith("error: --new-fingerprint: 1 SLURM job(s) of the earlier sweep")
        assert f"still queued or running: {job};" in line and "scancel" in line, line
        assert snapshot(out) == before and not (out / "superseded").exists()
    finally:
        subprocess.run(["scancel", job], env=local_slurm, capture_output=True, timeout=60)
    deadline = time.monotonic() + 60
    while job in subprocess.run(["squeue", "-h", "-o", "%i"], env=local_slurm,
                                capture_output=True, text=True, timeout=60).stdout.split():
        assert time.monotonic() < deadline, "scancel did not end the job"
        time.sleep(0.5)
    proc = toy("--config", str(cfg), "--out", str(out), "--resume", "--new-fingerprint",
               "--set", "measure_steps=5", env=local_slurm)
    assert proc.returncode == 0, proc.stderr
    assert (out / "superseded").is_dir()
