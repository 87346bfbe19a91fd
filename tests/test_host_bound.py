"""HOST-BOUND apart from STARVED: a GPU below the busy threshold while one host thread kept a
core busy is the host's own per-step work; the same idle GPU with no busy thread is input or
synchronisation. Read from telemetry series files in the harness's own format
(tests/golden/telemetry: the first drawn after the H100 measurement of issue 38, torch_ddp at
batch 64: the GPU about 40% busy, the main thread at 100% of a core; the second the same GPU
with the busiest thread at a third of a core), and the sampler's busiest-thread reading taken
from a real process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.analysis.stats import summarise
from bench.report.summary import format_table
from bench.report.telemetry_chart import read_series
from bench.run.telemetry import Sampler, Sampling
from bench.run.telemetry import summarise as summarise_telemetry

SERIES = Path(__file__).parent / "golden" / "telemetry"


def from_series(name: str) -> dict:
    """The record's telemetry summary of a series file (its own in_window column's span); the
    GPU's mean over that span checked against the file's own column."""
    rows = read_series(SERIES / name)
    assert rows, f"{name} did not read back"
    inside = [r["t"] for r in rows if r["in_window"]]
    util = [r["gpu0_util_pct"] for r in rows if r["in_window"]]
    tel = summarise_telemetry(rows, inside[0] - 0.125, inside[-1], images=64 * 100,
                               starved_below_pct=50.0, sampling=Sampling(0.25))
    assert tel["gpu_util_mean_pct"] == pytest.approx(sum(util) / len(util))
    return tel


def test_a_busy_host_thread_and_an_idle_gpu_is_host_bound() -> None:
    tel = from_series("host-bound.csv")
    assert 30 < tel["gpu_util_mean_pct"] < 50
    assert tel["host"]["top_thread_cores_mean"] >= 0.95
    assert tel["host_bound"] is True and tel["starved"] is False


def test_an_idle_gpu_without_a_busy_thread_stays_starved() -> None:
    tel = from_series("starved.csv")
    assert 30 < tel["gpu_util_mean_pct"] < 50
    assert tel["host"]["top_thread_cores_mean"] < 0.5
    assert tel["starved"] is True and tel["host_bound"] is False
    fed = summarise_telemetry(read_series(SERIES / "host-bound.csv"), 0, 2e9, images=1,
                              starved_below_pct=30.0, sampling=Sampling(0.25))
    assert fed["starved"] is False and fed["host_bound"] is False  # a busy GPU is neither


def test_host_bound_is_a_flag_of_the_row_and_the_table() -> None:
    rec = {"run_id": "torch_ddp__resnet50__n1__r0", "runner": "torch_ddp", "model": "resnet50",
           "device": "gpu", "virtual_devices": False, "num_devices": 1, "scaling": "weak",
           "batch_size_per_device": 64, "global_batch_size": 64, "data": "synthetic",
           "data_label": "synthetic", "precision": "bf16", "status": "ok", "reason": None,
           "repeat": 0, "images_per_sec": 1713.0, "step_times_s": [64 / 1713.0] * 10,
           "telemetry": from_series("host-bound.csv")}
    row = summarise([rec])[0]
    assert row["host_bound"] is True and row["starved"] is False
    table = format_table([row])
    assert "HOST-BOUND" in table and "STARVED" not in table.split("\n\n")[0]


def test_the_sampler_reads_the_busiest_thread_of_the_run() -> None:
    # one thread spins for 1.5 s while the process's other threads sleep
    code = ("import threading, time\n"
            "def spin():\n    end = time.time() + 1.5\n    while time.time() < end: pass\n"
            "ts = [threading.Thread(target=spin)] + [threading.Thread(target=time.sleep, "
            "args=(1.5,)) for _ in range(3)]\n"
            "[t.start() for t in ts]; [t.join() for t in ts]")
    proc = subprocess.Popen([sys.executable, "-c", code])
    samples = Sampler(proc.pid, [], 0.1).start()
    proc.wait(timeout=30)
    read = [s for s in samples.stop() if s["run_top_thread_cores"] is not None
            and s["run_cpu_cores"] is not None and s["run_cpu_cores"] > 0.05]
    assert len(read) >= 5
    # the spinning thread does nearly all of its process's work, however much of a core this
    # machine's load left it (a mean over the five threads would be a fifth of it)
    shares = sorted(s["run_top_thread_cores"] / s["run_cpu_cores"] for s in read)
    assert shares[len(shares) // 2] > 0.7, shares
    # one thread never uses more than its whole process tree (give or take a clock tick of
    # 10 ms in a 0.1 s interval, read a moment apart)
    assert all(s["run_top_thread_cores"] <= s["run_cpu_cores"] + 0.25 for s in read
               if s["run_cpu_cores"] is not None)
