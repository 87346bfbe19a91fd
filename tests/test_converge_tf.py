"""Mode converge (runners/converge.py) in the TF runners, for real on CPU: one sweep of
configs/converge-digits.yaml (small_cnn on digits, its recipe, target 90%) through the CLI
with tf_mirrored (Keras 3 fit per epoch) and tf_native (its own loop) at 1 and 2 virtual CPU
devices, and tests on its records. Nothing here compares times or depends on bit-exact
arithmetic (oneDNN on or off): accuracies have the recipe's 10 epochs of margin."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.records.store import check_record
from bench.run.verdict import validate_converge
from runners.converge import Recipe
from tests.helpers.sweeps import assert_stopped_at_target, converge_sweep

pytestmark = [pytest.mark.slow, pytest.mark.framework("tf")]
TARGET = 0.9
RUNNERS = ("tf_mirrored", "tf_native")


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory, tf_python: str,
            digits_dataset: Path) -> dict[tuple[str, int], dict]:
    """{(runner, devices): record} of the one sweep every test reads."""
    out = tmp_path_factory.mktemp("converge") / "tf"
    recs = converge_sweep(out, digits_dataset, f"runners=[{','.join(RUNNERS)}]",
                          "devices=[1,2]", f"converge.target_accuracy={TARGET}")
    by_run = {(r["runner"], r["num_devices"]): r for r in recs}
    assert sorted(by_run) == [(r, n) for r in RUNNERS for n in (1, 2)], sorted(by_run)
    return by_run


def _ok(rec: dict) -> dict:
    assert rec["status"] == "ok", rec.get("reason")
    return rec


@pytest.mark.parametrize("n", [1, 2])
def test_mirrored_reaches_90_percent_and_records_time_to_target(records: dict, n: int
                                                                ) -> None:
    rec = _ok(records[("tf_mirrored", n)])
    assert check_record(rec) == [] and validate_converge(rec) == []
    assert_stopped_at_target(rec, TARGET)


def test_native_reaches_sensible_accuracy_at_2_devices(records: dict) -> None:
    rec = _ok(records[("tf_native", 2)])
    assert check_record(rec) == [] and validate_converge(rec) == []
    assert rec["final_accuracy"] >= TARGET and rec["epochs_to_target"] is not None, rec["curve"]
    losses = [p["train_loss"] for p in rec["curve"]]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < math.log(10), losses


def test_every_run_starts_from_the_recipe_seeds_weights(records: dict) -> None:
    """Seeded from recipe.seed: 1 and 2 devices, Keras fit and the native loop, one start."""
    digests = {key: rec["result"]["initial_weights_sha256"] for key, rec in records.items()}
    assert len(set(digests.values())) == 1, digests


def test_optimizer_runs_at_the_recipes_rate(records: dict) -> None:
    """The rate read back from the optimizer after each epoch is the recipe's for the epoch's
    last step (poly, scaled linearly to the global batch): the optimizer starts at 0, so only
    the rate the callback (Keras fit) or the loop (native) set before the steps can be there."""
    for (runner, n), rec in records.items():
        recipe = Recipe.of(_Spec(rec))
        want = [recipe.lr(p["epoch"] - 1, p["steps"] - 1, p["steps"]) for p in rec["curve"]]
        got = rec["result"]["lr_read_back"]
        assert got == pytest.approx(want, rel=1e-6), (runner, n, got, want)
        assert recipe.peak_lr == pytest.approx(0.01 * n) and min(got) > 0


class _Spec:
    """What Recipe.of reads of a spec, from a record."""

    def __init__(self, rec: dict) -> None:
        self.converge = {k: v for k, v in rec["converge"].items()}
        self.global_batch_size = rec["global_batch_size"]


def test_replicas_train_on_their_own_devices(records: dict) -> None:
    """Placement read from TF's partition graphs: every replica's device ran the step."""
    for (runner, n), rec in records.items():
        assert rec["placement_check"]["devices"] == [f"cpu:{i}" for i in range(n)], runner
        assert len(rec["placement"]) == n and min(rec["placement"].values()) > 3
        assert rec["result"]["replicas"] == n


def test_moving_statistics_read_from_every_device_copy(records: dict) -> None:
    """small_cnn's 2 BatchNorm layers x (mean, variance), one copy per replica, all finite
    after every epoch."""
    for (runner, n), rec in records.items():
        assert rec["result"]["moving_stat_copies"] == 2 * 2 * n, runner
        assert rec["moving_stats_finite"] is True
        assert all(p["moving_stats_finite"] is True for p in rec["curve"]), runner


def test_native_loop_and_keras_fit_train_alike(records: dict) -> None:
    """Same weights, batches, rates and SGD: the first epoch's mean train loss of the native
    loop is Keras fit's within 10% (they differ by BatchNorm's kernel, the loss's averaging
    and float order, not by the recipe)."""
    for n in (1, 2):
        fit = records[("tf_mirrored", n)]["curve"][0]["train_loss"]
        loop = records[("tf_native", n)]["curve"][0]["train_loss"]
        assert loop == pytest.approx(fit, rel=0.1), (n, fit, loop)
