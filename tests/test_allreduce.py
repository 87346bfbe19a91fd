"""mode allreduce, the communication probe (issue 17): the registry's probes, the config, the
plan, the parent's checks of a probe's result, the summary and report, and the torch probe for
real on CPU through run_bench.py (the other probes: tests/test_allreduce_probes.py)."""

from __future__ import annotations

import csv
import json
import math
import re
import time
from pathlib import Path
from typing import Any

import pytest

from bench.analysis.stats import summarise
from bench.catalog.registry import PROBES, RUNNERS
from bench.plan.config import ConfigError, json_schema, validate
from bench.plan.runs import expand
from bench.records.store import check_record, load_records
from bench.report import allreduce as allreduce_report
from bench.run.sweep import precheck
from bench.run.verdict import classify, validate_result
from contract import collectives as allreduce
from tests.helpers.cli import run_cli
from tests.specs import run_spec

PROBE = {"mode": "allreduce", "models": ["minigooglenet"], "devices": [2]}
BENCH = {"runners": ["torch_ddp"], "models": ["minigooglenet"], "devices": [1, 2],
         "batch_size_per_device": 8}
CPU_ENV: dict[str, Any] = {"host": "test", "gpus": []}
NV_TOPO = ("\tGPU0\tGPU1\tCPU Affinity\n"
           "GPU0\t X \tNV4\t0-19\n"
           "GPU1\tNV4\t X \t0-19\n")
GPU_ENV: dict[str, Any] = {"host": "test", "gpus": [{"name": "Tesla V100-SXM2-16GB"}] * 2,
                           "gpu_topology": {"nvidia_smi_topo_m": NV_TOPO}}


# --- the registry ---------------------------------------------------------------------------

def test_five_probes_each_in_its_family_with_its_launcher() -> None:
    assert {n: (p.family, p.module, p.launcher) for n, p in PROBES.items()} == {
        "torch_allreduce": ("torch", "runners.torch.allreduce_probe", "torchrun"),
        "horovod_allreduce": ("horovod", "runners.torch.horovod_allreduce_probe", "horovodrun"),
        "tf_allreduce": ("tf", "runners.tf.allreduce_probe", "python"),
        "mxnet_allreduce": ("mxnet", "runners.mxnet.allreduce_probe", "python"),
        "jax_allreduce": ("jax", "runners.jax.allreduce_probe", "python"),
    }
    assert not set(PROBES) & set(RUNNERS)  # a probe is no training runner


def test_list_names_every_probe_and_its_launcher() -> None:
    proc = run_cli("list", timeout=120)
    assert proc.returncode == 0, proc.stderr
    section = proc.stdout.split("All-reduce probes (mode: allreduce")[1].split("\nModels:")[0]
    for name, info in PROBES.items():
        assert f"  {name} " in section and f"family={info.family}" in section
    assert section.count("launcher: ") == len(PROBES)


# --- the config -----------------------------------------------------------------------------

def test_allreduce_mode_runs_every_probe_by_default_and_needs_no_batch() -> None:
    cfg = validate(PROBE)
    assert cfg.mode == ["allreduce"] and cfg.probes == list(PROBES)
    assert cfg.batch_sizes == [] and cfg.runners == []
    # the resolved config (config.yaml) loads back as it was, without a batch key
    assert "batch_size_per_device" not in cfg.to_dict()
    assert validate(cfg.to_dict()) == cfg


def test_named_probes_are_checked_with_the_closest_name() -> None:
    assert validate({**PROBE, "probes": "tf_allreduce"}).probes == ["tf_allreduce"]
    with pytest.raises(ConfigError) as info:
        validate({**PROBE, "probes": ["torch_allreduc"]})
    assert str(info.value).startswith("probes: 'torch_allreduc' is not allowed (did you mean "
                                      "'torch_allreduce'?); allowed: ")
    with pytest.raises(ConfigError, match="^mode: 'allreduces' is not allowed .*did you mean "
                                          "'allreduce'"):
        validate({**PROBE, "mode": "allreduces"})


