"""The scaling predictor (bench/analysis/predict.py): its maths, `run_bench.py predict` on a
hand-written
results folder, and its validation against the published tables (tools/validate_predictor.py)
computed from reference/published.csv."""

from __future__ import annotations

import csv
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.analysis import interconnects
from bench.analysis.predict import (
    BACKWARD_FRACTION,
    BUCKET_BYTES,
    Bandwidth,
    buckets,
    communication,
    implied_busbw,
    parse_devices,
    predict,
    probe_bandwidth,
    probe_latency,
    ring_seconds,
)
from bench.analysis.published import load_published
from bench.cli import main
from contract.collectives import MIB, gradient_bytes
from tests.helpers.cli import REPO
from tests.helpers.records import gpu_record, probe_record, write_folder
from tools import validate_predictor

RESNET = gradient_bytes("resnet50")


# -- the maths -------------------------------------------------------------------------------

def test_ring_term_moves_2_n_minus_1_over_n_of_the_bytes_through_each_link() -> None:
    # 1 GB at 1 GB/s: 2 devices move 1 x, 4 devices 1.5 x, 8 devices 1.75 x the buffer
    assert ring_seconds(1e9, 2, 1.0) == pytest.approx(1.0)
    assert ring_seconds(1e9, 4, 1.0) == pytest.approx(1.5)
    assert ring_seconds(1e9, 8, 2.0) == pytest.approx(0.875)
    assert ring_seconds(1e9, 1, 1.0) == 0.0


def test_latency_term_is_2_n_minus_1_steps_per_message() -> None:
    assert ring_seconds(0, 4, 1.0, latency_s=1e-3, messages=3) == pytest.approx(2 * 3 * 3e-3)
    assert ring_seconds(1e9, 4, 1.0, latency_s=1e-3) == pytest.approx(1.5 + 6e-3)


def test_gradients_go_in_full_buckets_then_the_rest() -> None:
    assert buckets(60 * MIB, 25 * MIB) == [25 * MIB, 25 * MIB, 10 * MIB]
    assert buckets(50 * MIB, 25 * MIB) == [25 * MIB, 25 * MIB]
    assert len(buckets(RESNET)) == math.ceil(RESNET / BUCKET_BYTES) == 4


def test_no_overlap_adds_the_whole_all_reduce_to_the_step() -> None:
    bw = Bandwidth(10.0, 0.0, "test")
    p = predict(0.3, 64, "weak", 4, RESNET, bw)
    comm = 1.5 * RESNET / 10e9
    assert p.comm_s == pytest.approx(comm)
    assert p.step_s_no_overlap == pytest.approx(0.3 + comm)
    assert p.images_per_sec_no_overlap == pytest.approx(4 * 64 / (0.3 + comm))
    assert p.efficiency_no_overlap == pytest.approx(0.3 / (0.3 + comm))


def test_overlap_hides_the_all_reduce_behind_the_backward_pass_but_the_last_bucket() -> None:
    # a fast link: everything but the last bucket hides in the backward pass
    fast = predict(0.3, 64, "weak", 4, RESNET, Bandwidth(10.0, 0.0, "fast"))
    last = 1.5 * buckets(RESNET)[-1] / 10e9
    assert fast.last_bucket_s == pytest.approx(last)
    assert fast.step_s_overlap == pytest.approx(0.3 + last)
    # a slow link: the all-reduce outlasts the backward pass (2/3 of the step)
    slow = predict(0.3, 64, "weak", 4, RESNET, Bandwidth(0.1, 0.0, "slow"))
    assert pytest.approx(2 / 3) == BACKWARD_FRACTION
    assert slow.overlap_window_s == pytest.approx(0.2)
    assert slow.step_s_overlap == pytest.approx(0.3 + slow.comm_s - 0.2)
    assert slow.efficiency_overlap > slow.efficiency_no_overlap


