"""tf_mirrored for real on CPU: the smoke sweep end to end (records, summary, charts, resume,
notebook), a real timeout, and the data-parallel equivalence test."""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import pytest

from bench.loader import load_results
from bench.records import check_record, load_records
from bench.report import CHARTS
from tests.conftest import REPO, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.framework("tf")]
SMOKE = ("--config", "configs/cpu-smoke.yaml", "--set", "warmup_steps=2",
         "--set", "measure_steps=4", "--set", "batch_size_per_device=8")


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory, tf_python: str) -> Path:
    """The smoke sweep, run once through the CLI as a user runs it (fewer steps)."""
    out = tmp_path_factory.mktemp("sweep") / "cpu-smoke"
    proc = run_cli(*SMOKE, "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"results: {out}" in proc.stdout
    return out


def test_smoke_sweep_records(smoke: Path) -> None:
    records = {r["num_devices"]: r for r in load_records(smoke)}
    assert sorted(records) == [1, 2]
    for n, rec in records.items():
        assert rec["status"] == "ok", rec["reason"]
        assert check_record(rec) == []
        assert rec["virtual_devices"] is True
        assert rec["samples"] == 4 * 8 * n
        assert rec["result"]["replicas"] == n
        assert len(rec["environment"]["devices"]) == n
        assert rec["environment"]["framework"]["tensorflow"].startswith("2.")
        assert rec["environment"]["cpu_cores"] >= 1
        assert rec["result"]["params"] == 1_656_250
        assert Path(rec["log_path"]).exists()


def test_smoke_summary_and_charts(smoke: Path) -> None:
    rows = list(csv.DictReader((smoke / "summary.csv").open()))
    assert [r["num_devices"] for r in rows] == ["1", "2"]
    assert float(rows[0]["scaling_efficiency"]) == 1.0
    two = rows[1]
    assert float(two["speedup"]) == pytest.approx(
        float(two["images_per_sec"]) / float(rows[0]["images_per_sec"]), rel=1e-3)
    assert float(two["scaling_efficiency"]) == pytest.approx(float(two["speedup"]) / 2, rel=1e-3)
    for chart in CHARTS:
        assert (smoke / "charts" / chart).stat().st_size > 5000
    assert (smoke / "config.yaml").exists() and (smoke / "environment.json").exists()


def test_report_rerenders(smoke: Path) -> None:
    for chart in CHARTS:
        (smoke / "charts" / chart).unlink()
    proc = run_cli("report", str(smoke), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert all((smoke / "charts" / c).exists() for c in CHARTS)


def test_loader_gives_tidy_frame(smoke: Path) -> None:
    df = load_results(smoke)
    assert len(df) == 2 and set(df["status"]) == {"ok"}
    assert df.loc[df["num_devices"] == 1, "scaling_efficiency"].item() == 1.0
    assert "version_tensorflow" in df.columns and "env_cpu_model" in df.columns


def test_resume_skips_done_runs(smoke: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(smoke, copy)
    before = {p.name: p.stat().st_mtime_ns for p in (copy / "runs").glob("*.json")}
    (copy / "runs" / next(n for n in before if "__n2__" in n and n.count(".") == 1)).unlink()
    proc = run_cli(*SMOKE, "--out", str(copy), "--resume")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 runs, 1 already done" in proc.stdout
    after = {p.name: p.stat().st_mtime_ns for p in (copy / "runs").glob("*.json")}
    one = next(n for n in before if "__n1__" in n and n.count(".") == 1)
    assert after[one] == before[one]  # the finished run was not run again
    assert len(load_records(copy)) == 2


def test_notebook_executes_against_the_sweep(smoke: Path) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(REPO / "notebooks" / "explore_results.ipynb", as_version=4)
    os.environ["MGBENCH_RESULTS"] = str(smoke)
    try:
        nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                                resources={"metadata": {"path": str(REPO / "notebooks")}}
                                ).execute()
    finally:
        del os.environ["MGBENCH_RESULTS"]
    text = json.dumps(nb)
    assert "tf_mirrored" in text and "image/png" in text


def test_timeout_is_recorded_and_sweep_finishes(tmp_path: Path, tf_python: str) -> None:
    out = tmp_path / "t"
    proc = run_cli(*SMOKE, "--set", "timeout_s=1", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    records = load_records(out)
    assert len(records) == 2
    assert {r["status"] for r in records} == {"timeout"}
    assert (out / "summary.csv").exists()
