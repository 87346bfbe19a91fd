"""Real data in the JAX family, for real on CPU: jax_native and keras_jax fed by the Grain
pipeline (runners/jax/data.py) at 1 and 2 virtual devices, keras_jax fed by the Keras PyDataset
(loader: keras), the Grain output against the numpy/Pillow reference (runners.real_data), and
the `grain` and `keras_pydataset` pipeline modes run directly from a spec."""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

import pytest

from bench.catalog.registry import PIPELINES
from bench.records.store import check_record
from contract.reasons import sentence
from contract.spec import spec_for
from tests.helpers.cli import REPO, run_child
from tests.helpers.sweeps import real_sweep

pytestmark = [pytest.mark.slow, pytest.mark.framework("jax")]

WARMUP = 2  # real_sweep's warm-up steps: the first timed batch is batch 2 of the stream
# the runs check the input path, not the model: small_cnn (32 x 32 crops as MiniGoogLeNet's)
# compiles in a third of MiniGoogLeNet's time
MODEL = "small_cnn"


def real_run(out: Path, dataset: Path, *sets: str) -> dict[int, dict]:
    """real_sweep of small_cnn at 2 devices with `sets`; its records by device count."""
    return real_sweep(out, dataset, f"models=[{MODEL}]", "devices=[2]", *sets)


def dataset_labels(dataset: Path) -> list[int]:
    """The labels of files.csv, in its order (the runners' file indices)."""
    with (dataset / "files.csv").open(newline="") as fh:
        return [int(row[1]) for row in csv.reader(fh) if row]


def check_real(rec: dict, n: int) -> dict:
    """The checks of an ok real-data record at n virtual devices; its runner's result."""
    assert check_record(rec) == [] and rec["model"] == MODEL
    log = Path(rec["log_path"]).read_text()[-3000:]
    assert rec["status"] == "ok", f"{rec['reason']}\n{log}"
    assert rec["data"] == "real" and rec["virtual_devices"] is True
    assert rec["samples"] == 3 * 8 * n
    assert rec["images_per_sec"] > 0
    result = rec["result"]
    assert result["replicas"] == n
    assert result["dataset_images"] == 48 and result["dataset_classes"] == 10
    assert result["loader_workers"] == 1 and result["augmentation"] == "crop-flip"
    assert result["image_size"] == 32
    assert result["framework"]["jax"] == "0.10.2"
    assert result["shardings"]["per_device_batch"] == 8
    return result


@pytest.fixture(scope="module")
def grain_order(real_dataset: Path, jax_python: str) -> dict[str, list[int]]:
    """The file indices of Grain's first timed global batch of 16, by batch size (one child for
    both runners' tests)."""
    return run_child(jax_python, "tests/children/grain_batch_order.py",
                     str(len(dataset_labels(real_dataset))), str(WARMUP), "16")


@pytest.mark.parametrize("runner", ["jax_native", "keras_jax"])
def test_runner_reads_real_data_at_two_devices(runner: str, tmp_path: Path,
                                               real_dataset: Path, grain_order: dict) -> None:
    """At 2 devices, where Grain's global batch is laid out over the mesh (the 1-device path
    is the same pipeline; the runners' 1-device runs are in test_jax_runners)."""
    records = real_run(tmp_path / runner, real_dataset, f"runners=[{runner}]")
    assert sorted(records) == [2]
    labels, order = dataset_labels(real_dataset), grain_order
    for n, rec in records.items():
        result = check_real(rec, n)
        assert result["framework"]["grain"] == "0.2.18"
        line = result["input_pipeline"]
        assert line.startswith("Grain over the JPEG file list") and "1 worker process" in line
        assert sorted(rec["placement"].values()) == [8] * n, rec["placement"]
        # the labels the first timed step trained on are the dataset's, in Grain's order
        assert result["first_timed_labels"] == [labels[i] for i in order[str(8 * n)]]
        if runner == "keras_jax":
            assert result["loader"] == "framework" and result["input"] == "numpy"
            assert result["shardings"]["mesh"] == {"batch": n}
            # Grain's host batches go to fit, which lays them out on the devices itself
            assert line.endswith("numpy batches to Keras fit, which lays each out over the "
                                 "devices itself")
        else:
            assert f"mesh={{data: {n}}}" in line and "one batch ahead" in line