def test_strong_scaling_splits_the_compute_and_keeps_the_images_per_step() -> None:
    p = predict(0.4, 32, "strong", 4, RESNET, Bandwidth(10.0, 0.0, "test"))
    assert p.compute_s == pytest.approx(0.1)
    assert p.images_per_sec_no_overlap == pytest.approx(32 / (0.1 + p.comm_s))
    assert p.efficiency_no_overlap == pytest.approx(0.4 / (4 * (0.1 + p.comm_s)))


def test_one_device_is_the_measured_step() -> None:
    p = predict(0.3, 64, "weak", 1, RESNET, Bandwidth(1.0, 1e-3, "test"))
    assert p.step_s_no_overlap == p.step_s_overlap == 0.3
    assert p.efficiency_no_overlap == p.efficiency_overlap == pytest.approx(1.0)


def test_implied_busbw_reproduces_the_images_per_sec_it_was_solved_from() -> None:
    bw = Bandwidth(3.7, 10e-6, "test")
    p = predict(0.25, 32, "weak", 6, RESNET, bw)
    assert implied_busbw(0.25, 32, "weak", 6, RESNET, p.images_per_sec_no_overlap,
                         10e-6) == pytest.approx(3.7)
    # faster than linear leaves no communication time to explain
    assert implied_busbw(0.25, 32, "weak", 2, RESNET, 2 * 32 / 0.25 * 1.01) is None


def test_probe_latency_is_the_intercept_of_time_against_size_per_ring_step() -> None:
    sizes = [{"bytes": b, "time_s": 4e-4 + b / 5e9} for b in (MIB, 8 * MIB, 64 * MIB)]
    assert probe_latency(sizes, 3) == pytest.approx(4e-4 / 4)


def test_probe_of_the_runners_family_is_taken_else_the_fastest() -> None:
    probes = [probe_record("torch_allreduce", "torch", 2, 3.0),
              probe_record("tf_allreduce", "tf", 2, 9.0)]
    mine = probe_bandwidth(probes, "torch_ddp", "gpu", 2, RESNET)
    assert mine and mine.busbw_gbps == 3.0 and "torch_allreduce" in mine.source
    other = probe_bandwidth(probes, "mxnet_native", "gpu", 2, RESNET)
    assert other and other.busbw_gbps == 9.0 and "the fastest" in other.source
    assert probe_bandwidth(probes, "torch_ddp", "cpu", 2, RESNET) is None  # other devices


def test_probe_at_the_device_count_else_the_nearest() -> None:
    probes = [probe_record("torch_allreduce", "torch", 2, 3.0),
              probe_record("torch_allreduce", "torch", 4, 5.0)]
    assert probe_bandwidth(probes, "torch_ddp", "gpu", 2, RESNET).busbw_gbps == 3.0
    eight = probe_bandwidth(probes, "torch_ddp", "gpu", 8, RESNET)
    assert eight.busbw_gbps == 5.0 and "at 4 devices, used for 8" in eight.source


def test_devices_parse_and_refuse_what_is_not_a_count() -> None:
    from bench.plan.config import ConfigError

    assert parse_devices("8,2,4") == [2, 4, 8]
    for bad in ("2,x", "0", "-2", "", "2,,4", "2,2", "1.5"):
        with pytest.raises(ConfigError, match="devices"):
            parse_devices(bad)


def test_any_pcie_link_is_named_by_generation_and_width() -> None:
    riser = interconnects.get("pcie3-x1")
    assert riser.busbw_gbps == pytest.approx(0.985)
    assert interconnects.get("pcie4-x8").busbw_gbps == pytest.approx(1.969 * 8)
    with pytest.raises(KeyError, match="pcie<gen>-x<width>"):
        interconnects.get("pcie3-x3")


# -- a hand-written results folder -----------------------------------------------------------

def predict_cli(*args: str) -> int:
    return main(["predict", *map(str, args)])


