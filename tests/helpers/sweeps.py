"""Whole sweeps through the CLI on CPU (the smoke config shortened, real data, converge on
digits), their records, and what a converge record that reached its target shows."""

from __future__ import annotations

from pathlib import Path

from bench.records.store import load_records
from tests.helpers.cli import run_cli, sweep_exit


def smoke_sweep(out: Path, *sets: str) -> dict[int, dict]:
    """The CPU smoke config through the CLI, shortened (2 warm-up + 3 timed steps, 8 images
    per device) and with `--set` overrides; its records by device count."""
    args = ["--config", "configs/cpu-smoke.yaml", "--set", "warmup_steps=2",
            "--set", "measure_steps=3", "--set", "batch_size_per_device=8", "--out", str(out)]
    for s in sets:
        args += ["--set", s]
    proc = run_cli(*args)
    records = load_records(out)
    assert proc.returncode == sweep_exit(records), proc.stdout + proc.stderr
    return {r["num_devices"]: r for r in records}


def real_sweep(out: Path, dataset: Path, *sets: str) -> dict[int, dict]:
    """smoke_sweep on real data from `dataset` (augmentation crop-flip, 1 loader worker unless
    a --set says otherwise); its records by device count."""
    return smoke_sweep(out, "data=real", f"dataset.path={dataset}", "dataset.workers=1", *sets)


def converge_sweep(out: Path, dataset: Path, *sets: str) -> list[dict]:
    """configs/converge-digits.yaml through the CLI on `dataset` with `sets` (KEY=VALUE);
    its records (mode converge: runners/converge.py)."""
    args = ["--config", "configs/converge-digits.yaml", "--out", str(out),
            "--set", f"dataset.path={dataset}"]
    for s in sets:
        args += ["--set", s]
    proc = run_cli(*args)
    records = load_records(out)
    assert proc.returncode in (sweep_exit(records), 1), proc.stdout + proc.stderr
    return records


def two_node_converge(out: Path, dataset: Path, runner: str, env: dict[str, str]
                      ) -> tuple[dict, str]:
    """converge_sweep's config with `runner` on one device of each of the local SLURM
    cluster's two nodes (`env`: the local_slurm fixture's), which must exit 0; (its one
    converge record, the CLI's stdout)."""
    proc = run_cli("--config", "configs/converge-digits.yaml", "--out", str(out),
                   "--set", f"dataset.path={dataset}", "--set", f"runners=[{runner}]",
                   "--set", "devices=[1]", "--set", "nodes=[2]",
                   "--set", "cluster={backend: slurm, partition: debug, poll_s: 1}", env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    [rec] = [r for r in load_records(out) if r.get("mode") == "converge"]
    return rec, proc.stdout


def assert_stopped_at_target(rec: dict, target: float) -> None:
    """A converge record that reached `target`: stopped at its first epoch at the target, the
    time to target that epoch's wall time, evaluations included."""
    assert rec["best_accuracy"] >= target, rec["curve"]
    epoch = rec["epochs_to_target"]
    assert epoch == len(rec["curve"]) and rec["target_reason"] is None  # stopped at the target
    point = rec["curve"][epoch - 1]
    assert point["accuracy"] >= target
    assert all(p["accuracy"] < target for p in rec["curve"][:epoch - 1])
    assert rec["time_to_target_s"] == point["wall_s"] > 0
    assert rec["time_to_target_s"] >= rec["train_time_s"] > 0  # evaluations included


def smoke_runs(out: Path, *sets: str) -> list[dict]:
    """smoke_sweep's records as a list, for a sweep of several runners or models (whose
    records share a device count)."""
    smoke_sweep(out, *sets)
    return load_records(out)


def by_runner(records: list[dict]) -> dict[str, dict[int, dict]]:
    """A sweep's records by runner, then by device count."""
    out: dict[str, dict[int, dict]] = {}
    for rec in records:
        out.setdefault(rec["runner"], {})[rec["num_devices"]] = rec
    return out


# A few small_cnn steps can time a window shorter than the parent's telemetry interval (0.25 s):
# no sample falls in it and the record's `contended` is null where a golden record (captured on
# MiniGoogLeNet's longer steps) has a boolean. Sweeps on small_cnn whose records a golden checks
# time SAMPLED_STEPS steps, sampled every 0.05 s (the config's shortest interval).
SAMPLED_STEPS = 20
SAMPLED = (f"measure_steps={SAMPLED_STEPS}", "telemetry.interval_s=0.05")