def test_keras_jax_preplaced_grain_batches(tmp_path: Path, real_dataset: Path,
                                           jax_python: str) -> None:
    rec = real_run(tmp_path, real_dataset, "runners=[keras_jax]",
                   "runner_options.keras_jax.input=preplaced")[2]
    result = check_real(rec, 2)
    assert result["input"] == "preplaced"
    assert "one batch ahead" in result["input_pipeline"]
    assert "no-op" in sentence(result["data_placement"])
    assert sorted(rec["placement"].values()) == [8, 8]


def test_keras_jax_keras_loader(tmp_path: Path, real_dataset: Path, jax_python: str) -> None:
    records = real_run(tmp_path, real_dataset, "runners=[keras_jax]",
                       "runner_options.keras_jax.loader=keras")
    rec = records[2]
    result = check_real(rec, 2)
    assert rec["options"]["loader"] == "keras"
    assert result["loader"] == "keras"
    assert "grain" not in result["framework"]
    assert result["input_pipeline"].startswith("Keras PyDataset over the JPEG file list")
    assert "1 worker process" in result["input_pipeline"]
    assert "PyDataset" in sentence(result["data_placement"])
    assert sorted(rec["placement"].values()) == [8, 8]


def test_grain_matches_the_reference_preprocessing(real_dataset: Path, jax_python: str) -> None:
    r = run_child(jax_python, "tests/children/grain_parity.py", str(real_dataset),
                  env={"XLA_FLAGS": ""}, timeout=300)
    # augmentation none: Grain's workers decode exactly what load_batch gives for its files
    assert all(d < 0.02 for d in r["mean_abs_diff"]), r["mean_abs_diff"]
    assert r["labels_equal"] == [True, True, True]
    assert r["none_shape"] == r["flip_shape"] == [8, 32, 32, 3]
    assert r["none_dtype"] == r["flip_dtype"] == "float32"
    # crop-flip: same files and labels, random crops and flips inside [-1, 1]
    assert -1.0 <= r["flip_min"] < 0 < r["flip_max"] <= 1.0
    assert r["flip_vs_none"] > 0.01
    assert r["flip_labels_equal"] is True
    # a global batch of 16 lands on 2 devices as 8 + 8 rows, labels too
    assert r["device_rows"] == [8, 8] and r["device_label_rows"] == [8, 8]
    assert "mesh={data: 2}" in r["device_line"]


@pytest.mark.parametrize("pipeline", ["grain", "keras_pydataset"])
def test_pipeline_mode(pipeline: str, tmp_path: Path, real_dataset: Path,
                       jax_python: str) -> None:
    spec = {"mode": "pipeline", "runner": pipeline, "model": "minigooglenet",
            "global_batch_size": 8, "warmup_steps": 1, "measure_steps": 3, "data": "real",
            "dataset": {"path": str(real_dataset), "augmentation": "crop-flip", "workers": 2},
            "device": "cpu", "num_devices": 1, "run_id": f"{pipeline}-test",
            "sweep_id": "test"}
    spec_path, result_path = tmp_path / "spec.json", tmp_path / "result.json"
    spec_path.write_text(json.dumps(spec_for(**spec).to_dict()))
    proc = subprocess.run(
        [jax_python, "-m", PIPELINES[pipeline].module, "--spec", str(spec_path),
         "--result", str(result_path)], cwd=REPO, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), "XLA_FLAGS": ""})
    result = json.loads(result_path.read_text())
    assert result["status"] == "ok", result.get("reason", "") + proc.stdout + proc.stderr[-3000:]
    assert proc.returncode == 0
    assert result["images_per_sec"] > 0 and result["timed_steps"] == 3
    assert result["loader_workers"] == 2 and result["dataset_images"] == 48
    assert result["augmentation"] == "crop-flip" and result["image_size"] == 32
    assert result["framework"]["jax"] == "0.10.2"
    if pipeline == "grain":
        assert result["pipeline"].startswith("Grain over the JPEG file list")
        assert result["framework"]["grain"] == "0.2.18"
    else:
        assert result["pipeline"].startswith("Keras PyDataset over the JPEG file list")
        assert result["framework"]["keras"] == "3.15.1"
    assert "2 worker process" in result["pipeline"]

