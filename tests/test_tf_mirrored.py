"""tf_mirrored for real on CPU: the smoke sweep end to end (records with the placement TF
reports, summary, charts, resume), a real timeout, steps_per_execution and the
all-reduce choices at 2 devices, XLA (one device only: Keras 3 compiles strategy.run whole), and
channels_first (unavailable on CPU)."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import pytest

from bench.analysis.loader import load_results
from bench.records.store import check_record, load_records
from bench.report.charts import CHARTS
from contract.reasons import sentence
from models import get_spec
from tests.helpers.cli import run_cli
from tests.helpers.sweeps import smoke_sweep

pytestmark = [pytest.mark.slow, pytest.mark.framework("tf")]
# every sweep here checks mechanics (records, summary, charts, resume, the step loop, the
# all-reduce, XLA, the layout): on small_cnn, whose graph TF builds in a quarter of
# MiniGoogLeNet's time (the runner is what is checked here, not the model)
MECHANICS = "models=[small_cnn]"
SMOKE = ("--config", "configs/cpu-smoke.yaml", "--set", "warmup_steps=2",
         "--set", "measure_steps=4", "--set", "batch_size_per_device=8", "--set", MECHANICS)
PARAMS = 60_746  # small_cnn's, BatchNorm's moving statistics included (models/small_cnn)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory, tf_python: str) -> Path:
    """The smoke sweep, run once through the CLI as a user runs it (fewer steps)."""
    out = tmp_path_factory.mktemp("sweep") / "cpu-smoke"
    proc = run_cli(*SMOKE, "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"results: {out}" in proc.stdout
    assert sorted(r["num_devices"] for r in load_records(out)) == [1, 2]
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
        assert rec["result"]["params"] == get_spec("small_cnn").params == PARAMS
        assert Path(rec["log_path"]).exists()
        check_placement(rec, n)


CPU = "/job:localhost/replica:0/task:0/device:CPU:"


def check_placement(rec: dict, n: int) -> None:
    """The record's placement is TF's: compute ops on each of the n replica devices."""
    placement = rec["placement"]
    assert set(placement) == {f"{CPU}{k}" for k in range(n)}, placement
    assert all(count > 3 for count in placement.values()), placement
    assert "partition graphs" in sentence(rec["result"]["placement_source"])


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


def test_timeout_is_recorded_and_sweep_finishes(tmp_path: Path, tf_python: str) -> None:
    out = tmp_path / "t"
    proc = run_cli(*SMOKE, "--set", "timeout_s=1", "--out", str(out))
    assert proc.returncode == 3, proc.stderr  # runs that time out fail the sweep
    records = load_records(out)
    assert len(records) == 2
    assert {r["status"] for r in records} == {"timeout"}
    assert (out / "summary.csv").exists()


def test_steps_per_execution_and_hierarchical_copy(tmp_path: Path, tf_python: str) -> None:
    """Two steps per tf.function call (a tf.while_loop of strategy.run) with the hierarchical-
    copy all-reduce: both replicas' devices run the compiled loop; every step is counted."""
    records = smoke_sweep(tmp_path / "out", MECHANICS,
                          "runner_options.tf_mirrored.steps_per_execution=2",
                          "warmup_steps=2", "measure_steps=4", "devices=[2]",
                          "runner_options.tf_mirrored.cross_device_ops=hierarchical_copy")
    assert sorted(records) == [2]
    for n, rec in records.items():
        assert rec["status"] == "ok", (rec["reason"], Path(rec["log_path"]).read_text()[-3000:])
        assert rec["samples"] == 4 * 8 * n
        assert rec["result"]["steps_per_execution"] == 2
        assert rec["result"]["cross_device_ops"] == "HierarchicalCopyAllReduce"
        check_placement(rec, n)
    # with MirroredStrategy's own all-reduce (CollectiveAllReduce) TF fails inside that loop
    records = smoke_sweep(tmp_path / "auto", MECHANICS, "devices=[2]", "warmup_steps=2",
                          "measure_steps=4",
                          "runner_options.tf_mirrored.steps_per_execution=2")
    assert records[2]["status"] == "unavailable", (records[2]["status"], records[2]["reason"])
    assert "CollectiveAllReduce" in records[2]["reason"], records[2]["reason"]


def test_xla_runs_on_one_device_and_says_why_not_on_two(tmp_path: Path, tf_python: str) -> None:
    """Keras 3 jit-compiles its step function with strategy.run inside it, one XLA cluster on
    the first device; XLA cannot reach the second replica's variables, so 2 devices are
    unavailable with TF's reason, never an ok record with the work on one device."""
    records = smoke_sweep(tmp_path / "out", MECHANICS, "runner_options.tf_mirrored.xla=true")
    one, two = records[1], records[2]
    assert one["status"] == "ok", (one["reason"], Path(one["log_path"]).read_text()[-3000:])
    assert one["result"]["xla"] is True
    check_placement(one, 1)
    assert two["status"] == "unavailable", (two["status"], two["reason"])
    assert "XLA cluster" in two["reason"] and "located in device" in two["reason"], two["reason"]


def test_channels_first_is_unavailable_on_cpu(tmp_path: Path, tf_python: str) -> None:
    records = smoke_sweep(tmp_path / "out", MECHANICS, "devices=[1]",
                          "runner_options.tf_mirrored.data_format=channels_first")
    assert records[1]["status"] == "unavailable"
    assert "NHWC" in records[1]["reason"]


def test_memory_and_model_state_in_the_records(smoke: Path) -> None:
    """Memory measured in the timed window (runners/memory.py): one process holds the N
    virtual CPU devices, so its peak resident memory is given once; the model state from the
    Keras model and optimizer."""
    for rec in load_records(smoke):
        n = rec["num_devices"]
        key = "process0:cpu" + (f" ({n} virtual devices)" if n > 1 else "")
        mem = rec["memory_per_device"]
        assert list(mem) == [key] and 10 * 2**20 < mem[key] < 20 * 2**30, mem
        assert "VmHWM" in sentence(rec["memory_source"])
        state = rec["model_state"]
        assert state["params_bytes"] == 4 * PARAMS  # float32 weights, BN statistics too
        assert state["grads_bytes"] > 0 and state["optimizer_bytes"] > 0


def test_state_per_device_shows_full_replicas_and_the_policy_is_read_back(smoke: Path
                                                                           ) -> None:
    """MirroredStrategy (the baseline of issue 27's sharded strategies): every replica device
    holds a whole copy of the parameters, gradients and optimizer state, read from the
    distributed variables' per-device components; the parent's check agrees; the precision
    policy comes from the Keras model."""
    for rec in load_records(smoke):
        n = rec["num_devices"]
        state, whole = rec["state_bytes_per_device"], rec["state_bytes_global"]
        assert len(state) == n and all(d.endswith(f"CPU:{i}") for i, d in
                                       enumerate(sorted(state))), state
        assert whole["params"] == 4 * PARAMS
        assert all(v == whole for v in state.values()), (state, whole)
        assert rec["state_check"]["sharded"] == []
        assert rec["state_check"]["parts"]["optimizer"]["expected"] == "replica"
        policy = rec["precision_policy"]
        assert policy["follows"] is True and policy["params"] == "float32"
        assert policy["how"].startswith("keras dtype policy 'float32'")
