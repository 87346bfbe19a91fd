"""The dry run's forecast (bench/run/forecast.py): each planned run's predicted status from
injected host facts (GPU count, environments, earlier records), never this host's."""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench import REPO_ROOT
from bench import cli as bench_cli
from bench.plan.config import load_config
from bench.plan.runs import RunSpec, expand
from bench.run import envs, forecast
from bench.run.forecast import (
    DEPENDS,
    INVALID,
    UNAVAILABLE,
    WILL_RUN,
    EnvState,
    HostFacts,
    env_state,
    estimate,
    predict,
    run_numbers,
    summary_lines,
)

HOST = "testhost"  # the host the facts describe (never this machine's name)
GOLDEN_RECORD = next(p for p in sorted(
    (REPO_ROOT / "tests" / "golden" / "converge-results" / "runs").glob("*.json"))
    if "tf_mirrored" in p.name)


def ready(family: str, variant: str) -> EnvState:
    return EnvState(f"{family}-{variant}", ready=True)


def to_build(family: str, variant: str) -> EnvState:
    return EnvState(f"{family}-{variant}", how=f"from envs/{family}-{variant}.lock")


def facts(gpus: int = 0, state: Any = ready, roots: tuple[Path, ...] = ()) -> HostFacts:
    return HostFacts(HOST, gpus, state, roots)


def plan(config: str, *sets: str) -> tuple[Any, list[RunSpec]]:
    cfg = load_config(str(REPO_ROOT / "configs" / config), list(sets))
    return cfg, expand(cfg, "s")


def counts(line: str) -> dict[str, int]:
    """`predicted: 2 will run, 3 unavailable (of 5 runs; ...)` as {status: count}."""
    head = line.removeprefix("predicted: ").split(" (of ")[0]
    return {m.group(2): int(m.group(1)) for m in
            (re.match(r"(\d+) (.+)", part) for part in head.split(", ")) if m}


def count_line(lines: list[str]) -> str:
    return next(ln for ln in lines if ln.startswith("predicted: "))


# ---- statuses ----

def test_dgx1_without_gpus_names_the_gpu_count_of_every_gpu_run_and_counts_add_up() -> None:
    cfg, runs = plan("dgx1.yaml")
    predicted = predict(runs, cfg, facts(gpus=0))
    for spec, p in zip(runs, predicted, strict=True):
        assert p.status == UNAVAILABLE, spec.run_id
        if spec.runner != "keras_cntk":
            assert p.reason == (f"needs {spec.num_devices} GPUs; NVML sees 0 (no GPU on this "
                                "machine)"), spec.run_id
    lines = summary_lines(runs, predicted, cfg, facts(gpus=0))
    found = counts(count_line(lines))
    assert found == {WILL_RUN: 0, UNAVAILABLE: len(runs)}
    assert sum(found.values()) == len(runs)
    assert "estimated: nothing will run" in lines
    gpu_lines = [ln for ln in lines if "NVML sees 0" in ln and ln.startswith("  ")]
    assert len(gpu_lines) == 1 and "needs 1, 2, 4 or 8 GPUs; NVML sees 0" in gpu_lines[0]


