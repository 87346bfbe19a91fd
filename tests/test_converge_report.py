"""Mode converge's outputs from a real sweep's records (tests/golden/converge-results: torch_ddp,
tf_mirrored and keras_tf_kuza55 on digits at 1 and 2 virtual CPU devices, 2 repeats): the
seed-form table, converge.csv, the accuracy-vs-time chart and report.html's section, explain's
split of time to target, compare's time to accuracy, and seed 004's published rows beside
MiniGoogLeNet's. No framework runs here."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from bench.analysis.compare import compare
from bench.analysis.converge import converge_rows, explain_lines, interval
from bench.analysis.stats import BOOTSTRAP_CI, RANGE
from bench.records.store import load_records
from bench.report.converge import published_rows, table_lines
from tests.helpers.cli import REPO, run_cli

GOLDEN = REPO / "tests" / "golden" / "converge-results"


@pytest.fixture()
def folder(tmp_path: Path) -> Path:
    out = tmp_path / "converge-digits"
    shutil.copytree(GOLDEN, out)
    return out


def rows_by(records: list[dict]) -> dict[tuple[str, int], dict]:
    return {(r["runner"], r["num_devices"]): r for r in converge_rows(records)}


def test_report_prints_the_seed_table_and_writes_its_csv_chart_and_html(folder: Path) -> None:
    proc = run_cli("report", str(folder))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "time to accuracy (mode converge" in out and "s/epoch" in out
    assert "recipe: target 95% held-out accuracy or 10 epochs" in out
    assert "not reached: keras_tf_kuza55 2 vcpu: best held-out accuracy" in out
    with (folder / "converge.csv").open() as fh:
        table = list(csv.DictReader(fh))
    assert {(r["runner"], r["num_devices"]) for r in table} == {
        (runner, n) for runner in ("keras_tf_kuza55", "tf_mirrored", "torch_ddp")
        for n in ("1", "2")}
    chart = folder / "charts" / "converge_accuracy_vs_time.png"
    assert chart.stat().st_size > 10_000
    page = (folder / "report.html").read_text()
    assert "<h2>Time to accuracy</h2>" in page and 'src="data:image/png;base64,' in page \
        and 'alt="accuracy vs time"' in page
    # the summary keeps the accuracy beside images/sec
    with (folder / "summary.csv").open() as fh:
        summary = list(csv.DictReader(fh))
    assert all(float(r["final_accuracy"]) > 0.8 for r in summary)


def test_the_table_reads_the_curves(folder: Path) -> None:
    records = load_records(folder)
    rows = rows_by(records)
    assert rows
    for (runner, n), row in rows.items():
        mine = [r for r in records if r["runner"] == runner and r["num_devices"] == n]
        assert row["runs"] == 2 and row["runs_ok"] == 2
        assert row["final_accuracy"] == pytest.approx(
            sorted(r["final_accuracy"] for r in mine)[0] / 2
            + sorted(r["final_accuracy"] for r in mine)[1] / 2)
        curve = mine[0]["curve"]
        assert row["epoch_time_s"] > 0 and row["epochs"] == pytest.approx(
            sum(len(r["curve"]) for r in mine) / 2)
        reached = [r["time_to_target_s"] for r in mine if r["time_to_target_s"]]
        if reached:  # two repeats: their range, called so
            low, high, kind = row["time_to_target_interval"]
            assert kind == RANGE and (low, high) == (min(reached), max(reached))
            assert row["time_to_target_s"] == pytest.approx(sum(reached) / 2)
        else:
            assert row["time_to_target_s"] is None and len(curve) == 10
    # speed-up to accuracy only where both device counts reached the target
    assert rows[("torch_ddp", 2)]["speedup"] == pytest.approx(
        rows[("torch_ddp", 1)]["total_time_s"] / rows[("torch_ddp", 2)]["total_time_s"])
    assert rows[("keras_tf_kuza55", 2)]["speedup"] is None


def test_intervals_are_a_range_for_two_and_a_bootstrap_from_three() -> None:
    assert interval([1.0]) is None
    assert interval([2.0, 1.0]) == (1.0, 2.0, RANGE)
    low, high, kind = interval([1.0, 2.0, 3.0, 4.0])
    assert kind == BOOTSTRAP_CI == "95% bootstrap CI" and 1.0 <= low <= high <= 4.0


def test_explain_splits_time_to_target_into_epochs_and_time_per_epoch(folder: Path) -> None:
    lines = explain_lines(load_records(folder))
    assert len(lines) == 6
    two = next(line for line in lines if line.startswith("torch_ddp small_cnn fp32 b=32/dev, 2"))
    assert "= training" in two and "+ evaluation" in two and "vs 1 device:" in two
    assert "as fast to the target overall" in two
    kuza = next(line for line in lines if line.startswith("keras_tf_kuza55 small_cnn fp32 "
                                                          "b=32/dev, 2"))
    assert "target not reached" in kuza and "no time to accuracy to compare" in kuza
    proc = run_cli("report", str(folder))
    assert two in proc.stdout


def test_compare_of_two_converge_folders_gives_time_to_accuracy(folder: Path,
                                                                tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(folder, other)
    cmp = compare(str(folder), str(other), 0.05)
    notes = {r.label: "; ".join(r.notes) for r in cmp.rows}
    label = next(k for k in notes if k.startswith("converge torch_ddp") and "2 vcpu" in k)
    assert "time to accuracy: BASE to target" in notes[label]
    assert "(range " in notes[label] and "2/2 runs reached it" in notes[label]
    kuza = next(k for k in notes if k.startswith("converge keras_tf_kuza55") and "2 vcpu" in k)
    assert "BASE target not reached, 0/2 runs reached it" in notes[kuza]
    proc = run_cli("compare", str(folder), str(other), "--out", str(tmp_path / "cmp"))
    assert proc.returncode == 0, proc.stderr
    assert "time to accuracy" in (tmp_path / "cmp" / "compare.md").read_text()


def test_seed_004s_published_times_stand_beside_minigooglenet(folder: Path) -> None:
    published = {int(p["gpus"]): p for p in published_rows({"minigooglenet"})}
    assert published[1]["total_time_s"] == 4450 and published[4]["total_time_s"] == 1143
    assert published[1]["epoch_time_s"] == 63 and published[4]["epochs"] == 70
    assert published_rows({"small_cnn"}) == []
    rows = converge_rows(load_records(folder))
    as_mini = [{**r, "model": "minigooglenet"} for r in rows]
    text = "\n".join(table_lines(as_mini))
    assert "published: seed 004 PyImageSearch 2017" in text and "74m10s" in text \
        and "19m03s" in text


def test_the_records_hold_the_recipe_and_curve(folder: Path) -> None:
    records = load_records(folder)
    assert records
    for rec in records:
        assert rec["mode"] == "converge" and rec["converge"]["lr_scaling"] == "linear"
        recipe = rec["result"]["converge"]
        assert recipe["peak_lr"] == pytest.approx(0.01 * rec["global_batch_size"] / 32)
        assert [p["epoch"] for p in rec["curve"]] == list(range(1, len(rec["curve"]) + 1))
        assert json.dumps(rec["curve"])  # plain JSON


def test_records_from_before_distinct_seeds_are_flagged_and_2_runs_are_not_tested(
        folder: Path) -> None:
    """The golden sweep's 2 repeats both trained with seed 0 (before repeat r got seed + r):
    every row is flagged SEEDS-REPEAT, and 2 runs against 2 cannot reach p <= 0.05, which the
    line under the table says instead of a verdict."""
    rows = converge_rows(load_records(folder))
    assert all(r["seeds"] == [0, 0] and "SEEDS-REPEAT" in r["flags"] for r in rows)
    assert not any("MORE-EPOCHS" in r["flags"] for r in rows)
    text = "\n".join(table_lines(rows))
    assert ("epochs to target, torch_ddp 2 vcpu: 3,3 vs 1 device's 3,3: too few runs to test "
            "at 0.05") in text
