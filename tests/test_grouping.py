"""The one grouping key (bench.records.grouping): the plan, the summary and the loader group runs
the same way, so the loader's numbers are summary.csv's (issue 14: the loader grouped on data,
the summary on data_label, and every real-data run lost its speedup). The notebook shows
summarise's rows themselves: tests/test_notebook.py."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from bench.analysis.loader import GROUP_COLUMNS, load_results
from bench.analysis.stats import summarise
from bench.plan.config import validate
from bench.plan.runs import expand
from bench.records.grouping import GROUP_FIELDS, baseline_key, config_key, group_key, synthetic_key
from bench.records.store import REQUIRED, check_record, record_path, write_json_atomic
from bench.report.summary import build_report
from bench.run.launch import base_record

ENV = {"host": "h", "os": "Linux", "cpu_model": "cpu", "cpu_cores": 2, "memory_bytes": 2**33,
       "python": "3.11", "harness_commit": "abc", "gpus": [], "framework": {"tensorflow": "2"}}
# (precision, data label, devices) -> images/sec of each repeat (None: that repeat timed out)
RUNS: dict[tuple[str, str, int], list[float | None]] = {
    ("fp32", "synthetic", 1): [100.0, 110.0],
    ("fp32", "synthetic", 2): [180.0, 200.0],
    ("fp32", "real-w2", 1): [90.0, 96.0],
    ("fp32", "real-w2", 2): [150.0, 160.0, None],
    ("fp32", "real-w4", 1): [60.0, 64.0],
    ("fp32", "real-w4", 2): [100.0, 104.0],
    ("bf16", "synthetic", 2): [300.0, 310.0],  # no 1-device run: no speedup
}
VALUES = ("images_per_sec", "speedup", "scaling_efficiency")


def record(precision: str, label: str, n: int, repeat: int, ips: float | None) -> dict:
    """A schema-valid record as the launcher writes it (data_label beside data and dataset)."""
    real = label != "synthetic"
    rec = {k: None for k in REQUIRED}
    rec.update(
        schema_version=1, sweep_id="s", runner="tf_mirrored", family="tf",
        model="minigooglenet", num_devices=n, virtual_devices=True, device="cpu",
        scaling="weak", batch_size_per_device=32, global_batch_size=32 * n,
        data="real" if real else "synthetic", data_label=label, mode="benchmark",
        dataset={"path": "/d", "augmentation": "crop-flip",
                 "workers": int(label.split("-w")[1])} if real else None,
        precision=precision, repeat=repeat, status="ok" if ips else "timeout",
        reason=None if ips else "timed out", images_per_sec=ips,
        step_times_s=[32 * n / ips] * 10 if ips else None, environment=ENV, options={},
        run_id=f"tf_mirrored__minigooglenet__n{n}__b32__{label}__{precision}__r{repeat}")
    assert check_record(rec) == [], check_record(rec)
    return rec


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder of fake runs, reported as `run_bench.py report` does (summary.csv)."""
    out = tmp_path_factory.mktemp("grouping") / "sweep"
    for (precision, label, n), repeats in RUNS.items():
        for repeat, ips in enumerate(repeats):
            rec = record(precision, label, n, repeat, ips)
            write_json_atomic(record_path(out, rec["run_id"]), rec)
    build_report(out)
    return out


