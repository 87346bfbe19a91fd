"""Mode converge scored as MLPerf scores it, on crafted records and epoch lists (no framework):
the MLPerf mean of N-2 from 5 runs (an unreached run the slowest, two leave no score), the
median below 5; the exact one-sided Mann-Whitney U test of epochs to target and its flag;
unreached runs counted as max_epochs + 1; energy to target from the telemetry or said absent;
seeds distinct per repeat in the plan, and a shared seed flagged."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from bench.analysis.converge import converge_rows, time_to_target_words
from bench.analysis.converge_score import (
    MEDIAN,
    MLPERF_MEAN,
    MORE_EPOCHS,
    NO_SCORE,
    SEEDS_REPEAT,
    epochs_needed,
    score,
)
from bench.analysis.rank_test import one_sided_u_test, u_statistic
from bench.plan.config import load_config
from bench.plan.config.sections import Converge
from bench.plan.runs import another_repeat, expand
from bench.report.converge import table_lines
from tests.helpers.cli import REPO

# ---- the score ----


def test_five_runs_score_the_mean_of_the_middle_three() -> None:
    s = score([12.0, 10.0, 30.0, 11.0, 13.0])
    assert s.kind == MLPERF_MEAN and s.value == pytest.approx(12.0)
    assert sorted(s.kept) == [0, 3, 4]  # 10 and 30 dropped
    assert s.words() == "MLPerf mean of 3 of 5, fastest and slowest dropped"


def test_one_unreached_run_is_the_dropped_slowest_two_leave_no_score() -> None:
    one = score([12.0, 10.0, None, 11.0, 13.0])
    assert one.kind == MLPERF_MEAN and one.value == pytest.approx(12.0)  # 11, 12, 13
    two = score([12.0, None, None, 11.0, 13.0])
    assert two.kind == NO_SCORE and two.value is None
    assert "2 of 5 runs did not reach the target" in (two.why or "")


def test_ten_runs_drop_only_the_fastest_and_slowest() -> None:
    s = score([float(v) for v in range(1, 11)])
    assert s.value == pytest.approx(5.5) and len(s.kept) == 8


def test_fewer_than_five_runs_score_the_median_of_those_that_reached() -> None:
    s = score([12.0, 10.0, 30.0, None])
    assert s.kind == MEDIAN and s.value == 12.0 and s.words() == "median of 3"
    assert score([None, None]).kind == NO_SCORE


# ---- the test statistic ----


def test_u_counts_pairs_and_half_ties() -> None:
    assert u_statistic([3, 4], [1, 3]) == 2 + 1 + 0.5


def test_fully_separated_five_against_five_is_one_split_in_252() -> None:
    t = one_sided_u_test([8, 8, 7, 9, 8], [3, 3, 2, 3, 3])
    assert t.method == "exact" and t.u == 25
    assert t.p == pytest.approx(1 / math.comb(10, 5)) and t.significant


def test_exact_p_of_small_samples() -> None:
    """n = m = 3, no ties: U = 9 is 1 split in 20, U = 8 two (Mann and Whitney's table);
    with ties, 35 of 252 splits (scipy.stats.permutation_test of the rank sum agrees)."""
    assert one_sided_u_test([4, 5, 6], [1, 2, 3]).p == pytest.approx(1 / 20)
    assert one_sided_u_test([3, 5, 6], [1, 2, 4]).p == pytest.approx(2 / 20)
    tied = one_sided_u_test([4, 3, 3, 4, 3], [3, 3, 2, 3, 3])
    assert tied.p == pytest.approx(35 / 252) and not tied.significant


def test_the_test_is_one_sided_and_says_when_it_cannot_reach_the_level() -> None:
    assert one_sided_u_test([3, 3, 2, 3, 3], [8, 8, 7, 9, 8]).p == 1.0  # fewer, not more
    two = one_sided_u_test([9, 9], [2, 2])
    assert two.min_p == pytest.approx(1 / 6) and not two.testable and not two.significant


def test_large_samples_are_resampled_with_a_seeded_generator() -> None:
    more, fewer = [float(v % 7 + 5) for v in range(20)], [float(v % 5 + 1) for v in range(20)]
    t = one_sided_u_test(more, fewer)
    assert t.method.endswith("random splits") and t.significant
    assert t == one_sided_u_test(more, fewer)


def test_an_unreached_run_counts_as_one_epoch_more_than_the_most() -> None:
    runs = [{"epochs_to_target": 3}, {"epochs_to_target": None}, {}]
    assert epochs_needed(runs, 12) == [3, 13, 13]


# ---- the rows, on crafted records ----


def record(devices: int, repeat: int, ttt: float | None, epochs: int | None,
           energy: float | None = None, seed: int | None = None) -> dict[str, Any]:
    recipe = {**Converge().model_dump(), "target_accuracy": 0.95, "max_epochs": 10,
              "seed": repeat if seed is None else seed}
    return {"mode": "converge", "runner": "torch_ddp", "model": "small_cnn",
            "precision": "fp32", "batch_size_per_device": 32, "num_nodes": 1,
            "num_devices": devices, "global_batch_size": 32 * devices, "repeat": repeat,
            "status": "ok", "time_to_target_s": ttt, "epochs_to_target": epochs,
            "converge_time_s": ttt or 20.0, "epochs_run": epochs or 10,
            "final_accuracy": 0.96 if ttt else 0.9, "converge": recipe,
            "result": {"converge": dict(recipe)},
            "telemetry": {"energy_j": energy, "note": None if energy else
                          "CPU run: no GPU sampled", "nvml": {"reason": None}}}


def sweep(energy: bool = False) -> list[dict[str, Any]]:
    one = [(10.0, 3), (11.0, 3), (9.0, 2), (12.0, 3), (30.0, 3)]
    eight = [(6.0, 8), (7.0, 8), (5.0, 7), (8.0, 9), (None, None)]
    return [record(n, i, t, e, energy=(100.0 * t if energy and t else None))
            for n, runs in ((1, one), (8, eight)) for i, (t, e) in enumerate(runs)]


def test_a_configuration_needing_more_epochs_is_flagged_though_faster() -> None:
    rows = {r["num_devices"]: r for r in converge_rows(sweep())}
    one, eight = rows[1], rows[8]
    assert one["time_to_target_s"] == pytest.approx(11.0)  # 10, 11, 12
    assert eight["time_to_target_s"] == pytest.approx(7.0)  # 6, 7, 8: the unreached dropped
    assert eight["speedup"] == pytest.approx(11.0 / 7.0)  # faster to target, and yet:
    assert eight["epochs_needed"] == [8, 8, 7, 9, 11]
    assert eight["epochs_test"]["p"] == pytest.approx(1 / 252)
    assert eight["flags"] == [MORE_EPOCHS] and one["flags"] == []
    text = "\n".join(table_lines(list(rows.values())))
    assert "7.0s (MLPerf mean of 3 of 5)" in text and MORE_EPOCHS in text
    assert "8,8,7,9,11 vs 1 device's 3,3,2,3,3: significantly more epochs" in text
    assert "max_epochs + 1 = 11 epochs" in text
    assert "energy to target: not measured (CPU run: no GPU sampled)" in text
    assert "MLPerf mean of 3 of 5" in (time_to_target_words(sweep()[:5]) or "")


def test_energy_to_target_is_scored_over_the_runs_the_time_kept() -> None:
    rows = {r["num_devices"]: r for r in converge_rows(sweep(energy=True))}
    assert rows[1]["energy_to_target_j"] == pytest.approx(1100.0)  # 1000, 1100, 1200 J
    assert rows[8]["energy_to_target_j"] == pytest.approx(700.0)
    assert " 1100 J " in "\n".join(table_lines(list(rows.values())))


def test_runs_sharing_a_seed_are_flagged() -> None:
    recs = [record(1, i, 10.0 + i, 3, seed=0) for i in range(3)]
    row = converge_rows(recs)[0]
    assert row["seeds"] == [0, 0, 0] and row["flags"] == [SEEDS_REPEAT]
    assert "SEEDS-REPEAT: runs of one configuration share a seed" in "\n".join(
        table_lines([row]))


# ---- seeds in the plan ----


def test_each_repeat_gets_the_recipe_seed_plus_its_number(tmp_path: Path,
                                                           digits_dataset: Path) -> None:
    cfg = load_config(REPO / "configs" / "converge-digits.yaml",
                      [f"dataset.path={digits_dataset}", "repeats=3", "converge.seed=7",
                       "runners=[torch_ddp]"])
    runs = expand(cfg, "s")
    seeds = {(r.num_devices, r.repeat): r.converge["seed"] for r in runs}
    assert seeds == {(n, r): 7 + r for n in (1, 2) for r in range(3)}
    extra = another_repeat(runs[-1], 5)  # repeat 2, seed 9
    assert extra.converge["seed"] == 12 and extra.run_id.endswith("__r5")
