"""Mode converge (runners/converge.py) in the JAX runners, for real on CPU: one sweep of
configs/converge-digits.yaml (small_cnn on digits, its recipe, target 90%) through the CLI with
jax_native (its own loop, the learning rate in the optax state) and keras_jax (Keras 3 fit per
epoch, the learning rate set by a callback) at 2 virtual CPU devices, and tests on its records.
Nothing compares times; the accuracies have the recipe's 10 epochs of margin (both reach 90%
in 2 epochs here)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.records.store import check_record
from bench.run.verdict import validate_converge
from contract.spec import spec_for
from runners.converge import Recipe
from tests.helpers.sweeps import assert_stopped_at_target, converge_sweep

pytestmark = [pytest.mark.slow, pytest.mark.framework("jax")]
TARGET = 0.9
RUNNERS = ("jax_native", "keras_jax")
DEVICES = 2
TRAIN_ROWS = 1437  # digits' training split (make-dataset --source digits)


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory, jax_python: str,
            digits_dataset: Path) -> dict[str, dict]:
    """{runner: record} of the one sweep every test reads."""
    out = tmp_path_factory.mktemp("converge") / "jax"
    recs = converge_sweep(out, digits_dataset, f"runners=[{','.join(RUNNERS)}]",
                          f"devices=[{DEVICES}]", f"converge.target_accuracy={TARGET}")
    by_runner = {r["runner"]: r for r in recs}
    assert sorted(by_runner) == sorted(RUNNERS) and len(recs) == len(RUNNERS), sorted(by_runner)
    return by_runner


def _ok(rec: dict) -> dict:
    assert rec["status"] == "ok", rec.get("reason")
    assert rec["num_devices"] == DEVICES
    return rec


def _recipe(rec: dict) -> Recipe:
    """The run's recipe as the runner resolved it (its global batch)."""
    return Recipe.of(spec_for(converge=rec["converge"], global_batch_size=rec["global_batch_size"],
                              batch_size_per_device=rec["batch_size_per_device"],
                              num_devices=rec["num_devices"]))


@pytest.mark.parametrize("runner", RUNNERS)
def test_reaches_90_percent_and_records_time_to_target(records: dict, runner: str) -> None:
    rec = _ok(records[runner])
    assert check_record(rec) == [] and validate_converge(rec) == []
    assert_stopped_at_target(rec, TARGET)


@pytest.mark.parametrize("runner", RUNNERS)
def test_train_loss_falls_and_is_finite(records: dict, runner: str) -> None:
    """The epochs' train loss is the framework's, finite, and falls below chance (ln 10)."""
    losses = [p["train_loss"] for p in _ok(records[runner])["curve"]]
    assert all(isinstance(v, float) and math.isfinite(v) for v in losses), losses
    assert losses[-1] < losses[0] and losses[-1] < math.log(10), losses


@pytest.mark.parametrize("runner", RUNNERS)
def test_learning_rate_set_before_every_step(records: dict, runner: str) -> None:
    """The optimizer's rate after each epoch, read back from the framework, is the recipe's for
    the epoch's last step (poly, scaled linearly to the global batch of 2 x 32): the loop or the
    callback set it, not the compile-time base_lr."""
    rec = _ok(records[runner])
    recipe = _recipe(rec)
    assert recipe.peak_lr == pytest.approx(0.01 * DEVICES)
    want = [recipe.lr(p["epoch"] - 1, p["steps"] - 1, p["steps"]) for p in rec["curve"]]
    got = rec["result"]["lr_read_back"]
    assert got == pytest.approx(want, rel=1e-6), (got, want)
    assert all(abs(v - recipe.base_lr) > 1e-4 for v in got)


@pytest.mark.parametrize("runner", RUNNERS)
def test_placement_is_the_epochs_training_rows_split_evenly(records: dict, runner: str) -> None:
    """Each device got half of every global batch of the first epoch (read from the batches'
    jax.Arrays), adding up to the epoch's rows (the short last batch dropped)."""
    rec = _ok(records[runner])
    batch = rec["global_batch_size"]
    steps = TRAIN_ROWS // batch
    assert {p["steps"] for p in rec["curve"]} == {steps}
    placement = rec["result"]["placement"]
    assert sorted(rec["placement_check"]["devices"]) == ["cpu:0", "cpu:1"]
    assert sorted(placement.values()) == [steps * batch // DEVICES] * DEVICES, placement
    assert rec["samples"] == steps * batch * len(rec["curve"])


@pytest.mark.parametrize("runner", RUNNERS)
def test_moving_statistics_read_from_the_model(records: dict, runner: str) -> None:
    """After every epoch the runner read small_cnn's BatchNorm moving means and variances
    (2 layers x 2) from the framework's own variables, all finite."""
    rec = _ok(records[runner])
    assert all(p["moving_stats_finite"] is True for p in rec["curve"]), rec["curve"]
    assert rec["moving_stats_finite"] is True
    assert rec["result"]["moving_stats_read"].startswith("4 "), rec["result"]


@pytest.mark.parametrize("runner", RUNNERS)
def test_the_benchmarks_model_and_strategy(records: dict, runner: str) -> None:
    """The model is the spec's small_cnn (60,746 weights, BatchNorm statistics included), data
    parallel over both devices with per-device BatchNorm, the benchmark's defaults."""
    rec = _ok(records[runner])
    result = rec["result"]
    assert result["params"] == 60_746
    assert result["replicas"] == DEVICES and len(result["devices"]) == DEVICES
    assert result["batchnorm"] == "per_device"
    assert result["shardings"]["per_device_batch"] == rec["batch_size_per_device"] == 32
