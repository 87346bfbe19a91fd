"""Real data in the MXNet family: mxnet_native and keras_mxnet trained from the prepared
dataset through the CLI at 1 and 2 contexts, the Keras-idiomatic loader, MXNet's
ImageRecordIter against the numpy/Pillow reference, and the `mxnet_record_iter` pipeline."""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from bench.records.store import check_record, load_records
from contract.reasons import sentence
from contract.spec import spec_for
from tests.helpers.cli import REPO, run_child
from tests.helpers.sweeps import by_runner, real_sweep

pytestmark = [pytest.mark.slow, pytest.mark.framework("mxnet")]


def dataset_labels(dataset: Path) -> Counter[int]:
    """How many images of each label the prepared dataset holds."""
    rows = (dataset / "files.csv").read_text().split()
    return Counter(int(row.rsplit(",", 1)[1]) for row in rows)


def assert_trained_on_dataset(rec: dict, dataset: Path, n: int) -> dict:
    """The record is an ok real-data run whose first batch holds the dataset's labels."""
    log = Path(rec["log_path"]).read_text()[-3000:]
    assert rec["status"] == "ok", f"{rec['reason']}\n{log}"
    assert check_record(rec) == []
    assert rec["data"] == "real" and rec["images_per_sec"] > 0
    assert rec["samples"] == 3 * 8 * n
    result = rec["result"]
    assert result["replicas"] == n
    assert result["dataset_images"] == 48 and result["dataset_classes"] == 10
    assert result["loader_workers"] == 1 and result["augmentation"] == "crop-flip"
    assert result["image_size"] == 32
    labels = result["first_batch_labels"]
    # one global batch drawn without replacement from the dataset: never more of a label than
    # the dataset holds (random or constant labels would break this)
    assert len(labels) == 8 * n
    assert not Counter(labels) - dataset_labels(dataset), labels
    return result


@pytest.fixture(scope="module")
def real_mxnet_sweep(tmp_path_factory: pytest.TempPathFactory, real_dataset: Path,
                     mxnet_python: str) -> dict[str, dict[int, dict]]:
    """Both runners on the real dataset at 1 and 2 contexts in one sweep; records by runner
    and devices."""
    out = tmp_path_factory.mktemp("real-mxnet")
    real_sweep(out, real_dataset, "runners=[mxnet_native,keras_mxnet]")
    return by_runner(load_records(out))


@pytest.mark.parametrize("runner", ["mxnet_native", "keras_mxnet"])
def test_real_data_at_one_and_two_devices(runner: str, real_mxnet_sweep: dict,
                                          real_dataset: Path) -> None:
    records = real_mxnet_sweep[runner]
    assert sorted(records) == [1, 2]
    for n, rec in records.items():
        result = assert_trained_on_dataset(rec, real_dataset, n)
        assert result["input_pipeline"].startswith("mx.io.ImageRecordIter over train.rec")
        assert "1 preprocess thread" in result["input_pipeline"]
    if runner == "mxnet_native":
        assert "split_and_load" in sentence(records[2]["result"]["data_placement"])
    else:
        assert records[2]["result"]["loader"] == "framework"


def test_keras_mxnet_keras_loader(tmp_path: Path, real_dataset: Path,
                                  mxnet_python: str) -> None:
    """loader: keras feeds fit_generator from the Keras Sequence over the JPEG files."""
    records = real_sweep(tmp_path, real_dataset, "runners=[keras_mxnet]", "devices=[2]",
                         "runner_options.keras_mxnet.loader=keras")
    result = assert_trained_on_dataset(records[2], real_dataset, 2)
    assert result["loader"] == "keras"
    assert result["input_pipeline"].startswith("Keras Sequence over the JPEG file list")
    assert "use_multiprocessing=True" in result["input_pipeline"]


def test_keras_mxnet_arrays_on_real_data_is_unavailable(tmp_path: Path, real_dataset: Path,
                                                         mxnet_python: str) -> None:
    records = real_sweep(tmp_path, real_dataset, "runners=[keras_mxnet]", "devices=[1]",
                         "runner_options.keras_mxnet.input=arrays")
    rec = records[1]
    assert rec["status"] == "unavailable" and "input=arrays" in rec["reason"]