@pytest.mark.parametrize("raw, words", [
    ({"mode": "allreduce", "models": ["resnet50"]},
     "devices: missing; this key is required with mode allreduce"),
    ({**PROBE, "devices": [1]},
     "devices: [1] is not allowed; allowed: a device count of 2 or more with mode allreduce"),
    ({**PROBE, "cluster": {"backend": "slurm"}},
     "cluster.backend: 'slurm' is not allowed; allowed: local with mode allreduce"),
])
def test_what_the_probe_cannot_run_is_one_line(raw: dict, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate(raw)
    assert str(info.value).startswith(words) and "\n" not in str(info.value)


def test_bad_probe_config_through_the_cli_is_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("mode: allreduce\nmodels: [resnet50]\ndevices: [1]\n")
    proc = run_cli("--config", str(path), "--dry-run", timeout=120)
    assert proc.returncode == 2 and proc.stderr.startswith("error: devices: [1] is not allowed")


def test_a_mixed_sweep_still_needs_its_batch() -> None:
    with pytest.raises(ConfigError, match="^batch_size_per_device: missing"):
        validate({**PROBE, "mode": ["benchmark", "allreduce"], "runners": ["torch_ddp"]})


def test_schema_shows_mode_allreduce_and_the_probes() -> None:
    props = json_schema()["properties"]
    assert "allreduce" in json.dumps(props["mode"])
    probes = json.dumps(props["probes"])
    assert all(f'"{name}"' in probes for name in PROBES)


# --- the plan -------------------------------------------------------------------------------

def test_plan_skips_one_device_for_the_probe_and_keeps_it_for_benchmarks() -> None:
    cfg = validate({**BENCH, "mode": ["benchmark", "allreduce"], "devices": [1, 2, 4],
                    "probes": ["torch_allreduce", "tf_allreduce"], "warmup_steps": 3,
                    "measure_steps": 7, "repeats": 2})
    runs = expand(cfg, "s")
    probes = [r for r in runs if r.mode == "allreduce"]
    # repeats outermost, then probes, models, device counts of 2 or more
    assert [r.run_id for r in probes] == [
        f"allreduce__{p}__minigooglenet__n{n}__r{rep}" for rep in (0, 1)
        for p in ("torch_allreduce", "tf_allreduce") for n in (2, 4)]
    assert {r.num_devices for r in runs if r.mode == "benchmark"} == {1, 2, 4}
    for r in probes:
        info = PROBES[r.runner]
        assert (r.family, r.module, r.launcher) == (info.family, info.module, info.launcher)
        assert (r.warmup_steps, r.measure_steps) == (3, 7)  # iterations per buffer size
        assert r.virtual_devices and r.device == "cpu" and r.precision == "fp32"


def test_dry_run_prints_the_probe_runs(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("mode: allreduce\nmodels: [resnet50]\ndevices: [1, 2]\n"
                    "probes: [torch_allreduce]\n")
    proc = run_cli("--config", str(path), "--dry-run", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "1 runs" in proc.stdout
    assert "allreduce__torch_allreduce__resnet50__n2__r0" in proc.stdout


def test_precheck_of_a_probe_counts_gpus() -> None:
    spec = next(r for r in expand(validate({**PROBE, "device": "gpu", "devices": [4],
                                            "probes": ["torch_allreduce"]}), "s"))
    assert precheck(spec, visible_gpus=2) == ("unavailable", "needs 4 GPUs; NVML sees 2")
    assert precheck(spec, visible_gpus=4) is None


def test_until_stable_leaves_the_probe_runs_at_their_repeats(tmp_path: Path) -> None:
    """until_stable watches images/sec, which a probe has none of: its two ok records (None
    images/sec each) are neither a crash of the CV nor a reason for a third run."""
    from bench.run.sweep import RunContext, repeat_until_stable

    cfg = validate({**PROBE, "probes": ["torch_allreduce"], "repeats": 2,
                    "until_stable": {"target_cv": 0.01, "max_repeats": 5}})
    runs = expand(cfg, "s")
    (tmp_path / "runs").mkdir()
    for spec in runs:
        rec = {"run_id": spec.run_id, "repeat": spec.repeat, "mode": "allreduce",
               "status": "ok", "images_per_sec": None}
        (tmp_path / "runs" / f"{spec.run_id}.json").write_text(json.dumps(rec))
    repeat_until_stable(cfg.until_stable, runs, RunContext({}, CPU_ENV), tmp_path)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == sorted(
        f"{r.run_id}.json" for r in runs)


# --- the figures and the timed loop (contract/collectives.py) -----------------------------------

def test_bus_bandwidth_is_nccl_tests_factor_of_the_algorithm_bandwidth() -> None:
    size = allreduce.gradient_bytes("resnet50")
    assert size == 25_557_032 * 4
    f2, f8 = allreduce.figures(size, 0.1, 2), allreduce.figures(size, 0.1, 8)
    assert f2["algbw_gbps"] == pytest.approx(size / 0.1 / 1e9)
    assert f2["busbw_gbps"] == pytest.approx(f2["algbw_gbps"])  # 2(n-1)/n = 1 at n = 2
    assert f8["busbw_gbps"] == pytest.approx(1.75 * f8["algbw_gbps"])
    assert allreduce.probe_sizes("resnet50") == [2**20 * 2**k for k in range(7)] + [size]


def test_measure_size_times_as_nccl_tests_does() -> None:
    """check, warm-up, a sync, the barrier, then the timed calls and one sync; the per-call
    mean goes through across_ranks (the mean over the ranks)."""
    events: list[str] = []
    seen: list[float] = []

    def call() -> str:
        events.append("call")
        time.sleep(0.002)
        return "out"

    def across(seconds: float) -> float:
        seen.append(seconds)
        return seconds * 2  # what the ranks' mean would be: used as the row's time

    row = allreduce.measure_size(2**20, 2, call, lambda _: events.append("sync"), warmup=2,
                                 iters=3, around=allreduce.Around(
                                     check=lambda: events.append("check") is None,
                                     barrier=lambda: events.append("barrier"),
                                     across_ranks=across))
    assert events == ["check", "call", "call", "sync", "barrier", "call", "call", "call", "sync"]
    assert seen[0] >= 0.002 and row["time_s"] == pytest.approx(2 * seen[0])
    assert row["correct"] is True and (row["iters"], row["warmup"]) == (3, 2)
    assert row["busbw_gbps"] == pytest.approx(2**20 / row["time_s"] / 1e9)


# --- what the parent checks ------------------------------------------------------------------

def good_result(model: str = "minigooglenet", n: int = 2) -> dict[str, Any]:
    rows = []
    for i, size in enumerate(allreduce.probe_sizes(model)):
        t = 0.001 * (i + 1)
        rows.append({"bytes": size, "elements": size // 4, "iters": 5, "warmup": 2,
                     **allreduce.figures(size, t, n), "correct": True})
    evidence = {"replicas": n, "devices": [f"rank{i}:cpu" for i in range(n)],
                "source": "test"}
    return {"status": "ok", **allreduce.probe_result(rows, model, "test", evidence,
                                                      {"x": "1"}, window=(1.0, 2.0))}


def probe_spec(n: int = 2) -> Any:
    return run_spec(mode="allreduce", num_devices=n, runner="torch_allreduce",
                    model="minigooglenet", batch_size_per_device=0, global_batch_size=0)


def test_a_good_probe_result_passes() -> None:
    assert validate_result(good_result(), probe_spec()) == []


def _broken(change: str) -> dict[str, Any]:
    res = good_result()
    probe = res["allreduce"]
    if change == "wrong_sum":
        probe["sizes"][1]["correct"] = False
    elif change == "unchecked":
        probe["sizes"][0]["correct"] = None
    elif change == "one_replica":
        probe["evidence"]["replicas"] = 1
    elif change == "same_device":
        probe["evidence"]["devices"] = ["cpu", "cpu"]
    elif change == "no_evidence":
        del probe["evidence"]
    elif change == "missing_size":
        del probe["sizes"][0]
    elif change == "nan_busbw":
        probe["sizes"][2]["busbw_gbps"] = float("nan")
    elif change == "zero_time":
        probe["sizes"][2]["time_s"] = 0.0
    elif change == "factor_of_4_ranks":
        probe["sizes"][0].update(allreduce.figures(2**20, probe["sizes"][0]["time_s"], 4))
    elif change == "top_not_gradient_row":
        probe["busbw_gbps"] = probe["sizes"][0]["busbw_gbps"]
    elif change == "no_section":
        del res["allreduce"]
    return res


@pytest.mark.parametrize("change, words", [
    ("wrong_sum", "gave a wrong sum (correct=False)"),
    ("unchecked", "gave a wrong sum (correct=None)"),
    ("one_replica", "spanned 1 replicas, not the run's 2"),
    ("same_device", "are not 2 distinct devices"),
    ("no_evidence", "no evidence read back from the framework"),
    ("missing_size", "are not the probe's sizes for minigooglenet"),
    ("nan_busbw", "are not all positive finite numbers"),
    ("zero_time", "are not all positive finite numbers"),
    ("factor_of_4_ranks", "are not nccl-tests' for 1048576 bytes"),
    ("top_not_gradient_row", "is not the row at the gradient size"),
    ("no_section", "no allreduce section in the result"),
])
def test_a_probe_result_that_cannot_be_trusted_is_invalid(change: str, words: str,
                                                           tmp_path: Path) -> None:
    problems = validate_result(_broken(change), probe_spec())
    assert any(words in p for p in problems), problems
    # through the parent's classification of a finished child: invalid, with the reason
    path = tmp_path / "r.json"
    path.write_text(json.dumps(_broken(change), allow_nan=True))
    rec: dict[str, Any] = {"environment": {}, "python": "p"}
    status, reason = classify(0, path, tmp_path / "log", rec, probe_spec())
    assert status == "invalid" and words in reason


def test_replicas_are_checked_against_the_runs_device_count() -> None:
    # a 4-device run whose framework saw 2 replicas (and busbw for 2) is invalid
    problems = validate_result(good_result(n=2), probe_spec(n=4))
    assert any("spanned 2 replicas, not the run's 4" in p for p in problems)
    assert any("over 4 devices" in p for p in problems)


def test_ok_probe_record_is_well_formed_without_images_per_sec(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps(good_result()))
    rec: dict[str, Any] = {"environment": {}, "python": "p", "mode": "allreduce",
                           "status": "ok", "reason": None}
    assert classify(0, path, tmp_path / "log", rec, probe_spec()) == ("ok", None)
    rec["status"] = "ok"
    problems = check_record(rec)
    assert not any("images_per_sec" in p or "busbw" in p for p in problems), problems
    rec["result"]["allreduce"]["busbw_gbps"] = None
    assert "ok all-reduce record with busbw_gbps None" in check_record(rec)


# --- all-gather and reduce-scatter (issue 27) --------------------------------------------

def test_all_gather_and_reduce_scatter_use_nccl_tests_sizes_and_factor() -> None:
    # nccl-tests: per-rank count rounded down to 16 bytes, S = n x that; busbw = algbw (n-1)/n
    assert allreduce.collective_bytes(2**20, 3, "all_gather") == 87380 * 3 * 4
    assert allreduce.collective_bytes(2**20, 3, "all_reduce") == 2**20
    assert allreduce.collective_bytes(2**20, 2, "reduce_scatter") == 2**20
    f = allreduce.figures(2**20, 0.01, 8, "all_gather")
    assert f["busbw_gbps"] == pytest.approx(f["algbw_gbps"] * 7 / 8)
    assert allreduce.bus_factor(8, "reduce_scatter") * 2 == allreduce.bus_factor(8)
    with pytest.raises(ValueError, match="unknown collective"):
        allreduce.bus_factor(2, "broadcast")
    assert allreduce.expected_gather(3) == [1.0, 2.0, 3.0]


def collectives_result(n: int = 2, unavailable: str | None = "reduce_scatter"
                       ) -> dict[str, Any]:
    res = good_result(n=n)
    secs = {}
    for name in ("all_gather", "reduce_scatter"):
        if name == unavailable:
            secs[name] = allreduce.unavailable_section(name, "the framework has none")
            continue

        def one(nbytes: int, name: str = name) -> dict[str, Any]:
            return {"bytes": nbytes, "time_s": 0.002, "correct": True,
                    **allreduce.figures(nbytes, 0.002, n, name)}

        secs[name] = allreduce.measure_collective(name, "minigooglenet", n, one, f"x.{name}")
    res["collectives"] = secs
    return res


def test_collectives_pass_the_parents_check_and_bad_ones_do_not() -> None:
    res = collectives_result(unavailable=None)
    assert allreduce.check_collectives(res, 2, "minigooglenet") == []
    assert allreduce.check_collectives(good_result(), 2, "minigooglenet") == []  # pre-27 record
    # the all-reduce's factor on an all-gather row, a wrong gather, a reasonless refusal
    row = res["collectives"]["all_gather"]["sizes"][0]
    row.update(allreduce.figures(row["bytes"], row["time_s"], 2))
    res["collectives"]["reduce_scatter"]["sizes"][1]["correct"] = False
    problems = allreduce.check_collectives(res, 2, "minigooglenet")
    assert any("all_gather size" in p and "not nccl-tests'" in p for p in problems), problems
    assert any("reduce_scatter of" in p and "wrong data" in p for p in problems), problems
    assert allreduce.check_collectives({"collectives": {"reduce_scatter": {
        "status": "unavailable"}}}, 2, "minigooglenet") == \
        ["reduce_scatter is unavailable without a reason"]
    # 3 ranks: the sizes must be nccl-tests' S for 3
    assert any("not nccl-tests' S" in p
               for p in allreduce.check_collectives(res, 3, "minigooglenet"))


def test_a_framework_refusal_at_the_first_size_is_unavailable_with_its_message() -> None:
    def refuse(nbytes: int) -> dict[str, Any]:
        raise RuntimeError("ProcessGroupGloo does not support reduce_scatter\nmore")

    sec = allreduce.measure_collective("reduce_scatter", "minigooglenet", 2, refuse, "x")
    assert sec == {"collective": "reduce_scatter", "status": "unavailable",
                   "reason": "RuntimeError: ProcessGroupGloo does not support reduce_scatter"}


def test_summary_and_report_show_every_collective(tmp_path: Path) -> None:
    recs = [record(collectives_result()), record(good_result(), 1)]  # one from before 27
    rows = allreduce_report.summarise_allreduce(recs)
    by = {c: [r for r in rows if r["collective"] == c] for c in allreduce.COLLECTIVES}
    assert [r["bytes"] for r in by["all_reduce"]] == allreduce.probe_sizes("minigooglenet")
    assert [r["bytes"] for r in by["all_gather"]] == [
        allreduce.collective_bytes(s, 2, "all_gather")
        for s in allreduce.probe_sizes("minigooglenet")]
    assert by["all_gather"][-1]["gradient_size"] and by["all_gather"][0]["implementation"] == \
        "x.all_gather"
    assert [(r["status"], r["reason"]) for r in by["reduce_scatter"]] == [
        ("unavailable", "the framework has none")]
    text = allreduce_report.format_allreduce_table(rows, {"how": "no GPU in the capture"})
    assert "reduce_scatter minigooglenet n=2: the framework has none" in text
    assert "(n-1)/n for all_gather and reduce_scatter" in text
    html_text = allreduce_report.html_section(write_folder(tmp_path, CPU_ENV, "cpu"), recs)
    assert "all_gather" in html_text and "the framework has none" in html_text


# --- the summary and the report --------------------------------------------------------------

def record(result: dict[str, Any], repeat: int = 0, n: int = 2, status: str = "ok",
           probe: str = "torch_allreduce", device: str = "cpu") -> dict[str, Any]:
    return {"run_id": f"allreduce__{probe}__minigooglenet__n{n}__r{repeat}", "mode": "allreduce",
            "runner": probe, "family": PROBES[probe].family, "model": "minigooglenet",
            "device": device, "virtual_devices": device == "cpu", "num_devices": n,
            "status": status, "reason": None if status == "ok" else "it broke",
            "result": {k: v for k, v in result.items() if k != "status"}}


def scaled(factor: float) -> dict[str, Any]:
    """good_result with every time multiplied by factor (its figures recomputed)."""
    res = good_result()
    for row in res["allreduce"]["sizes"]:
        row.update(allreduce.figures(row["bytes"], row["time_s"] * factor, 2))
    return res


def test_summary_is_the_median_over_repeats_per_size() -> None:
    recs = [record(scaled(1.0), 0), record(scaled(2.0), 1), record(scaled(4.0), 2),
            record({}, 3, status="failed")]
    rows = allreduce_report.summarise_allreduce(recs)
    sizes = allreduce.probe_sizes("minigooglenet")
    assert [r["bytes"] for r in rows] == sizes
    top = rows[-1]
    assert top["gradient_size"] and [r["gradient_size"] for r in rows].count(True) == 1
    assert (top["runs_ok"], top["runs_total"]) == (3, 4)
    t1 = good_result()["allreduce"]["sizes"][-1]["time_s"]
    assert top["time_us"] == pytest.approx(2 * t1 * 1e6)  # the median of 1x, 2x, 4x
    assert top["busbw_gbps"] == pytest.approx(sizes[-1] / (2 * t1) / 1e9)
    assert top["busbw_gbps_max"] == pytest.approx(sizes[-1] / t1 / 1e9)
    # the benchmark summary leaves probe records out
    assert summarise(recs) == []


def test_a_probe_with_no_ok_run_is_one_row_with_its_reason() -> None:
    rows = allreduce_report.summarise_allreduce([record({}, status="failed")])
    assert len(rows) == 1 and rows[0]["bytes"] is None and rows[0]["status"] == "failed"
    text = allreduce_report.format_allreduce_table(rows, {"how": "no GPU in the capture"})
    assert "torch_allreduce all_reduce minigooglenet n=2: it broke" in text


def write_folder(tmp_path: Path, env: dict[str, Any], device: str) -> Path:
    runs = tmp_path / "runs"
    runs.mkdir(parents=True)
    (tmp_path / "environment.json").write_text(json.dumps(env))
    for rep, factor in enumerate((1.0, 1.5)):
        rec = record(scaled(factor), rep, device=device)
        (runs / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    return tmp_path


def test_report_on_cpu_says_no_nominal_link(tmp_path: Path) -> None:
    from bench.report.summary import build_report

    folder = write_folder(tmp_path, CPU_ENV, "cpu")
    rows, pipes, charts = build_report(folder)
    assert rows == [] and pipes == []
    assert [c.name for c in charts] == ["allreduce.png", "report.html", "results.md"]
    with open(folder / "allreduce.csv") as fh:
        table = list(csv.DictReader(fh))
    assert [int(r["bytes"]) for r in table] == allreduce.probe_sizes("minigooglenet")
    assert all(r["nominal_gbps"] == "" for r in table)
    text = allreduce_report.allreduce_table(folder)
    assert "nominal link: no GPU: nominal link n/a" in text
    page = (folder / "report.html").read_text()
    assert "<h2>All-reduce probe</h2>" in page and "no GPU: nominal link n/a" in page


def test_report_on_gpus_shows_busbw_beside_the_nominal_link(tmp_path: Path) -> None:
    folder = write_folder(tmp_path, GPU_ENV, "gpu")
    rows, link = allreduce_report.rows_and_link(folder, load_records(folder))
    assert link["nominal_gbps"] == 100.0 and link["link"] == "NVLink x4 (V100)"
    top = allreduce_report.at_gradient_size(rows)[0]
    assert top["busbw_of_nominal"] == pytest.approx(top["busbw_gbps"] / 100.0)
    text = allreduce_report.format_allreduce_table(rows, link)
    assert "nominal link: NVLink x4 (V100): 100 GB/s nominal" in text
    assert f"{top['busbw_of_nominal']:.0%}" in text.splitlines()[3]
    assert "virtual CPU devices" not in text
    chart = allreduce_report.render_allreduce_chart(folder, rows, link)
    assert chart is not None and chart.stat().st_size > 0


def test_cpu_probe_runs_on_a_gpu_box_get_no_nominal_link(tmp_path: Path) -> None:
    folder = write_folder(tmp_path, GPU_ENV, "cpu")  # device: cpu on a machine with NVLink
    rows, link = allreduce_report.rows_and_link(folder, load_records(folder))
    assert link["nominal_gbps"] is None and all(r["nominal_gbps"] is None for r in rows)
    assert "nominal link: no GPU: nominal link n/a" in allreduce_report.allreduce_table(folder)


# --- the torch probe for real ----------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.framework("torch")
def test_torch_probe_through_the_cli(tmp_path: Path, torch_python: str) -> None:
    out = tmp_path / "out"
    proc = run_cli("--config", "configs/allreduce-cpu.yaml", "--set", "probes=[torch_allreduce]",
                   "--set", "models=[minigooglenet]", "--set", "warmup_steps=1",
                   "--set", "measure_steps=2", "--out", str(out), timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [rec] = load_records(out)
    assert rec["status"] == "ok", rec["reason"]
    assert check_record(rec) == []
    assert rec["run_id"] == "allreduce__torch_allreduce__minigooglenet__n2__r0"
    assert re.search(r"-m torch\.distributed\.run --standalone --nnodes=1 --nproc-per-node=2 "
                     r"--tee=3 --log-dir=\S+ -m runners\.torch\.allreduce_probe",
                     Path(rec["log_path"]).read_text())
    probe = rec["result"]["allreduce"]
    assert probe["evidence"]["replicas"] == 2 and probe["evidence"]["backend"] == "gloo"
    assert probe["evidence"]["devices"] == ["rank0:cpu", "rank1:cpu"]
    assert [r["bytes"] for r in probe["sizes"]] == allreduce.probe_sizes("minigooglenet")
    assert all(r["correct"] is True and r["iters"] == 2 for r in probe["sizes"])
    assert math.isfinite(probe["busbw_gbps"]) and probe["busbw_gbps"] > 0
    assert probe["busbw_gbps"] == probe["sizes"][-1]["busbw_gbps"]
    assert rec["images_per_sec"] is None and rec.get("mfu") is None
    assert rec["window_end"] > rec["window_start"]
    # issue 27: all-gather and reduce-scatter beside it, over the same sizes, as nccl-tests
    # sizes them (S = n x the rank's 16-byte aligned part), each checked, busbw (n-1)/n
    sections = rec["result"]["collectives"]
    assert sorted(sections) == ["all_gather", "reduce_scatter"]
    assert allreduce.check_collectives(rec["result"], 2, "minigooglenet") == []
    for name, sec in sections.items():
        assert sec["status"] == "ok", sec
        assert sec["implementation"].startswith("torch.distributed.") and "(gloo)" in \
            sec["implementation"]
        assert [r["bytes"] for r in sec["sizes"]] == [
            allreduce.collective_bytes(s, 2, name)
            for s in allreduce.probe_sizes("minigooglenet")]
        assert all(r["correct"] is True for r in sec["sizes"])
        for r in sec["sizes"]:
            assert math.isclose(r["busbw_gbps"], r["algbw_gbps"] / 2)
    assert "All-reduce probe (mode: allreduce)" in proc.stdout
    assert "all_gather" in proc.stdout and "reduce_scatter" in proc.stdout
    assert "no GPU: nominal link n/a" in proc.stdout
    assert (out / "allreduce.csv").exists() and (out / "charts" / "allreduce.png").exists()
    assert "<h2>All-reduce probe</h2>" in (out / "report.html").read_text()

