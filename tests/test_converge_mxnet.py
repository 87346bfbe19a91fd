"""mxnet_native in mode converge: small_cnn on scikit-learn's digits at 1 and 2 MXNet CPU
contexts with configs/converge-digits.yaml's recipe (target 90%), through the CLI, one sweep
shared by every test (runners/converge.py, runners/mxnet/native.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.records.store import check_record
from bench.run.verdict import validate_converge
from contract.reasons import sentence
from models import get_spec
from tests.helpers.sweeps import converge_sweep

pytestmark = [pytest.mark.slow, pytest.mark.framework("mxnet")]
TARGET = 0.9
TRAIN_ROWS = 1437  # digits' training split (make-dataset --source digits)


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory, digits_dataset: Path,
            mxnet_python: str) -> dict[int, dict]:
    out = tmp_path_factory.mktemp("converge-mxnet")
    recs = converge_sweep(out, digits_dataset, "runners=[mxnet_native]",
                          f"converge.target_accuracy={TARGET}")
    by_n = {r["num_devices"]: r for r in recs}
    assert sorted(by_n) == [1, 2], sorted(by_n)
    return by_n


def _ok(rec: dict) -> dict:
    log = Path(rec["log_path"]).read_text()[-3000:] if rec.get("log_path") else ""
    assert rec["status"] == "ok", f"{rec.get('reason')}\n{log}"
    return rec


def test_reaches_target_at_one_and_two_contexts(records: dict[int, dict]) -> None:
    assert sorted(records) == [1, 2]
    for n, rec in records.items():
        _ok(rec)
        assert check_record(rec) == []
        assert rec["best_accuracy"] >= TARGET, rec["curve"]
        assert rec["epochs_to_target"] == len(rec["curve"])  # stopped at the target
        assert rec["curve"][-1]["accuracy"] >= TARGET
        assert rec["time_to_target_s"] == rec["curve"][-1]["wall_s"] > 0
        assert rec["target_reason"] is None
        assert rec["result"]["replicas"] == n


def test_record_passes_the_parents_converge_check(records: dict[int, dict]) -> None:
    for rec in records.values():
        assert validate_converge(_ok(rec)["result"] | {
            k: rec[k] for k in ("curve", "final_accuracy", "best_accuracy", "epochs_to_target",
                                "time_to_target_s", "target_reason", "moving_stats_finite",
                                "images_per_sec", "converge")}) == []
        assert all(p["moving_stats_finite"] for p in rec["curve"])
        assert all(isinstance(p["train_loss"], float) for p in rec["curve"])  # finite
        assert sentence(rec["result"]["moving_stats_source"]).startswith("every context's copy")


def test_placement_is_each_contexts_rows_of_the_epoch(records: dict[int, dict]) -> None:
    """The last epoch's training rows (last_batch drop: whole global batches), split evenly
    over the contexts, read from the loss arrays MXNet computed on each context."""
    for n, rec in records.items():
        result = _ok(rec)["result"]
        batch = 32 * n
        per_context = TRAIN_ROWS // batch * batch // n
        assert rec["placement"] == {f"cpu({i})": per_context for i in range(n)}
        assert rec["placement_check"]["devices"] == [f"cpu:{i}" for i in range(n)]
        assert result["parameter_copies"] == {f"cpu({i})": 14 for i in range(n)}
        assert result["kvstore"] == ("device" if n == 2 else
                                     "none (kvstore 'device' skipped: one context)")


def test_optimizer_follows_the_recipe(records: dict[int, dict]) -> None:
    """The Trainer's own SGD: momentum, no weight decay, one update per step, and at each
    epoch's start the recipe's rate (linear scaling: 2 contexts, twice the rate)."""
    for n, rec in records.items():
        opt = _ok(rec)["result"]["optimizer"]
        assert (opt["name"], opt["momentum"], opt["wd"]) == ("sgd", 0.9, 0.0)
        assert opt["steps"] == sum(p["steps"] for p in rec["curve"])
        assert [p["steps"] for p in rec["curve"]] == [TRAIN_ROWS // (32 * n)] * len(rec["curve"])
        assert opt["epoch_start_lr"] == pytest.approx([p["lr"] for p in rec["curve"]])
        assert opt["epoch_start_lr"][0] == pytest.approx(0.01 * n)


def test_contexts_start_from_the_same_seeded_weights(records: dict[int, dict]) -> None:
    first = {n: _ok(rec)["result"]["initial_weights"] for n, rec in records.items()}
    assert all(w["contexts_identical"] for w in first.values())
    assert first[1]["sha256"] == first[2]["sha256"]


def test_model_is_the_specs_small_cnn(records: dict[int, dict]) -> None:
    spec = get_spec("small_cnn")
    for rec in records.values():
        result = _ok(rec)["result"]
        assert (result["params"], result["flops_per_sample"]) == (spec.params,
                                                                  spec.flops_per_sample)
        assert result["framework"]["mxnet"] == "1.9.1"
        assert result["layout"] == "channels_first"
