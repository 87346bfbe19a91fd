"""Summary maths: speedup and scaling efficiency against the 1-device run of the same group."""

from __future__ import annotations

import pytest

from bench.stats import efficiency, speedup, summarise


def rec(n: int, ips: float | None, status: str = "ok", repeat: int = 0, **kw: object) -> dict:
    base = {"runner": "r", "model": "m", "data": "synthetic", "precision": "fp32",
            "scaling": "weak", "batch_size_per_device": 32, "global_batch_size": 32 * n,
            "device": "cpu", "virtual_devices": True, "num_devices": n, "status": status,
            "images_per_sec": ips, "reason": None if status == "ok" else "boom",
            "repeat": repeat}
    base.update(kw)
    return base


def test_speedup_and_efficiency() -> None:
    assert speedup(150.0, 100.0) == 1.5
    assert efficiency(1.5, 2) == 0.75
    assert speedup(None, 100.0) is None and speedup(100.0, None) is None
    assert efficiency(None, 2) is None


def test_summary_against_one_device_baseline() -> None:
    rows = summarise([rec(1, 100.0), rec(2, 180.0), rec(4, 300.0)])
    by_n = {r["num_devices"]: r for r in rows}
    assert by_n[1]["speedup"] == 1.0 and by_n[1]["scaling_efficiency"] == 1.0
    assert by_n[2]["speedup"] == pytest.approx(1.8)
    assert by_n[2]["scaling_efficiency"] == pytest.approx(0.9)
    assert by_n[4]["scaling_efficiency"] == pytest.approx(0.75)


def test_repeats_are_averaged_and_failures_counted() -> None:
    rows = summarise([rec(1, 100.0), rec(1, 120.0, repeat=1), rec(2, 200.0),
                      rec(2, None, status="timeout", repeat=1)])
    by_n = {r["num_devices"]: r for r in rows}
    assert by_n[1]["images_per_sec"] == pytest.approx(110.0)
    assert by_n[1]["images_per_sec_std"] == pytest.approx(14.1421, rel=1e-4)
    assert by_n[2]["runs_ok"] == 1 and by_n[2]["runs_total"] == 2
    assert by_n[2]["speedup"] == pytest.approx(200 / 110)


def test_groups_do_not_mix() -> None:
    rows = summarise([rec(1, 100.0), rec(2, 150.0), rec(1, 50.0, precision="bf16"),
                      rec(2, 100.0, precision="bf16"), rec(2, 10.0, model="other")])
    got = {(r["precision"], r["model"], r["num_devices"]): r["speedup"] for r in rows}
    assert got[("fp32", "m", 2)] == pytest.approx(1.5)
    assert got[("bf16", "m", 2)] == pytest.approx(2.0)
    assert got[("fp32", "other", 2)] is None  # no 1-device baseline


def test_failed_baseline_gives_no_speedup() -> None:
    rows = summarise([rec(1, None, status="failed"), rec(2, 100.0)])
    assert all(r["speedup"] is None for r in rows)
    assert rows[0]["status"] == "failed" and rows[0]["reason"] == "boom"


def test_strong_scaling_groups_by_global_batch() -> None:
    rows = summarise([rec(1, 100.0, scaling="strong", global_batch_size=64),
                      rec(2, 160.0, scaling="strong", global_batch_size=64,
                          batch_size_per_device=32)])
    assert rows[1]["speedup"] == pytest.approx(1.6)
