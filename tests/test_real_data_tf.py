"""Real data in the TensorFlow family: every TF runner on the prepared dataset at 2 virtual
CPU devices through the CLI, the Keras loader, the tf.data pipeline's output against
the numpy/Pillow reference, and the tf_data pipeline mode."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bench.plan.runs import RunSpec
from bench.records.store import check_record, load_records
from contract.spec import spec_for
from runners.tf.cnn_benchmarks import ENV_VAR, build_flags
from tests.helpers.cli import REPO, run_child
from tests.helpers.sweeps import by_runner, real_sweep

RUNNERS = ["tf_mirrored", "tf_native", "keras_tf_kuza55", "keras_tf_multi_gpu_model",
           "keras_tf_avolkov1", "tensorpack"]
IMAGES, CLASSES = 48, 10  # the real_dataset fixture
# the Keras runners read the data on small_cnn (the input path is what is tested; it has a Keras
# builder); tf_native and tensorpack build MiniGoogLeNet in TF1 (small_cnn has no tfv1 builder)
KERAS = ("tf_mirrored", "keras_tf_kuza55", "keras_tf_multi_gpu_model", "keras_tf_avolkov1")


def check_real(rec: dict, n: int, batch: int = 8, workers: int = 1,
               pipeline: str = "tf.data over 2 TFRecord shard(s)") -> dict:
    """The checks every real-data record of this family passes; its runner result."""
    log = Path(rec["log_path"]).read_text()[-3000:] if rec.get("log_path") else ""
    assert rec["status"] == "ok", f"{rec.get('reason')}\n{log}"
    assert check_record(rec) == []
    assert rec["data"] == "real" and rec["virtual_devices"] is True
    assert rec["images_per_sec"] > 0
    res = rec["result"]
    assert rec["samples"] == 3 * batch * n
    assert res["input_pipeline"].startswith(pipeline), res["input_pipeline"]
    assert res["loader_workers"] == workers
    assert (res["dataset_images"], res["dataset_classes"]) == (IMAGES, CLASSES)
    assert res["augmentation"] == "crop-flip" and res["image_size"] == 32
    labels = res["labels_first_batch"]  # what the model was fed: the dataset's labels
    assert len(labels) == batch * n and set(labels) <= set(range(CLASSES))
    assert len(set(labels)) > 1, labels  # shuffled across the class-ordered files
    return res


@pytest.fixture(scope="module")
def real_tf_sweep(tmp_path_factory: pytest.TempPathFactory, real_dataset: Path,
                  tf_python: str) -> dict[str, dict[int, dict]]:
    """Every runner of RUNNERS on the real dataset at 2 devices, one sweep per model (KERAS on
    small_cnn, the TF1 ones on MiniGoogLeNet); records by runner and devices."""
    records: dict[str, dict[int, dict]] = {}
    for model in ("small_cnn", "minigooglenet"):
        runners = [r for r in RUNNERS if (r in KERAS) == (model == "small_cnn")]
        out = tmp_path_factory.mktemp("real-tf") / model
        real_sweep(out, real_dataset, f"runners=[{','.join(runners)}]", "devices=[2]",
                   f"models=[{model}]")
        records.update(by_runner(load_records(out)))
    return records


@pytest.mark.parametrize("runner", RUNNERS)
@pytest.mark.slow
@pytest.mark.framework("tf")
def test_runner_on_real_data(runner: str, real_tf_sweep: dict) -> None:
    """At 2 devices, where the real batch is split over the replicas (each runner's 1-device
    path is the same input pipeline, and runs in test_tf_runners and test_equivalence)."""
    model = "small_cnn" if runner in KERAS else "minigooglenet"
    records = real_tf_sweep[runner]
    assert sorted(records) == [2]
    for n, rec in records.items():
        res = check_real(rec, n)
        if runner == "tensorpack":
            assert res["input"] == "StagingInput(TFDatasetInput)"
            assert "get_next per tower" in res["input_pipeline"]
        else:
            assert f"batch {8 * n} (whole)" in res["input_pipeline"]
        assert rec["model"] == model
        if runner in KERAS:
            assert res["loader"] == "framework"


@pytest.mark.slow
@pytest.mark.framework("tf")
def test_keras_loader(tmp_path: Path, real_dataset: Path, tf_python: str) -> None:
    """`loader: keras` feeds fit with the Keras 3 PyDataset over the JPEG files."""
    records = real_sweep(tmp_path / "keras", real_dataset, "runners=[tf_mirrored]",
                         "devices=[2]", "models=[small_cnn]",
                         "runner_options.tf_mirrored.loader=keras")
    assert sorted(records) == [2]
    res = check_real(records[2], 2, pipeline="Keras PyDataset over the JPEG file list")
    assert res["loader"] == "keras" and records[2]["options"]["loader"] == "keras"
    assert "1 worker process" in res["input_pipeline"]


@pytest.mark.slow
@pytest.mark.framework("tf")
@pytest.mark.skipif(not os.environ.get(ENV_VAR),
                    reason=f"set {ENV_VAR} to a checkout of tensorflow/benchmarks to run the "
                           "real script on real data")
def test_tf_cnn_benchmarks_on_real_data(tmp_path: Path, real_dataset: Path,
                                        tf_python: str) -> None:
    records = real_sweep(tmp_path / "tcb", real_dataset, "runners=[tf_cnn_benchmarks]",
                         "models=[resnet50]", "warmup_steps=1", "measure_steps=2",
                         "batch_size_per_device=2")
    assert sorted(records) == [1, 2]
    for n, rec in records.items():
        assert rec["status"] == "ok", f"{rec['reason']}\n{Path(rec['log_path']).read_text()}"
        res = rec["result"]
        assert rec["samples"] == 2 * 2 * n and rec["images_per_sec"] > 0
        assert res["script_dataset"] == "imagenet"  # not "imagenet (synthetic)"
        assert f"--data_dir={real_dataset / 'tfrecord'}" in res["flags"]
        assert res["input_pipeline"].startswith("tf_cnn_benchmarks' own input")
        assert res["dataset_images"] == IMAGES and res["loader_workers"] == 1


def test_tf_cnn_benchmarks_real_flags(real_dataset: Path) -> None:
    """Real data maps onto the script's --data_dir (the TFRecord folder), --data_name and
    --datasets_num_private_threads (the dataset's workers)."""
    spec = {"model": "resnet50", "num_devices": 2, "batch_size_per_device": 4,
            "global_batch_size": 8, "device": "cpu", "measure_steps": 3, "warmup_steps": 1,
            "data": "real", "runner": "tf_cnn_benchmarks",
            "dataset": {"path": str(real_dataset), "augmentation": "none", "workers": 3}}
    flags = build_flags(RunSpec(**spec_for(**spec).to_dict()))  # options resolved
    assert f"--data_dir={real_dataset / 'tfrecord'}" in flags
    assert "--data_name=imagenet" in flags and "--datasets_num_private_threads=3" in flags
    assert sorted(p.name for p in (real_dataset / "tfrecord").glob("train-*-of-*")) == [
        "train-00000-of-00002", "train-00001-of-00002"]  # the script's file pattern


@pytest.mark.slow
@pytest.mark.framework("tf")
def test_tf_data_matches_the_reference(real_dataset: Path, tf_python: str) -> None:
    """augmentation none: tf.data's batches equal real_data.load_batch's for the same files
    (files.csv order when unshuffled) within JPEG decoder noise; crop-flip differs from it."""
    out = run_child(tf_python, "tests/children/tf_data_parity.py", str(real_dataset))
    for size in ("32", "64"):
        assert out[size]["labels_equal"], out
        assert out[size]["mean_abs"] < 0.02, out  # measured ~0.001 (decode_and_crop edges)
    flip = out["flip"]
    assert flip["shape"] == [8, 32, 32, 3] and flip["dtype"] == "float32"
    assert -1.0 <= flip["min"] < 0 < flip["max"] <= 1.0
    assert flip["diff_from_none"] > 0.05, flip  # random windows and flips, not the centre
    assert flip["labels"] == [0, 0, 0, 0, 0, 1, 1, 1]  # files.csv order (5 per class first)
    assert out["nchw"] == {"shape": [8, 3, 32, 32], "equal": True}


@pytest.mark.slow
@pytest.mark.framework("tf")
def test_pipeline_mode(tmp_path: Path, real_dataset: Path, tf_python: str) -> None:
    """runners.tf.pipeline on a spec: the tf.data pipeline timed on its own, no model."""
    spec = {"mode": "pipeline", "runner": "tf_data", "model": "minigooglenet",
            "global_batch_size": 8, "warmup_steps": 1, "measure_steps": 3,
            "dataset": {"path": str(real_dataset), "augmentation": "crop-flip", "workers": 2},
            "device": "cpu", "num_devices": 1, "run_id": "tf_data_test", "sweep_id": "test"}
    spec_path, result_path = tmp_path / "spec.json", tmp_path / "result.json"
    spec_path.write_text(json.dumps(spec_for(**spec).to_dict()))
    proc = subprocess.run([tf_python, "-m", "runners.tf.pipeline", "--spec", str(spec_path),
                           "--result", str(result_path)], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    res = json.loads(result_path.read_text())
    assert res["status"] == "ok", res
    assert res["images_per_sec"] > 0 and res["samples"] == 3 * 8 and res["timed_steps"] == 3
    assert res["loader_workers"] == 2 and res["dataset_images"] == IMAGES
    assert res["pipeline"].startswith("tf.data over 2 TFRecord shard(s)")
    assert "2 parallel map call(s)" in res["pipeline"] and "batch 8" in res["pipeline"]
    assert "tensorflow" in res["framework"]
