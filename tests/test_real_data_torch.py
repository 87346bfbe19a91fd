"""Real data in the PyTorch and Horovod families: torch_ddp, keras_torch (both loaders) and
horovod through the CLI at 2 ranks on small_cnn, the ranks' disjoint shares, the DataLoader's
output against the numpy/Pillow reference, and the torch_dataloader pipeline mode. The input
path is what is tested (small_cnn has a torch and a Keras builder); 2 ranks split the data
(DistributedSampler's share, the keras loader's files rank, rank + N), where 1 rank runs the
same loader over all of it, as each runner's 1-rank synthetic run in test_torch_runners.py and
test_horovod.py starts the same runner."""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

import pytest

from bench.records.store import check_record, load_records
from bench.run.envs import ensure_env
from contract.spec import spec_for
from tests.helpers.cli import REPO, run_child
from tests.helpers.sweeps import real_sweep

pytestmark = pytest.mark.slow
REAL = ("devices=[2]", "models=[small_cnn]")  # the sweeps' device count and model


def dataset_labels(dataset: Path) -> dict[str, int]:
    """files.csv as {relative path: label}."""
    with (dataset / "files.csv").open(newline="") as fh:
        return {row[0]: int(row[1]) for row in csv.reader(fh) if row}


def check_real_records(records: dict[int, dict], dataset: Path, loader: str,
                       pipeline_words: tuple[str, ...]) -> None:
    """What every real-data record of these runners must say, at 2 ranks (REAL)."""
    labels = dataset_labels(dataset)
    assert sorted(records) == [2]
    for n, rec in records.items():
        log = Path(rec["log_path"]).read_text()[-3000:]
        assert rec["status"] == "ok", f"{rec['reason']}\n{log}"
        assert check_record(rec) == []
        assert rec["samples"] == 3 * 8 * n and rec["images_per_sec"] > 0
        # each rank stepped on its 8 loaded images per step, on its own device
        assert rec["placement"] == {f"rank{i}:cpu": 3 * 8 for i in range(n)}
        result = rec["result"]
        assert result["loader"] == loader
        assert all(word in result["input_pipeline"] for word in pipeline_words), \
            result["input_pipeline"]
        assert result["loader_workers"] == 1 and result["dataset_images"] == 48
        assert result["dataset_classes"] == 10 and result["image_size"] == 32
        assert result["augmentation"] == "crop-flip"
        assert result["rank_images_per_epoch"] == 48 // n
        assert "every step" in result["data_placement"]
        first = result["first_batch"]  # rank 0's first batch, labels as the model got them
        assert len(first["files"]) == 8
        assert first["labels"] == [labels[f] for f in first["files"]]


@pytest.fixture(scope="module")
def torchrun_sweep(tmp_path_factory: pytest.TempPathFactory, real_dataset: Path,
                   torch_python: str) -> dict[str, dict]:
    """torch_ddp and keras_torch on the real dataset in one sweep; the records by runner."""
    out = tmp_path_factory.mktemp("real-torchrun")
    real_sweep(out, real_dataset, "runners=[torch_ddp,keras_torch]", *REAL)
    return {r["runner"]: r for r in load_records(out)}


@pytest.mark.framework("torch")
@pytest.mark.parametrize("runner", ["torch_ddp", "keras_torch"])
def test_torchrun_runners_on_real_data(runner: str, torchrun_sweep: dict,
                                       real_dataset: Path) -> None:
    records = {torchrun_sweep[runner]["num_devices"]: torchrun_sweep[runner]}
    check_real_records(records, real_dataset, "dataloader",
                       ("torch DataLoader", "DistributedSampler", "1 worker process"))


@pytest.mark.framework("torch")
def test_keras_torch_keras_loader(tmp_path: Path, real_dataset: Path,
                                  torch_python: str) -> None:
    """loader: keras feeds the torch loop from JpegSequence (a Keras 3 PyDataset); each rank
    reads files rank, rank + N, ..."""
    records = real_sweep(tmp_path, real_dataset, "runners=[keras_torch]", *REAL,
                         "runner_options.keras_torch.loader=keras")
    check_real_records(records, real_dataset, "keras", ("PyDataset", "1 worker process"))
    order = list(dataset_labels(real_dataset))
    two = records[2]["result"]
    assert two["loader_option"] == "keras"
    assert all(order.index(f) % 2 == 0 for f in two["first_batch"]["files"])  # rank 0's share


@pytest.fixture(scope="module")
def horovod_python() -> str:
    return str(ensure_env("horovod", "cpu").python)


@pytest.mark.framework("horovod")
def test_horovod_on_real_data(tmp_path: Path, real_dataset: Path, horovod_python: str) -> None:
    records = real_sweep(tmp_path, real_dataset, "runners=[horovod]", *REAL)
    check_real_records(records, real_dataset, "dataloader",
                       ("torch DataLoader", "DistributedSampler", "1 worker process"))


@pytest.mark.framework("torch")
def test_ranks_read_disjoint_shares(real_dataset: Path, torch_python: str) -> None:
    seen = run_child(torch_python, "tests/children/torch_loader_shares.py", str(real_dataset))
    for epoch in (0, 1):
        zero, one = set(seen["0"][epoch]), set(seen["1"][epoch])
        assert len(zero) == len(one) == 24 and not zero & one
        assert zero | one == set(range(48))
    assert seen["0"][0] != seen["0"][1]  # set_epoch reshuffles the shares


@pytest.mark.framework("torch")
def test_dataloader_matches_the_reference(real_dataset: Path, torch_python: str) -> None:
    """augmentation none equals real_data.load_batch (centre crop) on the same files;
    crop-flip keeps shape and range and differs; a rerun (other worker count) reads the same
    pixels."""
    out = run_child(torch_python, "tests/children/torch_loader_parity.py", str(real_dataset))
    none, flip = out["none"], out["crop-flip"]
    assert none["mad_vs_centre"] < 0.02 and none["labels_equal"]
    for r in (none, flip):
        assert r["shape"] == [8, 3, 32, 32] and r["dtype"] == "torch.float32"
        assert -1.0 <= r["min"] < r["max"] <= 1.0
        assert r["rerun_equal"]
    assert flip["mad_vs_centre"] > 0.02 and flip["labels_equal"]


@pytest.mark.framework("torch")
def test_pipeline_mode(tmp_path: Path, real_dataset: Path, torch_python: str) -> None:
    spec = {"mode": "pipeline", "runner": "torch_dataloader", "model": "minigooglenet",
            "global_batch_size": 8, "warmup_steps": 1, "measure_steps": 3, "data": "real",
            "dataset": {"path": str(real_dataset), "augmentation": "crop-flip", "workers": 2},
            "device": "cpu", "num_devices": 1, "options": {}, "run_id": "pipe-1",
            "sweep_id": "test"}
    spec_path, result_path = tmp_path / "spec.json", tmp_path / "result.json"
    spec_path.write_text(json.dumps(spec_for(**spec).to_dict()))
    proc = subprocess.run([torch_python, "-m", "runners.torch.pipeline", "--spec",
                           str(spec_path), "--result", str(result_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    result = json.loads(result_path.read_text())
    assert result["status"] == "ok", proc.stdout + proc.stderr
    assert result["images_per_sec"] > 0 and result["samples"] == 24
    assert result["loader"] == "dataloader" and "2 worker process" in result["pipeline"]
    assert result["loader_workers"] == 2 and result["dataset_images"] == 48
    assert len(result["step_times_s"]) == 3 and result["framework"]["torch"].startswith("2.13")
