"""Memory baselines taken at the same point of every run (issue 41, item 1): each family's device
setup reads the baseline again once its framework and runtime are loaded and its devices
initialised (runners/memory.py `baseline`), and the record says where; slow: one sweep of
gpt2_tiny at 1 CPU device on torch_ddp, jax_native and keras_jax whose device peaks lie within
the bound docs/runners/shared.md states ("The baseline's point")."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from bench.records.store import load_records
from contract.reasons import sentence
from runners import memory
from tests.helpers.cli import run_cli

MiB = 2**20
# gpt2_tiny, batch 8, 1 CPU device (2026-11-28, docs/runners/shared.md): device peaks with the
# baseline before the runner's benchmark 88-94 (torch_ddp), 352-379 (jax_native), 544-556
# (keras_jax) MiB, 450-468 apart; read after each family's device setup 87-88, 223-237, 342-367
# MiB, 255-279 apart
PEAK_SPREAD = 340 * MiB
# a bare interpreter with the harness's modules holds ~30 MiB; torch, jax hold 150 MiB or more
FRAMEWORK_LOADED = 120 * MiB


def test_the_record_says_where_the_baseline_was_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device setup's call overwrites main's, and memory_source names the point read last."""
    monkeypatch.setattr(memory, "last", {"devices": {}, "cpu": 900 * MiB, "source": "VmHWM"})
    for name in ("_baseline", "_baseline_at"):  # restored after the test
        monkeypatch.setattr(memory, name, None)
    spec = SimpleNamespace(launcher="python", num_devices=1, num_nodes=1)
    memory.baseline()
    first = sentence(memory.for_result(spec, 0)["memory_source"])
    assert "before the runner's benchmark" in first
    memory.baseline("memory.baseline_jax_devices")
    then = sentence(memory.for_result(spec, 0)["memory_source"])
    assert "after jax was imported and its backend initialised" in then
    assert "before the runner's benchmark" not in then


@pytest.mark.slow
def test_device_peaks_compare_across_frameworks(tmp_path: Path, torch_python: str,
                                                jax_python: str) -> None:
    """The same model's device peak on torch, JAX and Keras on JAX lies within PEAK_SPREAD,
    each baseline read after its framework was loaded (it holds the framework's libraries)."""
    config = tmp_path / "baseline.yaml"
    config.write_text(yaml.safe_dump({
        "name": "baseline", "runners": ["torch_ddp", "jax_native", "keras_jax"],
        "models": ["gpt2_tiny"], "devices": [1], "batch_size_per_device": 8, "warmup_steps": 2,
        "measure_steps": 3, "telemetry": False}))
    out = tmp_path / "out"
    proc = run_cli("run", "--config", str(config), "--out", str(out), "--quiet-setup")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = {r["runner"]: r for r in load_records(out)}
    assert sorted(runs) == ["jax_native", "keras_jax", "torch_ddp"], sorted(runs)
    peaks = {}
    for name, run in runs.items():
        assert run["status"] == "ok", (name, run.get("reason"))
        source = sentence(run["memory_source"])
        assert "memory_baseline read after" in source and "before the model was built" in source
        [baseline] = run["memory_baseline"].values()
        assert baseline >= FRAMEWORK_LOADED, (name, baseline / MiB)
        [peaks[name]] = run["device_peak_bytes"].values()
    figures = {name: round(b / MiB) for name, b in peaks.items()}
    assert max(peaks.values()) - min(peaks.values()) <= PEAK_SPREAD, figures