def test_dgx1_with_two_gpus_runs_what_fits_and_counts_per_status_sum_to_the_plan(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TF_CNN_BENCHMARKS_DIR", raising=False)
    cfg, runs = plan("dgx1.yaml")
    predicted = predict(runs, cfg, facts(gpus=2))
    for spec, p in zip(runs, predicted, strict=True):
        if spec.runner == "keras_cntk":
            assert p.status == UNAVAILABLE
        elif spec.runner == "tf_cnn_benchmarks" and spec.num_devices <= 2:
            assert p.status == UNAVAILABLE and p.reason.startswith(
                "no tensorflow/benchmarks checkout"), p
        elif spec.num_devices > 2:
            assert (p.status, p.reason) == (UNAVAILABLE, f"needs {spec.num_devices} GPUs; "
                                                         "NVML sees 2")
        else:
            assert p == forecast.Prediction(WILL_RUN), spec.run_id
    found = counts(count_line(summary_lines(runs, predicted, cfg, facts(gpus=2))))
    assert sum(found.values()) == len(runs)
    assert found[WILL_RUN] == sum(p.status == WILL_RUN for p in predicted) > 0


def test_a_cpu_config_will_run_and_names_the_environments_to_build() -> None:
    cfg, runs = plan("cpu-smoke.yaml")
    predicted = predict(runs, cfg, facts(gpus=0, state=to_build))
    assert [p.status for p in predicted] == [WILL_RUN] * len(runs)
    lines = summary_lines(runs, predicted, cfg, facts(gpus=0, state=to_build))
    assert counts(count_line(lines)) == {WILL_RUN: len(runs)}
    assert "environments to build first (on first use, minutes each): tf-cpu" in lines
    assert "  tf-cpu: from envs/tf-cpu.lock" in lines
    assert not any(ln.startswith("why") for ln in lines)  # nothing blocked, nothing to explain
    built = summary_lines(runs, predict(runs, cfg, facts()), cfg, facts())
    assert not any(ln.startswith("environments to build") for ln in built)


def test_the_cntk_reason_is_said_once_with_its_run_numbers() -> None:
    cfg, runs = plan("dgx1.yaml")
    lines = summary_lines(runs, predict(runs, cfg, facts(gpus=8)), cfg, facts(gpus=8))
    cntk = [ln for ln in lines if "CNTK" in ln]
    numbers = [i for i, r in enumerate(runs, 1) if r.runner == "keras_cntk"]
    assert len(cntk) == 1
    assert cntk[0].startswith(f"  unavailable ({len(numbers)} runs: {run_numbers(numbers)}): "
                              "CNTK 2.7 ships wheels only for Python 2.7, 3.5 and 3.6")
    assert len(lines) < 12  # 360 runs, a handful of lines


def test_run_numbers_compress_to_ranges() -> None:
    assert run_numbers([3, 1, 2, 8, 17, 18, 20]) == "#1-#3, #8, #17-#18, #20"
    assert run_numbers(list(range(1, 40, 2)), most=3) == "#1, #3, #5, ..."


def test_a_slurm_sweep_depends_on_the_cluster_whatever_this_host_has() -> None:
    cfg, runs = plan("slurm-smoke.yaml")
    for gpus in (0, 8):
        predicted = predict(runs, cfg, facts(gpus=gpus))
        assert {p.status for p in predicted} <= {DEPENDS, INVALID, UNAVAILABLE}
        assert any(p.status == DEPENDS for p in predicted)
        lines = summary_lines(runs, predicted, cfg, facts(gpus=gpus))
        assert "estimated: none here (the runs' time is the cluster nodes')" in lines
        assert sum(counts(count_line(lines)).values()) == len(runs)


def test_a_gpu_slurm_sweep_is_not_refused_for_this_hosts_missing_gpus() -> None:
    cfg, runs = plan("dgx1.yaml", "cluster.backend=slurm", "runners=[torch_ddp]")
    assert {p.status for p in predict(runs, cfg, facts(gpus=0))} == {DEPENDS}


def test_an_environment_that_cannot_be_used_makes_its_runs_unavailable() -> None:
    cfg, runs = plan("cpu-smoke.yaml")
    broken = EnvState("tf-cpu", problem="envs/horovod_build.py failed (exit 1): no compiler")
    predicted = predict(runs, cfg, facts(state=lambda f, v: broken))
    assert {(p.status, p.reason) for p in predicted} == {
        (UNAVAILABLE, "tf environment: envs/horovod_build.py failed (exit 1): no compiler")}


# ---- the environments, as bench/run/envs.py keeps them ----

def test_env_state_reads_the_cache_and_the_lock(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MGBENCH_ENV_DIR", str(tmp_path))
    fresh = env_state("tf", "cpu", machine="x86_64", glibc="2.36")
    assert not fresh.ready and fresh.problem is None and fresh.how.startswith(
        "from envs/tf-cpu.lock")
    arm = env_state("tf", "cpu", machine="aarch64", glibc="2.36")
    assert arm.problem and "x86_64" in arm.problem and "aarch64" in arm.problem
    old = env_state("tf", "cpu", machine="x86_64", glibc="2.17")
    assert old.problem and "glibc 2.28" in old.problem and "2.17" in old.problem
    env = envs.family_env("tf", "cpu")
    env.path.mkdir(parents=True)
    (env.path / envs.FAILED).write_text("a build failed\n")
    failed = env_state("tf", "cpu", machine="x86_64", glibc="2.36")
    assert failed.problem == "a build failed (cached; `run_bench.py setup tf` retries)"
    (env.path / envs.FAILED).unlink()
    (env.path / "bin").mkdir()
    env.python.write_text("")
    (env.path / envs.STAMP).write_text(env.key + "\n")
    assert env_state("tf", "cpu", machine="aarch64", glibc="2.17").ready
    assert "no environment is declared" in (env_state("cntk", "cpu").problem or "")


# ---- the estimate ----

def record(run_id: str, wall: float, host: str = HOST, status: str = "ok",
           **fields: Any) -> dict[str, Any]:
    """A valid benchmark record of cpu-smoke's tf_mirrored runs (a real record, changed)."""
    rec = copy.deepcopy(json.loads(GOLDEN_RECORD.read_text()))
    runner, model, n, batch, *_ = run_id.split("__")
    rec.update(run_id=run_id, runner=runner, model=model, mode="benchmark",
               num_devices=int(n[1:]), batch_size_per_device=int(batch[1:]),
               global_batch_size=int(n[1:]) * int(batch[1:]), data="synthetic",
               data_label="synthetic", dataset=None, converge=None, wall_time_s=wall,
               status=status, **fields)
    rec["environment"]["host"] = host
    if status != "ok":
        rec["reason"] = "a reason"
    return rec


def folder(root: Path, name: str, records: list[dict[str, Any]], host: str | None = HOST
           ) -> Path:
    out = root / name / "runs"
    out.mkdir(parents=True)
    for rec in records:
        (out / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    if host is not None:
        (root / name / "environment.json").write_text(json.dumps({"host": host}))
    return out


def test_the_estimate_is_the_median_of_earlier_records_of_this_host(tmp_path: Path) -> None:
    cfg, runs = plan("cpu-smoke.yaml", "models=[minigooglenet, resnet50]")
    first = "tf_mirrored__minigooglenet__n1__b32__synthetic__fp32"
    assert [r.run_id for r in runs][0] == f"{first}__r0" and len(runs) == 4
    root = tmp_path / "results"
    runs_a = folder(root, "a", [record(f"{first}__r0", 10), record(f"{first}__r1", 30),
                                record(f"{first}__r2", 20),
                                record("tf_mirrored__minigooglenet__n4__b32__synthetic__fp32__r0",
                                       100),
                                record("tf_mirrored__resnet50__n1__b32__synthetic__fp32__r0",
                                       500, status="unavailable")])
    (runs_a / "tf_mirrored__resnet50__n2__b32__synthetic__fp32__r0.json").write_text("{broken")
    folder(root, "b", [record(f"{first}__r0", 1000, host="otherhost")], host="otherhost")
    folder(root, "c", [record(f"{first}__r5", 2000, host="otherhost")], host=None)
    host = facts(roots=(root,))
    predicted = predict(runs, cfg, host)
    est = estimate(runs, predicted, host)
    # run 1: median(10, 30, 20); run 2 (n2): no record of it, the runner and model's median
    # (10, 30, 20, 100); resnet50's only record was never launched: no figure
    assert (est.same_config, est.same_model, est.unknown) == (1, 1, 2)
    assert est.seconds == pytest.approx(20 + 25)
    line = next(ln for ln in summary_lines(runs, predicted, cfg, host)
                if ln.startswith("estimated"))
    assert line == ("estimated: ~45 s for 2 of 4 runs that will run (from earlier records on "
                    "this host: 1 of the same configuration, 1 of the same runner and model); "
                    "2 have no earlier record, at most 30 min by their timeouts")


def test_without_earlier_records_the_estimate_is_unknown_but_bounded(tmp_path: Path) -> None:
    """No history: no figure is invented, but the runs' timeouts bound what they may take."""
    cfg, runs = plan("cpu-smoke.yaml", "timeout_s=90")
    host = facts(roots=(tmp_path / "none",))
    line = summary_lines(runs, predict(runs, cfg, host), cfg, host)[-1]
    assert line == ("estimated: unknown for the 2 runs that will run (no earlier record of them "
                    "on this host, at most 3 min by their timeouts)")


def test_the_records_read_are_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, runs = plan("cpu-smoke.yaml")
    first = "tf_mirrored__minigooglenet__n1__b32__synthetic__fp32"
    folder(tmp_path, "a", [record(f"{first}__r{i}", 10 + i) for i in range(12)])
    (tmp_path / "a" / "runs" / "other__model__n1.json").write_text("{}")  # never read
    seen: list[Path] = []
    real = forecast.read_record
    monkeypatch.setattr(forecast, "read_record", lambda p: (seen.append(p), real(p))[1])
    monkeypatch.setattr(forecast, "MAX_RECORDS", 5)
    host = facts(roots=(tmp_path,))
    est = estimate(runs, predict(runs, cfg, host), host)
    assert len(seen) == 5 and est.capped and est.records == 5
    assert all("tf_mirrored__minigooglenet__" in p.name for p in seen)


# ---- the dry run ----

def test_the_dry_run_of_dgx1_says_which_runs_will_not_run_and_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(forecast.HostFacts, "here", classmethod(lambda cls, out: facts()))
    code = bench_cli.main(["--config", "configs/dgx1.yaml", "--dry-run",
                           "--out", str(tmp_path / "out")])
    out = capsys.readouterr().out
    assert code == 0
    lines = out.splitlines()
    assert lines[1].split()[-1] == "predicted"
    rows = [ln for ln in lines if re.match(r"^\d+ ", ln)]
    assert len(rows) == 360 and all(ln.endswith("  unavailable") for ln in rows)
    assert "predicted: 0 will run, 360 unavailable (of 360 runs; host testhost, GPUs: NVML " \
           "sees 0)" in lines
    assert sum("no GPU on this machine" in ln for ln in lines) == 1
    assert not (tmp_path / "out").exists()  # a dry run makes nothing


def test_the_shipped_results_folder_is_read_as_records(tmp_path: Path) -> None:
    """tests/golden/converge-results as an earlier sweep of its host: its converge records
    time the same configurations."""
    shutil.copytree(REPO_ROOT / "tests" / "golden" / "converge-results", tmp_path / "r" / "c")
    host_name = json.loads((tmp_path / "r" / "c" / "environment.json").read_text())["host"]
    dataset = tmp_path / "digits"
    dataset.mkdir()
    (dataset / "manifest.json").write_text(json.dumps({"classes": 10}))
    (dataset / "splits.npz").write_bytes(b"")
    cfg, runs = plan("converge-digits.yaml", f"dataset.path={dataset}",
                     "runners=[torch_ddp, tf_mirrored, keras_tf_kuza55]", "repeats=1")
    host = HostFacts(host_name, 0, ready, (tmp_path / "r",))
    predicted = predict(runs, cfg, host)
    est = estimate(runs, predicted, host)
    recs = [json.loads(p.read_text()) for p in (tmp_path / "r" / "c" / "runs").glob("*.json")]
    ids = {r["run_id"].rsplit("__r", 1)[0] for r in recs}
    going = [r for r, p in zip(runs, predicted, strict=True) if p.status == WILL_RUN]
    assert est.same_config == sum(r.run_id.rsplit("__r", 1)[0] in ids for r in going) > 0
    assert est.records == len(recs)


def test_a_resumed_dry_run_says_which_runs_are_recorded_already(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--resume --dry-run on a folder of 12 records: those runs are `recorded` (skipped), the
    runs the wider sweep adds are predicted as usual."""
    out = tmp_path / "out"
    shutil.copytree(REPO_ROOT / "tests" / "golden" / "converge-results", out)
    dataset = tmp_path / "digits"
    dataset.mkdir()
    (dataset / "manifest.json").write_text(json.dumps({"classes": 10}))
    (dataset / "splits.npz").write_bytes(b"")
    monkeypatch.setattr(forecast.HostFacts, "here", classmethod(lambda cls, out: facts()))
    code = bench_cli.main(["--config", "configs/converge-digits.yaml", "--dry-run", "--resume",
                           "--out", str(out), "--set", f"dataset.path={dataset}",
                           "--set", "runners=[torch_ddp, tf_mirrored, keras_tf_kuza55]",
                           "--set", "repeats=3"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    rows = [ln for ln in lines if re.match(r"^\d+ ", ln)]
    recorded = [ln.split()[1] for ln in rows if ln.endswith("  recorded")]
    assert sorted(recorded) == sorted(p.stem for p in (out / "runs").glob("*.json"))
    assert len(rows) == 18 and sum(ln.endswith("  will run") for ln in rows) == 6
    assert any(ln.startswith("predicted: 6 will run") and "12 recorded" in ln for ln in lines)


def test_a_users_interpreter_that_does_not_exist_is_unavailable_before_and_in_the_sweep(
        tmp_path: Path) -> None:
    """runner_options.<runner>.python naming no file: the dry run predicts `unavailable`
    naming the key and the path, and the sweep records exactly that, launching nothing."""
    from bench.records.store import load_records
    from tests.helpers.toy import config, toy

    missing = tmp_path / "no-such-env" / "bin" / "python"
    cfg, runs = plan("cpu-smoke.yaml", f"runner_options.tf_mirrored.python={missing}")
    [p1, p2] = predict(runs, cfg, facts())
    assert p1 == p2 and p1.status == UNAVAILABLE
    assert p1.reason == f"runner_options.tf_mirrored.python: {missing} does not exist on this " \
                        "machine"
    sweep = config(tmp_path, devices=[1], options={"python": str(missing)})
    proc = toy("--config", str(sweep), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    [rec] = load_records(tmp_path / "out")
    assert (rec["status"], rec["reason"]) == (
        UNAVAILABLE, f"runner_options.toy.python: {missing} does not exist on this machine")


def test_tf_cnn_benchmarks_is_predicted_by_its_own_checks_of_the_checkout_and_model(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's checks of its checkout and model, asked by the parent before a launch:
    no checkout -> unavailable saying how to get one; a checkout -> resnet50 will run and
    minigooglenet (no tf_cnn_benchmarks twin) is unavailable in the runner's own words."""
    monkeypatch.delenv("TF_CNN_BENCHMARKS_DIR", raising=False)
    cfg, runs = plan("tf-baseline.yaml", "runners=[tf_cnn_benchmarks]",
                     "models=[resnet50, minigooglenet]", "repeats=1")
    assert {p.reason.split(":")[0] for p in predict(runs, cfg, facts())} == {
        "no tensorflow/benchmarks checkout"}
    scripts = tmp_path / "benchmarks" / "scripts" / "tf_cnn_benchmarks"
    (scripts / "models").mkdir(parents=True)
    (scripts / "tf_cnn_benchmarks.py").write_text("# stand-in: only its presence is checked\n")
    (scripts / "models" / "model_config.py").write_text("'resnet50_v1.5': ...\n")
    monkeypatch.setenv("TF_CNN_BENCHMARKS_DIR", str(tmp_path / "benchmarks"))
    for spec, p in zip(runs, predict(runs, cfg, facts()), strict=True):
        if spec.model == "resnet50":
            assert p == forecast.Prediction(WILL_RUN), p
        else:
            assert p.status == UNAVAILABLE
            assert p.reason.startswith("tf_cnn_benchmarks cannot run minigooglenet"), p


def test_more_virtual_devices_than_cpus_is_said_before_the_sweep() -> None:
    """Issue 42, item 12: devices [3] on a 2-CPU host was planned "will run" without a word."""
    import dataclasses

    cfg, runs = plan("cpu-smoke.yaml", "devices=[1,2,3]")
    two = dataclasses.replace(facts(), cpus=2)
    predicted = predict(runs, cfg, two)
    lines = summary_lines(runs, predicted, cfg, two)
    assert ("note: 3 virtual CPU devices share this host's 2 CPUs: those runs' speedup "
            "measures the devices sharing cores, not scaling (records say virtual_devices: "
            "true)") in lines
    roomy = dataclasses.replace(facts(), cpus=4)
    assert not [ln for ln in summary_lines(runs, predict(runs, cfg, roomy), cfg, roomy)
                if "share this host" in ln]
