"""Mode converge of the seeds' tower runners (keras_tf_multi_gpu_model, keras_tf_kuza55:
runners/tf/towers_run.py `converge`, Keras 2 fit on the tower model) on digits, for real on 2
virtual CPU devices through the CLI: seed 002's short-last-batch trap, and a short run to a
sensible held-out accuracy.

The trap: digits has 1,437 training images; a global batch of 718 (359 per device) gives 2
whole steps and a last batch of 1 row. Kept (last_batch: keep), multi_gpu_model's get_slice
gives replica 0 no rows (the last takes the remainder), kuza55's gives both towers none (the
remainder is lost); a tower's BatchNorm on an empty batch has NaN batch moments, which its
update writes into the shared moving statistics, unseen by the loss. The runner reads them
from the model after every epoch and the record is invalid with that reason. Dropped or padded,
every tower gets whole rows and the statistics stay finite.

The recipe is one per sweep, so three sweeps (keep, pad, drop), the two shorter ones run
beside the first. TF's oneDNN CPU Conv2D mishandles an empty batch (it returns the input's
channels, and BatchNorm then fails: the runner says so, invalid, instead); the sweeps run with
TF_ENABLE_ONEDNN_OPTS=0 so the empty tower behaves as on a GPU, which the records show
(threads.env)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.helpers.sweeps import converge_sweep

pytestmark = [pytest.mark.slow, pytest.mark.framework("tf")]

RUNNERS = ("keras_tf_multi_gpu_model", "keras_tf_kuza55")
TRAP = 359  # per device: x 2 = 718, and 1,437 = 2 x 718 + 1
SANITY = 32  # per device, as seed 004
# rows of the 1-row last batch per tower: get_slice's remainder to the last replica, kuza55's lost
EMPTY_TOWERS = {"keras_tf_multi_gpu_model": [0, 1], "keras_tf_kuza55": [0, 0]}
STEPS = {"drop": 2, "pad": 3, "keep": 3}
TRAIN_ROWS = {"drop": 2 * 718, "pad": 3 * 718}


def _sweep(out: Path, dataset: Path, last_batch: str, batches: str, *sets: str) -> list[dict]:
    return converge_sweep(out, dataset, f"runners=[{','.join(RUNNERS)}]", "devices=[2]",
                          f"batch_size_per_device={batches}", f"converge.last_batch={last_batch}",
                          *sets)


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory, digits_dataset: Path
            ) -> dict[tuple[str, str, int], dict]:
    """{(last_batch, runner, batch per device): record}. keep: the trap at 359 and the sanity
    run at 32 (up to 3 epochs, target 0.8; the trap stops at its first epoch, invalid); pad and
    drop: 1 epoch at 359, no target."""
    root = tmp_path_factory.mktemp("converge-towers")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TF_ENABLE_ONEDNN_OPTS", "0")  # the children inherit it (see the docstring)
        with ThreadPoolExecutor(2) as pool:
            keep = pool.submit(_sweep, root / "keep", digits_dataset, "keep",
                               f"[{SANITY},{TRAP}]", "converge.max_epochs=3",
                               "converge.target_accuracy=0.8")
            short = pool.submit(lambda: [
                rec for lb in ("pad", "drop")
                for rec in _sweep(root / lb, digits_dataset, lb, f"[{TRAP}]",
                                  "converge.max_epochs=1", "converge.target_accuracy=null")])
            recs = keep.result() + short.result()
    return {(r["converge"]["last_batch"], r["runner"], r["batch_size_per_device"]): r
            for r in recs}


def _log(rec: dict) -> str:
    path = rec.get("log_path")
    return Path(path).read_text()[-3000:] if path and Path(path).exists() else ""


@pytest.mark.parametrize("runner", RUNNERS)
def test_keep_short_last_batch_puts_nan_in_batchnorm_moving_stats(records: dict,
                                                                  runner: str) -> None:
    rec = records[("keep", runner, TRAP)]
    result = rec["result"]
    assert result["threads"]["env"].get("TF_ENABLE_ONEDNN_OPTS") == "0"
    assert result["short_batch_rows_per_tower"] == EMPTY_TOWERS[runner]
    assert rec["status"] == "invalid", (rec["reason"], _log(rec))
    assert "BatchNorm moving statistics are not finite after epoch 1" in rec["reason"]
    assert "moving_mean" in rec["reason"] or "moving_variance" in rec["reason"]
    # the curve is kept: the epoch ran all 3 steps, the short one included
    assert len(rec["curve"]) == 1 and rec["curve"][0]["steps"] == STEPS["keep"]
    assert rec["curve"][0]["moving_stats_finite"] is False
    assert rec["moving_stats_finite"] is False


@pytest.mark.parametrize("last_batch", ["drop", "pad"])
@pytest.mark.parametrize("runner", RUNNERS)
def test_drop_and_pad_keep_batchnorm_moving_stats_finite(records: dict, runner: str,
                                                         last_batch: str) -> None:
    rec = records[(last_batch, runner, TRAP)]
    assert rec["status"] == "ok", (rec["reason"], _log(rec))
    assert rec["moving_stats_finite"] is True
    assert [p["moving_stats_finite"] for p in rec["curve"]] == [True]
    assert rec["curve"][0]["steps"] == STEPS[last_batch]
    assert rec["samples"] == TRAIN_ROWS[last_batch]
    assert rec["result"]["short_batch_rows_per_tower"] is None
    assert rec["target_reason"].startswith("no target_accuracy set")


@pytest.mark.parametrize("runner", RUNNERS)
def test_towers_reach_held_out_accuracy_on_digits(records: dict, runner: str) -> None:
    rec = records[("keep", runner, SANITY)]
    assert rec["status"] == "ok", (rec["reason"], _log(rec))
    assert rec["best_accuracy"] >= 0.8
    assert rec["epochs_to_target"] is not None and rec["epochs_to_target"] <= 3
    assert rec["time_to_target_s"] == rec["curve"][rec["epochs_to_target"] - 1]["wall_s"] > 0
    # the towers trained on both devices: one tower's convolutions each (the parent's check)
    work = rec["placement_check"]["work"]["forward_convs_per_device"]
    assert rec["placement_check"]["devices"] == ["cpu:0", "cpu:1"]
    assert work["measured"] == work["expected"] == {"cpu:0": 2, "cpu:1": 2}
    assert rec["result"]["params"] == 60_746


def test_towers_start_alike_from_the_recipe_seed(records: dict) -> None:
    """Both runners build the template first from tf_keras' seeded initialisers, so their
    first epochs match but for the one row of the short batch kuza55 loses; unseeded, the
    first epoch's loss differs by tens of percent."""
    first = [records[("keep", r, SANITY)]["curve"][0] for r in RUNNERS]
    assert first[0]["train_loss"] == pytest.approx(first[1]["train_loss"], rel=0.02)
    assert abs(first[0]["accuracy"] - first[1]["accuracy"]) <= 3 / 360
