"""Telemetry: the sampler against real child processes, the window cut, the summary's arithmetic
on crafted samples, the starved and noisy flags, the series file, charts and report.html."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.analysis.loader import load_results
from bench.analysis.stats import summarise
from bench.plan.runs import RunSpec
from bench.report.summary import build_report, format_table
from bench.report.telemetry_chart import read_series
from bench.run import environment
from bench.run.launch import launch
from bench.run.telemetry import Sampler, Sampling, in_window, open_nvml, write_series
from bench.run.telemetry import summarise as summarise_telemetry

TELEMETRY = {"enabled": True, "interval_s": 0.05, "starved_below_pct": 50.0}


def toy_spec(**options: object) -> RunSpec:
    return RunSpec(
        run_id="toy-telemetry", sweep_id="t", runner="toy", family="host",
        module="tests.children.toy", model="probe", num_devices=1, device="cpu",
        virtual_devices=True, scaling="weak", batch_size_per_device=8, global_batch_size=8,
        data="synthetic", precision="fp32", warmup_steps=1, measure_steps=8, repeat=0,
        timeout_s=60, options=dict(options), telemetry=dict(TELEMETRY))


# A child that sleeps while its own child burns one core for 1.5 s: only a sampler that
# follows the whole process tree sees the work.
GRANDCHILD = ("import subprocess, sys; subprocess.run([sys.executable, '-c', "
              "'import time\\nend = time.time() + 1.5\\nwhile time.time() < end: pass'])")


def test_sampler_follows_a_real_process_tree() -> None:
    proc = subprocess.Popen([sys.executable, "-c", GRANDCHILD])
    sampler = Sampler(proc.pid, [], 0.05).start()
    proc.wait(timeout=30)
    samples = sampler.stop()
    assert len(samples) >= 10
    assert all(samples[i]["t"] < samples[i + 1]["t"] for i in range(len(samples) - 1))
    busy = [s["run_cpu_cores"] for s in samples if s["run_cpu_cores"] is not None]
    # the grandchild burns a core (shared with whatever else runs on this machine)
    assert max(busy) > 0.5 and sum(busy) / len(busy) > 0.25
    assert max(s["run_rss_bytes"] for s in samples) > 1_000_000
    assert all(0 <= s["host_cpu_pct"] <= 100 for s in samples)
    assert all(s["host_mem_used_bytes"] > 0 for s in samples)


def test_no_nvml_is_stated_and_cpu_telemetry_still_works() -> None:
    nvml, reason = open_nvml()
    if nvml is not None:
        nvml.nvmlShutdown()
        pytest.skip("this machine has NVML")
    assert reason.startswith("no NVML")
    summary = summarise_telemetry([{"t": 1.0, "host_cpu_pct": 50.0, "host_mem_used_bytes": 1,
                                    "run_cpu_cores": 1.0, "run_rss_bytes": 2}],
                                  0.5, 1.5, 10, starved_below_pct=50,
                                  sampling=Sampling(0.25, nvml_reason=reason,
                                                    sampled_gpus=False))
    assert summary["nvml"] == {"available": False, "reason": reason}
    assert summary["host"]["run_cpu_cores_mean"] == 1.0
    assert summary["starved"] is None and summary["joules_per_image"] is None


def test_launched_run_gets_its_window_sampled(tmp_path: Path) -> None:
    rec = launch(toy_spec(busy_s=0.15), sys.executable, tmp_path, {"host": "test"})
    assert rec["status"] == "ok", rec["reason"]
    tel = rec["telemetry"]
    window = rec["window_end"] - rec["window_start"]
    assert window > 1.0 and tel["window_s"] == pytest.approx(window)
    # 0.05 s sampling over a > 1 s window; generous bounds for a busy 2-core machine
    assert tel["samples_in_window"] >= 8 and tel["samples"] > tel["samples_in_window"]
    assert tel["host"]["run_cpu_cores_mean"] > 0.4
    assert tel["gpus"] == [] and tel["note"] == "CPU run: no GPU sampled"
    series = read_series(tmp_path / tel["path"])
    assert len(series) == tel["samples"]
    assert sum(r["in_window"] for r in series) == tel["samples_in_window"]
    inside = [r["t_rel"] for r in series if r["in_window"]]
    assert min(inside) >= -0.05 and max(inside) <= window + 0.05


def test_telemetry_off_leaves_no_series(tmp_path: Path) -> None:
    rec = launch(dataclasses.replace(toy_spec(), telemetry=None), sys.executable, tmp_path,
                 {"host": "test"})
    assert rec["status"] == "ok" and "telemetry" not in rec
    assert not list((tmp_path / "runs").glob("*.telemetry.csv"))


def test_a_window_shorter_than_the_interval_says_so(tmp_path: Path) -> None:
    spec = dataclasses.replace(toy_spec(), telemetry={**TELEMETRY, "interval_s": 5.0})
    rec = launch(spec, sys.executable, tmp_path, {"host": "test"})
    tel = rec["telemetry"]
    assert tel["samples_in_window"] == 0
    assert "no sample fell in the" in tel["note"]
    assert tel["host"]["run_cpu_cores_mean"] is None


def gpu_samples(utils: list[float], power: float, t0: float = 100.0) -> list[dict]:
    """Crafted samples of two GPUs every 0.5 s: utilisation per sample, constant power."""
    return [{"t": t0 + 0.5 * i, "host_cpu_pct": 10.0, "host_mem_used_bytes": 5,
             "run_cpu_cores": 0.5, "run_rss_bytes": 7,
             **{f"gpu{g}_{k}": v for g in (0, 1) for k, v in (
                 ("util_pct", u), ("mem_util_pct", 5.0), ("mem_used_bytes", 1000 * (i + 1)),
                 ("power_w", power), ("sm_clock_mhz", 1500.0), ("temp_c", 60.0 + i),
                 ("pcie_tx_kbs", None), ("pcie_rx_kbs", None))}}
            for i, u in enumerate(utils)]


def test_window_membership_uses_the_middle_of_each_span() -> None:
    samples = [{"t": t} for t in (0.0, 1.0, 2.0, 3.0, 4.0)]
    # spans: (0), (0,1] mid 0.5, (1,2] mid 1.5, (2,3] mid 2.5, (3,4] mid 3.5
    assert in_window(samples, 1.2, 3.0) == [False, False, True, True, False]
    assert in_window(samples, None, None) == [False] * 5


def test_summary_arithmetic_energy_and_starved() -> None:
    # samples at 100.0 .. 104.5; window [101.0, 104.0]: spans with middles 101.25 .. 103.75
    samples = gpu_samples([0, 90, 90, 30, 20, 30, 20, 30, 20, 0], power=200.0)
    tel = summarise_telemetry(samples, 101.0, 104.0, images=600, starved_below_pct=50,
                              sampling=Sampling(0.5))
    assert tel["samples_in_window"] == 6  # t = 101.5 .. 104.0
    g0 = tel["gpus"][0]
    assert g0["util_mean_pct"] == pytest.approx(25.0) and g0["util_min_pct"] == 20
    assert g0["energy_j"] == pytest.approx(200.0 * 3.0)
    assert tel["energy_j"] == pytest.approx(2 * 600.0)
    assert tel["joules_per_image"] == pytest.approx(1200.0 / 600)
    assert g0["mem_used_peak_bytes"] == 10_000  # peak over the whole run, not the window
    assert g0["temp_max_c"] == 68.0 and g0["pcie_tx_mean_kbs"] is None
    assert tel["gpu_util_mean_pct"] == pytest.approx(25.0)
    assert tel["starved"] is True
    fed = summarise_telemetry(samples, 101.0, 104.0, images=600, starved_below_pct=20,
                              sampling=Sampling(0.5))
    assert fed["starved"] is False


def test_series_file_round_trip(tmp_path: Path) -> None:
    samples = gpu_samples([50, 60, 70], power=100.0)
    write_series(tmp_path / "s.csv", samples, 100.2, 101.0)
    rows = read_series(tmp_path / "s.csv")
    assert [r["in_window"] for r in rows] == [0, 1, 1]
    assert rows[1]["gpu1_util_pct"] == 60 and rows[0]["gpu0_pcie_rx_kbs"] is None
    assert rows[0]["t_rel"] == pytest.approx(-0.2)


def record(ips: float, repeat: int, starved: bool = False, mfu: float | None = None
           ) -> dict:
    """A crafted ok record of one configuration (1 GPU)."""
    return {
        "run_id": f"torch_ddp__resnet50__n1__r{repeat}", "runner": "torch_ddp", "model": "resnet50",
        "device": "gpu", "virtual_devices": False, "num_devices": 1, "scaling": "weak",
        "batch_size_per_device": 64, "global_batch_size": 64, "data": "synthetic",
        "data_label": "synthetic", "precision": "fp32", "status": "ok", "reason": None,
        "repeat": repeat, "images_per_sec": ips, "step_times_s": [64 / ips] * 10,
        "telemetry": {"starved": starved, "gpu_util_mean_pct": 30.0 if starved else 95.0,
                      "joules_per_image": 1.5, "host": {"run_cpu_cores_mean": 2.0}},
        "mfu": {"mfu": mfu, "peak_flops": 1e14} if mfu is not None else None,
    }


def test_flags_on_crafted_records() -> None:
    calm = summarise([record(100.0, 0), record(100.5, 1), record(99.5, 2)])[0]
    assert calm["starved"] is False and calm["noisy"] is False
    assert calm["gpu_util_pct"] == 95.0 and calm["joules_per_image"] == 1.5
    assert calm["run_cpu_cores"] == 2.0
    rough = summarise([record(100.0, 0, starved=True, mfu=0.3), record(140.0, 1, mfu=0.42),
                       record(70.0, 2, mfu=0.21)])[0]
    assert rough["starved"] is True and rough["noisy"] is True
    assert rough["mfu"] == pytest.approx(0.3) and rough["peak_flops"] == 1e14
    # the CV target comes from the sweep when it sets one
    assert summarise([record(100.0, 0), record(140.0, 1)], cv_target=0.5)[0]["noisy"] is False
    table = format_table([calm, rough])
    assert "STARVED" in table and "noisy" in table and "30.0%" in table


def test_report_html_lists_flagged_rows_and_telemetry_charts(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    samples = gpu_samples([20, 30, 20, 30], power=150.0)
    write_series(runs / "torch_ddp__resnet50__n1__r0.telemetry.csv", samples, 100.2, 101.5)
    rec = record(100.0, 0, starved=True)
    rec["telemetry"].update(path="runs/torch_ddp__resnet50__n1__r0.telemetry.csv", window_s=1.3,
                            starved_below_pct=50.0)
    (runs / "torch_ddp__resnet50__n1__r0.json").write_text(json.dumps(rec))
    rows, _, charts = build_report(tmp_path)
    assert rows[0]["starved"] is True
    chart = tmp_path / "charts" / "telemetry" / "torch_ddp__resnet50__n1__r0.png"
    assert chart.stat().st_size > 5000
    page = (tmp_path / "report.html").read_text()
    assert tmp_path / "report.html" in charts
    assert "<i>starved</i>" in page and '<summary>telemetry</summary><img src="data:image/png' \
        ';base64,' in page and 'alt="telemetry torch_ddp__resnet50__n1__r0"' in page
    df = load_results(tmp_path)
    assert df.loc[0, "starved"] and df.loc[0, "gpu_util_pct"] == 30.0
    assert df.loc[0, "telemetry_path"] == "runs/torch_ddp__resnet50__n1__r0.telemetry.csv"


@pytest.mark.gpu
def test_nvml_telemetry_of_a_real_gpu_run(tmp_path: Path) -> None:
    """On a GPU machine: a real GPU training run's record carries NVML telemetry."""
    if not environment.gpus():
        pytest.skip("no GPU seen by NVML")
    from tests.helpers.cli import run_cli

    cfg = tmp_path / "gpu.yaml"
    cfg.write_text("name: gpu-telemetry\nrunners: [torch_ddp]\nmodels: [minigooglenet]\n"
                   "devices: [1]\nbatch_size_per_device: 128\ndevice: gpu\nwarmup_steps: 10\n"
                   "measure_steps: 100\ntimeout_s: 900\n")
    proc = run_cli("--config", str(cfg), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    rec = json.loads(next((tmp_path / "out" / "runs").glob("*.json")).read_text())
    assert rec["status"] == "ok", rec["reason"]
    tel = rec["telemetry"]
    assert tel["nvml"]["available"] is True and tel["samples_in_window"] >= 2
    gpu = tel["gpus"][0]
    assert gpu["util_mean_pct"] > 0 and gpu["power_mean_w"] > 0
    assert gpu["mem_used_peak_bytes"] > 0 and gpu["sm_clock_mean_mhz"] > 0
    assert tel["joules_per_image"] > 0