def test_predict_prints_2_4_8_and_writes_csv_and_chart(tmp_path: Path, capsys) -> None:
    folder = write_folder(tmp_path / "r", [gpu_record(1, 200.0), gpu_record(2, 380.0)])
    assert predict_cli(folder, "--devices", "2,4,8", "--busbw", "10") == 0
    out = capsys.readouterr().out
    t1 = 64 / 200.0
    expect = {n: predict(t1, 64, "weak", n, RESNET, Bandwidth(10.0, 0.0, "x"))
              for n in (2, 4, 8)}
    lines = {int(line.split()[0]): line for line in out.splitlines()
             if line.strip() and line.split()[0] in ("2", "4", "8")}
    assert sorted(lines) == [2, 4, 8]
    for n, p in expect.items():
        assert f"{p.efficiency_no_overlap:.0%}" in lines[n]
        assert f"{p.efficiency_overlap:.0%}" in lines[n]
    rows = list(csv.DictReader((folder / "predict.csv").open()))
    assert [int(r["num_devices"]) for r in rows] == [2, 4, 8]
    for r in rows:
        p = expect[int(r["num_devices"])]
        assert float(r["efficiency_no_overlap"]) == pytest.approx(p.efficiency_no_overlap,
                                                                  abs=1e-6)
        assert float(r["step_s_overlap"]) == pytest.approx(p.step_s_overlap, abs=1e-6)
        assert float(r["t1_s"]) == pytest.approx(t1, abs=1e-6)
    # the measured 2-device point sits beside its prediction
    assert float(rows[0]["measured_efficiency"]) == pytest.approx(380 / 400)
    assert rows[1]["measured_efficiency"] == ""
    assert (folder / "charts" / "predict.png").stat().st_size > 0


def test_one_device_step_is_the_median_over_repeats(tmp_path: Path, capsys) -> None:
    folder = write_folder(tmp_path / "r", [
        gpu_record(1, 100.0, run_id="a"), gpu_record(1, 200.0, run_id="b"),
        gpu_record(1, 400.0, run_id="c")])
    assert predict_cli(folder, "--devices", "2", "--busbw", "10") == 0
    row = next(csv.DictReader((folder / "predict.csv").open()))
    assert float(row["t1_s"]) == pytest.approx(64 / 200.0)
    assert row["t1_runs"] == "3"


def test_the_folders_probe_is_the_default_bandwidth(tmp_path: Path, capsys) -> None:
    folder = write_folder(tmp_path / "r", [gpu_record(1, 200.0),
                                           probe_record("torch_allreduce", "torch", 2, 4.0)])
    assert predict_cli(folder, "--devices", "2,4") == 0
    out = capsys.readouterr().out
    assert "probe torch_allreduce at 2 devices" in out
    assert "at 2 devices, used for 4" in out
    rows = list(csv.DictReader((folder / "predict.csv").open()))
    assert {float(r["busbw_gbps"]) for r in rows} == {4.0}