def summary_csv(results: Path) -> dict[tuple, dict[str, float | None]]:
    """summary.csv's rows by (runner, model, data label, precision, devices)."""
    rows = {}
    with open(results / "summary.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            label = "synthetic" if r["data"] == "synthetic" else f"real-w{r['loader_workers']}"
            key = (r["runner"], r["model"], label, r["precision"], int(r["num_devices"]))
            rows[key] = {v: float(r[v]) if r[v] else None for v in VALUES}
    return rows


def assert_same_numbers(got: dict[tuple, dict[str, float]],
                        want: dict[tuple, dict[str, float | None]]) -> None:
    assert set(got) == set(want)
    for key, row in want.items():
        for v in VALUES:
            if row[v] is None:
                assert math.isnan(got[key][v]), (key, v, got[key][v])
            else:  # summary.csv rounds to 4 decimals
                assert got[key][v] == pytest.approx(row[v], abs=1e-4), (key, v)


def test_summary_csv_has_real_data_speedups(results: Path) -> None:
    """The reference itself: each data label against its own 1-device median."""
    want = summary_csv(results)
    assert want[("tf_mirrored", "minigooglenet", "real-w2", "fp32", 2)]["speedup"] == (
        pytest.approx(155 / 93, abs=1e-4))
    assert want[("tf_mirrored", "minigooglenet", "real-w4", "fp32", 2)]["speedup"] == (
        pytest.approx(102 / 62, abs=1e-4))
    assert want[("tf_mirrored", "minigooglenet", "synthetic", "fp32", 2)]["speedup"] == (
        pytest.approx(190 / 105, abs=1e-4))
    assert want[("tf_mirrored", "minigooglenet", "synthetic", "bf16", 2)]["speedup"] is None


def test_loader_numbers_equal_summary_csv_including_real_data(results: Path) -> None:
    """Per configuration, the median over ok runs of load_results' images/sec, speedup and
    efficiency are summary.csv's, and no real-data run of a configuration with a 1-device
    baseline has a NaN speedup."""
    df = load_results(results)
    assert len(df) == sum(len(v) for v in RUNS.values())
    ok = df[df["status"] == "ok"]
    real = ok[ok["data"] == "real"]
    assert len(real) == 8 and real["speedup"].notna().all(), real[["run_id", "speedup"]]
    per_config = ok.groupby(["runner", "model", "data_label", "precision",
                             "num_devices"])[list(VALUES)].median()
    assert_same_numbers(per_config.to_dict("index"), summary_csv(results))


def test_runspec_record_and_summary_row_share_one_key(tmp_path: Path) -> None:
    """The plan's RunSpec.group_key, the key of the record the launcher writes for that spec
    (with and without its data_label, as older records lack it) and of the summary row of
    those records are one key; the baseline key is the spec's configuration at 1 device."""
    (tmp_path / "manifest.json").write_text('{"classes": 10}')
    cfg = validate({"runners": ["tf_mirrored"], "models": ["minigooglenet"],
                    "devices": [1, 2], "batch_size_per_device": 8, "repeats": 2,
                    "data": ["synthetic", "real"],
                    "dataset": {"path": str(tmp_path), "workers": [1, 4]}})
    specs = expand(cfg, "s")
    records = []
    for spec in specs:
        rec = {**base_record(spec, ENV, tmp_path / "x.log"), "status": "ok",
               "images_per_sec": 10.0 * spec.num_devices}
        old = {k: v for k, v in rec.items() if k != "data_label"}
        assert group_key(rec) == group_key(old) == spec.group_key
        assert config_key(rec) == (*spec.group_key, 1, spec.num_devices)
        records.append(rec)
    assert {s.data_label for s in specs} == {"synthetic", "real-w1", "real-w4"}
    assert len({s.group_key for s in specs}) == 3  # device count and repeat aside
    by_key = {config_key(r): r for r in records}
    for spec in specs:
        base = by_key[baseline_key(spec)]
        assert base["num_devices"] == 1 and base["data_label"] == spec.data_label
        assert group_key(base) == spec.group_key
    rows = summarise(records)
    assert {config_key(r) for r in rows} == set(by_key)
    assert all(r["speedup"] == pytest.approx(r["num_devices"]) for r in rows)
    assert GROUP_COLUMNS == GROUP_FIELDS


def test_batch_held_fixed_is_per_device_or_global() -> None:
    weak = record("fp32", "synthetic", 2, 0, 1.0)
    strong = {**weak, "scaling": "strong", "batch_size_per_device": 16, "global_batch_size": 32}
    assert group_key(weak)[GROUP_FIELDS.index("batch")] == 32
    assert group_key(strong)[GROUP_FIELDS.index("batch")] == 32
    assert group_key({**strong, "num_devices": 1, "batch_size_per_device": 32}) == (
        group_key(strong))
    assert group_key({**weak, "global_batch_size": 32}) == group_key(weak)


def test_synthetic_twin_differs_only_in_data() -> None:
    real = record("fp32", "real-w2", 2, 0, 1.0)
    twin = synthetic_key(real)
    assert twin == config_key(record("fp32", "synthetic", 2, 0, 1.0))
    assert twin != config_key(record("fp32", "synthetic", 1, 0, 1.0))


def test_nodes_make_their_own_rows_and_share_the_one_device_baseline(tmp_path: Path) -> None:
    """2 nodes x 1 device and 1 node x 2 devices are two rows of one configuration, each
    with its speedup over the 1-node 1-device run; records from before multi-node runs
    (no num_nodes) count as 1 node."""
    cfg = validate({"runners": ["torch_ddp"], "models": ["minigooglenet"], "devices": [1, 2],
                    "nodes": [1, 2], "batch_size_per_device": 8,
                    "cluster": {"backend": "slurm"}})
    specs = expand(cfg, "s")
    assert [(s.num_nodes, s.num_devices) for s in specs] == [(1, 1), (1, 2), (2, 2), (2, 4)]
    assert len({s.group_key for s in specs}) == 1
    ips = {(1, 1): 10.0, (1, 2): 18.0, (2, 2): 15.0, (2, 4): 28.0}
    records = [{**base_record(s, ENV, tmp_path / "x.log"), "status": "ok",
                "images_per_sec": ips[(s.num_nodes, s.num_devices)]} for s in specs]
    old = {k: v for k, v in records[0].items() if k != "num_nodes"}
    assert config_key(old) == config_key(records[0])
    rows = {(r["num_nodes"], r["num_devices"]): r for r in summarise(records)}
    assert rows[(2, 2)]["speedup"] == pytest.approx(1.5)
    assert rows[(1, 2)]["speedup"] == pytest.approx(1.8)
    assert rows[(2, 4)]["scaling_efficiency"] == pytest.approx(0.7)