def test_record_iter_matches_the_reference(tmp_path: Path, real_dataset: Path,
                                           mxnet_python: str) -> None:
    """ImageRecordIter (shuffle off, file order) against real_data.load_batch: the same images
    and labels for augmentation none, on the 40 x 40 dataset (crop only) and on one prepared
    at 24 x 24 (resized up to 32 first); crop-flip gives windows of the right images."""
    from bench.data.datasets import make_dataset
    from bench.data.prepare import prepare_data

    make_dataset(tmp_path / "src", classes=10, images=48, size=40, seed=0)
    small = tmp_path / "small"
    prepare_data(tmp_path / "src", small, resize=24, quality=90, shards=1, workers=1)
    got = run_child(mxnet_python, "tests/children/mxnet_record_iter_parity.py",
                    str(real_dataset), str(small))
    for name in ("kept", "upscaled"):
        case = got[name]
        assert case["shape"] == [48, 3, 32, 32] and case["dtype"] == "float32", case
        assert case["labels_equal"], case
        # OpenCV/libjpeg-turbo and Pillow decode (and resize) slightly differently
        assert case["mean_abs"] < 0.02, case
    assert got["kept"]["max_abs"] < 0.05, got["kept"]  # no resize: the same decoded pixels
    flip = got["crop_flip"]
    assert flip["shape"] == [48, 3, 32, 32] and flip["labels_equal"], flip
    assert -1.0 <= flip["min"] < flip["max"] <= 1.0, flip
    assert flip["differs_from_none"] > 0.01, flip
    assert flip["worst_window"] < 0.02, flip  # every output is a window of its own image
    assert flip["positions"] > 5 and 0 < flip["flipped"] < 48, flip
    assert not flip["slots_repeat"], flip  # seed_aug would repeat each slot's crop per batch


def test_pipeline_mode(tmp_path: Path, real_dataset: Path, mxnet_python: str) -> None:
    """runners.mxnet.pipeline on its own: the ImageRecordIter timed with no model."""
    spec = {"mode": "pipeline", "runner": "mxnet_record_iter", "run_id": "pipe-1",
            "sweep_id": "pipe", "model": "minigooglenet", "global_batch_size": 8,
            "warmup_steps": 1, "measure_steps": 3, "data": "real", "device": "cpu",
            "num_devices": 1, "dataset": {"path": str(real_dataset),
                                          "augmentation": "crop-flip", "workers": 2}}
    (tmp_path / "spec.json").write_text(json.dumps(spec_for(**spec).to_dict()))
    proc = subprocess.run(
        [mxnet_python, "-m", "runners.mxnet.pipeline", "--spec", str(tmp_path / "spec.json"),
         "--result", str(tmp_path / "result.json")], cwd=REPO, capture_output=True, text=True,
        timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["status"] == "ok", result
    assert result["images_per_sec"] > 0 and result["samples"] == 24
    assert result["timed_steps"] == 3 and result["loader_workers"] == 2
    assert result["dataset_images"] == 48 and result["image_size"] == 32
    assert result["pipeline"].startswith("mx.io.ImageRecordIter over train.rec")
    assert "2 preprocess thread" in result["pipeline"]
    assert result["framework"]["mxnet"] == "1.9.1"


def test_resize_only_when_an_image_is_smaller(tmp_path: Path, real_dataset: Path,
                                             mxnet_python: str) -> None:
    """resize=S only when a shorter side is below S (from the manifest, or the JPEG headers
    when prepare-data kept the sizes), and a dataset smaller than the batch is unavailable
    (ImageRecordIter would abort the process)."""
    from PIL import Image

    for w, h in ((30, 20), (50, 40), (48, 64)):  # shorter sides 20, 40, 48
        Image.new("RGB", (w, h), (w, h, 0)).save(tmp_path / f"{w}x{h}.jpg")
    got = run_child(mxnet_python, "tests/children/mxnet_resize_rule.py", str(tmp_path),
                    str(real_dataset))
    assert got["mixed_16"][0] == -1
    assert got["mixed_32"][0] == 32 and "scaled down too" in got["mixed_32"][1]
    assert got["mixed_64"][0] == 64 and "resized up to 64" in got["mixed_64"][1]
    assert got["manifest_24"][0] == 32 and "resized up to 32" in got["manifest_24"][1]
    assert "48 images is smaller than the batch of 64" in got["too_small"]