def test_a_named_interconnect_gives_its_nominal_figure_and_latency(tmp_path: Path,
                                                                   capsys) -> None:
    folder = write_folder(tmp_path / "r", [gpu_record(1, 200.0)])
    assert predict_cli(folder, "--devices", "8", "--interconnect", "nvlink-v100") == 0
    row = next(csv.DictReader((folder / "predict.csv").open()))
    ic = interconnects.get("nvlink-v100")
    assert float(row["busbw_gbps"]) == ic.busbw_gbps
    assert float(row["latency_s"]) == pytest.approx(ic.latency_s)
    assert float(row["comm_s"]) == pytest.approx(
        ring_seconds(RESNET, 8, ic.busbw_gbps, ic.latency_s, 4), abs=1e-6)


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize(("args", "says"), [
    (("--devices", "2,x", "--busbw", "10"), "devices: 'x'"),
    (("--devices", "0,2", "--busbw", "10"), "devices: '0'"),
    (("--devices", "2", "--interconnect", "warp-drive"), "interconnect: 'warp-drive'"),
    (("--devices", "2", "--busbw", "-3"), "busbw: -3"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys, args: tuple[str, ...],
                                          says: str) -> None:
    folder = write_folder(tmp_path / "r", [gpu_record(1, 200.0)])
    assert predict_cli(folder, *args) == 2
    err = _error(capsys)
    assert says in err
    if "interconnect: " in says:
        assert "nvlink-v100" in err and "pcie<gen>-x<width>" in err
    if "--busbw GB/s" in says:
        assert "mode: allreduce" in err


def test_without_any_bandwidth_source_it_predicts_on_a_stated_assumption(tmp_path: Path,
                                                                         capsys) -> None:
    """No --busbw, --interconnect, probe or GPU link: still efficiencies for 2, 4 and 8
    devices, each row and the notes saying the link was assumed (PCIe 4.0 x16)."""
    folder = write_folder(tmp_path / "r", [gpu_record(1, 200.0)])
    assert predict_cli(folder) == 0
    out = capsys.readouterr().out
    assert "ASSUMED pcie4" in out and "mode: allreduce" in out
    rows = list(csv.DictReader((folder / "predict.csv").open()))
    assert [int(r["num_devices"]) for r in rows] == [2, 4, 8]
    assert all(r["bandwidth_source"].startswith("assumed pcie4") for r in rows)
    assert float(rows[0]["busbw_gbps"]) == interconnects.get("pcie4").busbw_gbps


def test_a_folder_without_an_ok_one_device_run_is_one_line_and_exit_2(tmp_path: Path,
                                                                        capsys) -> None:
    folder = write_folder(tmp_path / "r", [gpu_record(1, None), gpu_record(2, 380.0)])
    assert predict_cli(folder, "--busbw", "10") == 2
    assert "no ok 1-device benchmark run" in _error(capsys)


def test_the_command_line_exits_2_with_one_line(tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "r", [gpu_record(2, 380.0)])
    proc = subprocess.run([sys.executable, str(REPO / "run_bench.py"), "predict", str(folder),
                           "--devices", "2,4,8", "--busbw", "10"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: results_dir:")
    assert len(proc.stderr.strip().splitlines()) == 1


# -- validation against the published tables -------------------------------------------------

@pytest.fixture(scope="module")
def published() -> list[dict[str, Any]]:
    return load_published()


def _point(results: list[dict[str, Any]], series: str, gpus: int) -> dict[str, Any]:
    return next(r for r in results if r["series"] == series and r["gpus"] == gpus)


def test_dgx1_resnet50_at_8_gpus_is_predicted_within_5_points(published) -> None:
    results = validate_predictor.validate(published)
    point = _point(results, "tf-docs P100 b64 synthetic", 8)
    one = next(r for r in published if r["series"] == "tf-docs P100 b64 synthetic"
               and r["gpus"] == 1)
    eight = next(r for r in published if r["series"] == "tf-docs P100 b64 synthetic"
                 and r["gpus"] == 8)
    # the inputs are the table's: T_1 from its 1-GPU row, efficiency from its 8-GPU row
    assert point["t1_s"] == pytest.approx(64 / one["images_per_sec"])
    assert point["published_efficiency"] == pytest.approx(
        eight["images_per_sec"] / (8 * one["images_per_sec"]))
    assert point["link"] == "pcie3"  # ps=cpu: the gradients cross PCIe to the host
    assert abs(point["miss_no_overlap_pp"]) <= validate_predictor.TARGET_PP
    assert abs(point["miss_overlap_pp"]) <= validate_predictor.TARGET_PP


def test_the_table_is_generated_from_the_data_not_pasted(published) -> None:
    changed = [dict(r) for r in published]
    eight = next(r for r in changed if r["series"] == "tf-docs P100 b64 synthetic"
                 and r["gpus"] == 8)
    eight["images_per_sec"] = 1000.0
    before = validate_predictor.markdown(validate_predictor.validate(published))
    after = validate_predictor.markdown(validate_predictor.validate(changed))
    point = _point(validate_predictor.validate(changed), "tf-docs P100 b64 synthetic", 8)
    assert point["published_efficiency"] == pytest.approx(1000.0 / (8 * 219))
    assert "| 1000 | 57.1% |" in after and "| 1000 | 57.1% |" not in before
    assert "neither" in after.split("| 1000 | 57.1% |")[1].splitlines()[0]


def test_every_published_point_of_the_validated_tables_is_in_the_table(published) -> None:
    results = validate_predictor.validate(published)
    wanted = [r for r in published if r["source_short"] in validate_predictor.SOURCES
              and r["gpus"] and r["gpus"] >= 2 and r["images_per_sec"]]
    assert len(results) == len(wanted) > 20
    assert {r["hardware"] for r in results} == {r["hardware"] for r in wanted}


def test_implied_bus_bandwidth_reproduces_each_published_point(published) -> None:
    points = [r for r in validate_predictor.validate(published)
              if r["implied_busbw_gbps"] is not None]
    assert len(points) > 20, points
    for r in points:
        again = predict(r["t1_s"], r["batch"], r["scaling"], r["gpus"], r["gradient_bytes"],
                        Bandwidth(r["implied_busbw_gbps"], r["latency_s"], "implied"))
        assert again.efficiency_no_overlap == pytest.approx(r["published_efficiency"])


def test_the_tool_prints_the_markdown_table() -> None:
    proc = subprocess.run([sys.executable, "-m", "tools.validate_predictor"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "| tf-docs P100 b64 synthetic |" in proc.stdout
    assert "Within 5 percentage points" in proc.stdout


def test_a_probes_figure_is_not_charged_its_latency_twice() -> None:
    # at the probe's own device count, one message of the gradient size takes the time the
    # probe measured for it, fixed cost and all
    probe = probe_record("torch_allreduce", "torch", 4, 2.0, fixed_s=1e-3)
    bw = probe_bandwidth([probe], "torch_ddp", "gpu", 4, RESNET)
    assert bw.latency_s == pytest.approx(1e-3 / 6) and bw.latency_included == 1
    measured = next(s["time_s"] for s in probe["result"]["allreduce"]["sizes"]
                    if s["bytes"] == RESNET)
    assert communication(RESNET, 4, bw, bucket_bytes=RESNET)[0] == pytest.approx(measured)
    # in 4 buckets, the 3 messages more pay the latency
    assert communication(RESNET, 4, bw)[0] == pytest.approx(measured + 3 * 6 * bw.latency_s)


# -- each strategy's communication (bench/analysis/strategies.py, predict --strategies) --------

def _collective_probe(runner: str, family: str, n: int, busbw: dict[str, float]
                      ) -> dict[str, Any]:
    """A probe record with the all-reduce at busbw["all_reduce"] and, for each other
    collective in busbw, a measured section at that busbw (nccl-tests' figures)."""
    from contract.collectives import collective_bytes, figures

    rec = probe_record(runner, family, n, busbw["all_reduce"])
    rec["result"]["collectives"] = {}
    for name in ("all_gather", "reduce_scatter"):
        if name not in busbw:
            rec["result"]["collectives"][name] = {"status": "unavailable", "reason": "none"}
            continue
        rows = []
        for b in (MIB, 16 * MIB, RESNET):
            s = collective_bytes(b, n, name)
            t = s * (n - 1) / n / (busbw[name] * 1e9)
            rows.append({"bytes": s, "correct": True, **figures(s, t, n, name)})
        rec["result"]["collectives"][name] = {"status": "ok", "sizes": rows}
    return rec


def test_each_strategys_volume_is_the_papers() -> None:
    from bench.analysis import strategies as st

    p, n = 1_000_000, 8
    psi = {r["strategy"]: r["psi"] for r in st.rank(p, n, {"all_reduce": 1.0})}
    # DDP and its kin: 2 Psi; ZeRO-1/2 (reduce-scatter + all-gather) the same (ZeRO sec. 7.2.1);
    # ZeRO-3 / FSDP FULL_SHARD 3 Psi (sec. 7.2.2); FSDP2 without re-sharding 2 Psi
    for key in ("torch_ddp", "horovod", "tf_mirrored", "jax_native", "keras_jax",
                "deepspeed[stage=1]", "deepspeed[stage=2]",
                "torch_fsdp2[reshard_after_forward=false]"):
        assert psi[key] == pytest.approx(2.0), key
    for key in ("deepspeed[stage=3]", "torch_fsdp2[reshard_after_forward=true]", "jax_fsdp",
                "keras_model_parallel", "torch_zero1"):
        assert psi[key] == pytest.approx(3.0), key
    fsdp = st.strategy("torch_fsdp2", {"reshard_after_forward": True})
    phases = st.volume(fsdp, p, n)
    assert [(ph["collective"], ph["moves"], ph["when"]) for ph in phases] == [
        ("all_gather", "parameters", "forward"), ("all_gather", "parameters", "backward"),
        ("reduce_scatter", "gradients", "backward")]
    assert phases[0]["link_bytes"] == pytest.approx(4e6 * 7 / 8)
    # bf16 parameters gathered: the all-gathers move half the bytes
    half = st.communication(fsdp, p, n, {"all_reduce": 1.0}, gather_dtype="bfloat16")
    assert half["psi"] == pytest.approx(2.0)
    assert st.strategy("deepspeed", {"stage": 3}).key == "deepspeed[stage=3]"
    assert st.strategy("keras_model_parallel").assumption
    assert st.strategy("no_such_runner") is None


def test_the_strategies_are_the_catalogs_and_their_modules_name_no_runner() -> None:
    """Every runner whose catalog entry declares `collectives` is priced, one strategy per
    value of the option deciding them, on a probe the registry knows; a new entry joins the
    forecast with no line in bench/; the strategy modules name no runner, pipeline or probe."""
    import re

    from bench.analysis import strategies as st
    from bench.catalog.registry import PIPELINES, PROBES, RUNNERS
    from contract.catalog import RunnerInfo
    from contract.communication import DATA_PARALLEL, ZERO_3

    declaring = [i for i in RUNNERS.values() if i.collectives is not None]
    assert len(declaring) >= 10
    for info in declaring:
        assert info.probe in PROBES, info.name
        mine = [s for s in st.STRATEGIES if s.runner == info.name]
        if isinstance(info.collectives, dict):
            option = info.options[info.collectives["option"]]
            assert set(info.collectives["values"]) == set(option.allowed or (True, False))
            assert len(mine) == len(info.collectives["values"]), info.name
        else:
            assert len(mine) == 1, info.name
    toy = {"toy_zero3": RunnerInfo("toy_zero3", "torch", "x", "", collectives=ZERO_3,
                                   shards=("params", "grads", "optimizer")),
           "toy_dp": RunnerInfo("toy_dp", "torch", "x", "", collectives=DATA_PARALLEL)}
    assert [s.key for s in st.declared(toy)] == ["toy_dp", "toy_zero3"]  # least sharded first
    names = {*RUNNERS, *PROBES, *PIPELINES}
    for module in ("bench/analysis/strategies.py", "bench/report/strategies.py"):
        text = (REPO / module).read_text()
        named = sorted(n for n in names if re.search(rf"\b{re.escape(n)}\b", text))
        assert not named, f"{module} names {named}: declare it in the runner's catalog entry"


def test_the_winner_follows_the_measured_links() -> None:
    from bench.analysis import strategies as st

    p = 10_000_000
    # all-gather and reduce-scatter as fast as the all-reduce: ZeRO-2-like ties DDP, ZeRO-3 loses
    even = st.rank(p, 4, {"all_reduce": 10.0, "all_gather": 10.0, "reduce_scatter": 10.0})
    winners = {r["strategy"] for r in even if r["wins"]}
    assert "torch_ddp" in winners and "deepspeed[stage=2]" in winners
    assert "deepspeed[stage=3]" not in winners
    # a slow all-reduce (this backend's all-reduce at a third of its all-gather's busbw)
    slow_ar = st.rank(p, 4, {"all_reduce": 1.0, "all_gather": 10.0, "reduce_scatter": 10.0})
    assert slow_ar[0]["wins"] and slow_ar[0]["strategy"] in (
        "deepspeed[stage=1]", "deepspeed[stage=2]", "torch_fsdp2[reshard_after_forward=false]")
    zero3 = next(r for r in slow_ar if r["strategy"] == "deepspeed[stage=3]")
    ddp = next(r for r in slow_ar if r["strategy"] == "torch_ddp")
    assert zero3["seconds"] < ddp["seconds"]  # 3 Psi at 10 GB/s beats 2 Psi at 1 GB/s
    assert ddp["seconds"] == pytest.approx(2 * 3 / 4 * 4e7 / 1e9)


def test_jax_strategies_are_priced_on_the_jax_probe_where_the_folder_has_it() -> None:
    from bench.analysis import strategies as st

    probes = [_collective_probe("torch_allreduce", "torch", 2,
                                {"all_reduce": 9.0, "all_gather": 9.0, "reduce_scatter": 9.0}),
              _collective_probe("jax_allreduce", "jax", 2,
                                {"all_reduce": 3.0, "all_gather": 2.0, "reduce_scatter": 1.5})]
    rows = {r["strategy"]: r for r in st.forecast(probes, 25_557_032, [2])}
    for key in ("jax_native", "keras_jax", "jax_fsdp", "keras_model_parallel"):
        row = rows[key]
        got = {ph["collective"]: ph["busbw_gbps"] for ph in row["phases"]}
        want = {"all_reduce": 3.0, "all_gather": 2.0, "reduce_scatter": 1.5}
        assert got == pytest.approx({k: want[k] for k in got}), key
        assert "jax_allreduce" in row["bandwidth"] and "torch_allreduce" not in row["bandwidth"]
        assert not any("fastest" in note for note in row["notes"]), row["notes"]
    assert {ph["collective"] for ph in rows["jax_fsdp"]["phases"]} == {"all_gather",
                                                                       "reduce_scatter"}
    assert rows["torch_ddp"]["phases"][0]["busbw_gbps"] == pytest.approx(9.0)  # torch's own
    # a jax probe without a reduce-scatter: that collective from the fastest probe, said so
    probes[1]["result"]["collectives"]["reduce_scatter"] = {"status": "unavailable",
                                                            "reason": "none"}
    fsdp = next(r for r in st.forecast(probes, 25_557_032, [2]) if r["strategy"] == "jax_fsdp")
    by = {ph["collective"]: ph["busbw_gbps"] for ph in fsdp["phases"]}
    assert by == pytest.approx({"all_gather": 2.0, "reduce_scatter": 9.0})
    assert any("jax_allreduce gave no figure" in note for note in fsdp["notes"])


def test_predict_strategies_prices_each_on_its_frameworks_probe(tmp_path: Path,
                                                               capsys) -> None:
    from bench.analysis import strategies as st

    probes = [_collective_probe("torch_allreduce", "torch", 2,
                                {"all_reduce": 4.0, "all_gather": 8.0, "reduce_scatter": 8.0}),
              _collective_probe("tf_allreduce", "tf", 2, {"all_reduce": 2.0, "all_gather": 1.0})]
    p = 25_557_032  # resnet50
    rows = {r["strategy"]: r for r in st.forecast(probes, p, [2])}
    assert "torch_allreduce" in rows["torch_fsdp2[reshard_after_forward=true]"]["bandwidth"]
    assert rows["tf_mirrored"]["phases"][0]["busbw_gbps"] == pytest.approx(2.0)
    assert rows["torch_ddp"]["phases"][0]["busbw_gbps"] == pytest.approx(4.0)
    # no JAX probe in this folder: the fastest measured, said so
    assert any("no jax_allreduce probe" in note and "fastest" in note
               for note in rows["jax_fsdp"]["notes"])
    assert rows["deepspeed[stage=2]"]["wins"] and not rows["torch_ddp"]["wins"]
    folder = write_folder(tmp_path / "r", probes)
    assert predict_cli(folder, "--strategies", "--devices", "2,8") == 0
    out = capsys.readouterr().out
    assert "should win at 2 devices: deepspeed[stage=1], deepspeed[stage=2]" in out
    assert "compute overlap is not modelled" in out and "resnet50, 25,557,032" in out
    assert "Rajbhandari" in out
    assert predict_cli(folder, "--strategies", "--precision", "fp8") == 2
    assert "precision: 'fp8' is not allowed" in capsys.readouterr().err
