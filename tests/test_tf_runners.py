"""Every TensorFlow-family runner for real on CPU: a few steps at 1 and 2 virtual devices
through the CLI, as a user runs it. (tf_mirrored's fuller sweep is in test_tf_mirrored.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.records import check_record, load_records
from bench.registry import RUNNERS
from tests.conftest import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.framework("tf")]
TF_RUNNERS = sorted(n for n, r in RUNNERS.items() if r.family == "tf" and n != "tf_mirrored")
# Runners that need something from outside the project to run; without it they must say so.
NEEDS = {"tf_cnn_benchmarks": "TF_CNN_BENCHMARKS_DIR"}


@pytest.mark.parametrize("runner", TF_RUNNERS)
def test_runner_at_one_and_two_devices(runner: str, tmp_path: Path, tf_python: str) -> None:
    if NEEDS.get(runner) and os.environ.get(NEEDS[runner]):
        pytest.skip(f"{runner} has no MiniGoogLeNet; with {NEEDS[runner]} set, its real runs "
                    "are tested on ResNet-50 in its own test file")
    out = tmp_path / runner
    proc = run_cli("--config", "configs/cpu-smoke.yaml", "--set", f"runners=[{runner}]",
                   "--set", "warmup_steps=2", "--set", "measure_steps=3",
                   "--set", "batch_size_per_device=8", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = {r["num_devices"]: r for r in load_records(out)}
    assert sorted(records) == [1, 2]
    missing = NEEDS.get(runner)
    for n, rec in records.items():
        assert check_record(rec) == []
        if missing and not os.environ.get(missing):
            assert rec["status"] == "unavailable" and missing in rec["reason"], rec["reason"]
            continue
        log = Path(rec["log_path"]).read_text()[-3000:]
        assert rec["status"] == "ok", f"{rec['reason']}\n{log}"
        assert rec["virtual_devices"] is True
        assert rec["samples"] == 3 * 8 * n
        assert rec["images_per_sec"] > 0
        assert len(rec["environment"]["devices"]) == n
