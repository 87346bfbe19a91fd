"""Mode converge in the torch family (torch_ddp, keras_torch) on digits, for real, through the CLI:
issue 28's done-when (torch_ddp reaches 90% held-out accuracy at 1 and 2 gloo ranks and records
the time to it; keras_torch at 2 ranks gets there too) and seed 002's second trap (8x the batch
without LR scaling ends lower after the same epochs than with linear scaling and warm-up),
asserted on the records' accuracies, never on time. Five runs in four sweeps (a recipe is a
sweep's), each run once per module."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.records.store import check_record
from bench.run.verdict import validate_converge
from tests.helpers.sweeps import converge_sweep

pytestmark = [pytest.mark.slow, pytest.mark.framework("torch")]

TARGET = 0.9
TRAIN_IMAGES = 1437  # digits' training split (make-dataset --source digits)
TRAP_EPOCHS = 4
TRAP_BATCH = 256  # 8x the recipe's reference batch of 32


def by_key(records: list[dict]) -> dict[tuple[str, int], dict]:
    return {(r["runner"], r["num_devices"]): r for r in records}


@pytest.fixture(scope="module")
def to_target(tmp_path_factory: pytest.TempPathFactory, digits_dataset: Path,
              torch_python: str) -> dict[tuple[str, int], dict]:
    """configs/converge-digits.yaml's recipe (linear scaling from 32 images, poly, batch 32
    per device) to 90%: torch_ddp at 1 and 2 ranks, keras_torch at 2 (its own sweep, so no
    run at 1 rank is paid for)."""
    out = tmp_path_factory.mktemp("converge-torch")
    records = []
    for runner, devices in (("torch_ddp", "[1,2]"), ("keras_torch", "[2]")):
        records += converge_sweep(out / runner, digits_dataset, f"runners=[{runner}]",
                                  f"devices={devices}", f"converge.target_accuracy={TARGET}")
    by_run = by_key(records)
    assert sorted(by_run) == [("keras_torch", 2), ("torch_ddp", 1), ("torch_ddp", 2)], \
        sorted(by_run)
    return by_run


def trap_sweep(tmp_path_factory: pytest.TempPathFactory, dataset: Path, name: str,
               scaling: str, warmup: int) -> dict:
    """torch_ddp at 1 rank with batch 256 (base_lr 0.01 for 32 images) for TRAP_EPOCHS
    epochs, no target: the one record."""
    out = tmp_path_factory.mktemp("converge-torch") / name
    records = converge_sweep(out, dataset, "runners=[torch_ddp]", "devices=[1]",
                             f"batch_size_per_device={TRAP_BATCH}",
                             "converge.target_accuracy=null",
                             f"converge.max_epochs={TRAP_EPOCHS}",
                             f"converge.lr_scaling={scaling}",
                             f"converge.warmup_epochs={warmup}")
    assert len(records) == 1, records
    return records[0]


@pytest.fixture(scope="module")
def unscaled(tmp_path_factory: pytest.TempPathFactory, digits_dataset: Path,
             torch_python: str) -> dict:
    return trap_sweep(tmp_path_factory, digits_dataset, "unscaled", "none", 0)


@pytest.fixture(scope="module")
def scaled(tmp_path_factory: pytest.TempPathFactory, digits_dataset: Path,
           torch_python: str) -> dict:
    return trap_sweep(tmp_path_factory, digits_dataset, "scaled", "linear", 1)


def test_every_run_is_an_ok_converge_record(to_target: dict, unscaled: dict,
                                            scaled: dict) -> None:
    assert sorted(to_target) == [("keras_torch", 2), ("torch_ddp", 1), ("torch_ddp", 2)]
    for rec in [*to_target.values(), unscaled, scaled]:
        assert rec["status"] == "ok", (rec["run_id"], rec.get("reason"))
        assert rec["mode"] == "converge"
        assert check_record(rec) == [], rec["run_id"]
        assert validate_converge(rec) == [], rec["run_id"]


@pytest.mark.parametrize("devices", [1, 2])
def test_torch_ddp_reaches_90_percent_and_records_the_time(to_target: dict,
                                                           devices: int) -> None:
    rec = to_target[("torch_ddp", devices)]
    assert rec["status"] == "ok", rec.get("reason")
    assert rec["best_accuracy"] >= TARGET, rec["curve"]
    epoch = rec["epochs_to_target"]
    assert epoch == rec["epochs_run"] == len(rec["curve"])  # it stops at the target
    point = rec["curve"][epoch - 1]
    assert point["accuracy"] >= TARGET > max([p["accuracy"] for p in rec["curve"][:-1]],
                                             default=0.0)
    assert rec["time_to_target_s"] == point["wall_s"] > 0
    assert rec["target_reason"] is None


def test_keras_torch_at_two_ranks_reaches_90_percent_in_two_epochs(to_target: dict) -> None:
    rec = to_target[("keras_torch", 2)]
    assert rec["status"] == "ok", rec.get("reason")
    assert rec["epochs_to_target"] is not None and rec["epochs_to_target"] <= 2, rec["curve"]
    assert rec["final_accuracy"] >= TARGET
    assert rec["time_to_target_s"] > 0


def test_placement_counts_each_ranks_training_rows(to_target: dict) -> None:
    """Each rank's rows are its share of every global batch of every epoch (last_batch drop:
    the whole batches only), read from the tensors the ranks stepped on."""
    for (runner, n), rec in to_target.items():
        batch = 32 * n
        rows = rec["epochs_run"] * (TRAIN_IMAGES // batch) * batch
        assert rec["samples"] == rows, (runner, n)
        assert rec["placement"] == {f"rank{r}:cpu": rows // n for r in range(n)}, (runner, n)
        assert rec["result"]["steps_per_rank"] == [rows // batch] * n, (runner, n)


def test_moving_statistics_are_read_and_finite(to_target: dict) -> None:
    """BatchNorm's moving means and variances, read from the model on every rank after every
    epoch (small_cnn has two BatchNorm layers: four tensors)."""
    for key, rec in to_target.items():
        assert rec["moving_stats_finite"] is True, key
        assert all(p["moving_stats_finite"] is True for p in rec["curve"]), key


def test_eight_times_the_batch_without_lr_scaling_ends_lower(unscaled: dict,
                                                             scaled: dict) -> None:
    """Seed 002's trap: batch 256 at the learning rate meant for 32 (lr_scaling none) trains
    8x fewer, equally small steps; linear scaling with a one-epoch warm-up takes the larger
    steps and ends far higher after the same epochs."""
    for rec in (unscaled, scaled):
        assert rec["status"] == "ok", rec.get("reason")
        assert rec["epochs_run"] == TRAP_EPOCHS and rec["epochs_to_target"] is None
        assert rec["global_batch_size"] == TRAP_BATCH
    assert unscaled["converge"]["lr_scaling"] == "none"
    assert scaled["converge"]["lr_scaling"] == "linear"
    assert scaled["converge"]["warmup_epochs"] == 1
    assert scaled["final_accuracy"] >= 0.8, scaled["curve"]
    assert unscaled["final_accuracy"] < scaled["final_accuracy"] - 0.2, (
        [p["accuracy"] for p in unscaled["curve"]], [p["accuracy"] for p in scaled["curve"]])
