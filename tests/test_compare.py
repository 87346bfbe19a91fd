"""run_bench.py compare BASE NEW: verdicts, where each interval comes from, configurations on
one side or failed, environment differences, bad input; and the issue's acceptance test (one
CPU smoke sweep beside CPU hogs, compared with a copy of itself and with itself made faster)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bench.analysis.compare import (
    IMPROVEMENT,
    INCONCLUSIVE,
    NO_CHANGE,
    NOT_COMPARED,
    REGRESSION,
    compare,
    step_observations,
)
from bench.cli import main
from bench.records.store import check_record, load_records, write_json_atomic
from tests.helpers.cli import run_cli

ENV = {"host": "box-a", "os": "Linux", "python": "3.11.7", "cpu_model": "AMD EPYC 7742",
       "cpu_cores": 64, "gpus": [], "harness_commit": "aaaa"}
WIGGLE = (0.0, 0.02, -0.015, 0.01, -0.02, 0.015, -0.01, 0.005, -0.005, 0.02)


def steps_at(ips: float, batch: int, n: int = 20, noise: float = 1.0) -> list[float]:
    """n step times averaging batch/ips, with a fixed +-2% (times noise) wiggle."""
    return [batch / ips * (1 + noise * WIGGLE[i % len(WIGGLE)]) for i in range(n)]


def record(ips: float | None, devices: int = 1, repeat: int = 0, status: str = "ok",
           steps: list[float] | None = None, **kw: Any) -> dict[str, Any]:
    """A record as bench/run/launch.py writes it (the fields compare reads, and the rest of the
    spec's), for tf_mirrored / minigooglenet on virtual CPU devices."""
    batch = 32 * devices
    ok = status == "ok"
    times = (steps if steps is not None else steps_at(ips or 100.0, batch)) if ok else None
    if ok and ips is None:
        ips = batch * len(times) / sum(times)
    rec = {
        "schema_version": 1, "runner": "tf_mirrored", "model": "minigooglenet",
        "device": "cpu", "virtual_devices": True, "num_nodes": 1, "num_devices": devices,
        "scaling": "weak", "batch_size_per_device": 32, "global_batch_size": batch,
        "precision": "fp32", "data": "synthetic", "data_label": "synthetic",
        "run_id": f"tf_mirrored__minigooglenet__n{devices}__b32__synthetic__fp32__r{repeat}",
        "sweep_id": "s", "family": "tf", "repeat": repeat, "warmup_steps": 3,
        "measure_steps": len(times) if times else 10, "mode": "benchmark", "dataset": None,
        "options": {"xla": False, "steps_per_execution": 1},
        "status": status, "reason": None if ok else "boom: the child died",
        "images_per_sec": ips if ok else None, "step_times_s": times,
        # a run that never wrote a result has no framework versions (bench/run/launch.py)
        "environment": {**ENV, "framework": {"tensorflow": "2.21.0", "keras": "3.15.1"}
                        if ok else None, "lock": {"sha256": "f52ee6d6ddf406f7"}},
        "contended": False, "log_path": "/elsewhere/runs/x.log",
    }
    rec.update(kw)
    return rec


def folder(path: Path, records: list[dict[str, Any]], env: dict[str, Any] | None = None
           ) -> Path:
    """A results folder: runs/<run_id>.json and environment.json."""
    for rec in records:
        write_json_atomic(path / "runs" / f"{rec['run_id']}.json", rec)
    write_json_atomic(path / "environment.json", env or ENV)
    return path


def repeats(ips: list[float], devices: int = 1, **kw: Any) -> list[dict[str, Any]]:
    return [record(v, devices, repeat=i, **kw) for i, v in enumerate(ips)]


def rows_by_devices(base: Path, new: Path, threshold: float = 0.05) -> dict[int, Any]:
    return {r.key[-1]: r for r in compare(str(base), str(new), threshold).rows}


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`run_bench.py compare ARGS` in this process: exit code, stdout, stderr."""
    code = main(["compare", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_verdicts_from_repeats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Five repeats a side: 20% slower is a regression, 30% faster an improvement, 1% off
    is no significant change; the run exits 1 for the regression."""
    base = folder(tmp_path / "base", repeats([100, 101, 99, 100.5, 99.5], 1)
                  + repeats([200, 202, 198, 201, 199], 2) + repeats([300, 303, 297, 301, 299], 4))
    new = folder(tmp_path / "new", repeats([80, 81, 79, 80.5, 79.5], 1)
                 + repeats([260, 262, 258, 261, 259], 2) + repeats([303, 306, 300, 304, 302], 4))
    rows = rows_by_devices(base, new)
    assert rows[1].verdict == REGRESSION and rows[1].high < 0.95
    assert rows[1].ratio == pytest.approx(0.8)
    assert rows[2].verdict == IMPROVEMENT and rows[2].low > 1.05
    assert rows[4].verdict == NO_CHANGE
    assert all(r.interval_from == "repeats (5 vs 5): 95% bootstrap CI" for r in rows.values())
    code, out, _ = run(capsys, str(base), str(new))
    assert code == 1
    assert "1 regression, 1 improvement" in out


def test_two_repeats_a_side_give_the_range_called_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two repeats a side make no confidence interval: the row's interval is the extreme
    ratios of any two runs, named range, and no output calls it 95%."""
    base = folder(tmp_path / "base", repeats([100, 110], 1))
    new = folder(tmp_path / "new", repeats([90, 120], 1))
    row = rows_by_devices(base, new)[1]
    assert row.interval_from == "repeats (2 vs 2): range (2 repeats)"
    assert (row.low, row.high) == (pytest.approx(90 / 110), pytest.approx(120 / 100))
    _, out, _ = run(capsys, str(base), str(new), "--out", str(tmp_path / "cmp"))
    assert "range (2 repeats)" in out and "95%" not in out
    assert "95%" not in (tmp_path / "cmp" / "compare.md").read_text()


def test_straddling_or_small_change_is_no_significant_change(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An interval across 1 - threshold is no significant change, and so is a sure but
    small (2%) slowdown inside the band, until the threshold is below it."""
    base = folder(tmp_path / "base", repeats([100, 101, 99, 100.5, 99.5], 1)
                  + repeats([100, 101, 99, 100.5, 99.5], 2))
    new = folder(tmp_path / "new", repeats([88, 99, 93, 91, 97], 1)
                 + repeats([98, 98.1, 97.9, 98.05, 97.95], 2))
    rows = rows_by_devices(base, new)
    assert rows[1].ratio < 0.95 and rows[1].low < 0.95 < rows[1].high
    assert rows[1].verdict == NO_CHANGE
    assert rows[2].low > 0.95 and rows[2].high < 1 and rows[2].verdict == NO_CHANGE
    assert run(capsys, str(base), str(new))[0] == 0
    tight = rows_by_devices(base, new, threshold=0.01)
    assert tight[2].verdict == REGRESSION
    assert run(capsys, str(base), str(new), "--threshold", "0.01")[0] == 1


def test_one_repeat_resamples_the_steps_of_that_run(tmp_path: Path) -> None:
    """One run a side: the interval comes from its steps, is not degenerate, brackets the
    ratio of the records' images/sec, holds 1 for equal runs and excludes the band for a
    25% slower one."""
    base = folder(tmp_path / "base", [record(None, 1), record(None, 2)])
    new = folder(tmp_path / "new", [record(None, 1, steps=steps_at(75.0, 32)),
                                    record(None, 2, steps=steps_at(100.0, 64)[::-1])])
    rows = rows_by_devices(base, new)
    one, two = rows[1], rows[2]
    assert one.interval_from == two.interval_from == "steps of one run (20 vs 20): 95% bootstrap CI"
    assert one.verdict == REGRESSION and one.low < one.ratio < one.high < 0.95
    assert one.ratio == pytest.approx(75.0 / 100.0, rel=0.01)
    assert two.verdict == NO_CHANGE and two.low < 1 < two.high and two.high - two.low > 0.005


def test_step_interval_is_about_the_figure_the_record_reports(tmp_path: Path) -> None:
    """With one stalled step the record's images/sec (all images over the window) is half
    the median step rate's: the interval is about the reported figure and brackets it (the
    median of per-step rates would give 1.0 and an interval without the reported ratio), and
    one stall in 20 steps is not taken for a slower run."""
    even = [0.1] * 20
    stalled = [0.1] * 19 + [2.0]
    base = folder(tmp_path / "base", [record(None, 1, steps=even)])
    new = folder(tmp_path / "new", [record(None, 1, steps=stalled)])
    row = rows_by_devices(base, new)[1]
    assert row.ratio == pytest.approx(sum(even) / sum(stalled))
    assert row.low <= row.ratio <= row.high
    assert row.high >= 1.0 and row.verdict == NO_CHANGE


def test_steps_timed_together_are_one_observation(tmp_path: Path) -> None:
    """steps_per_execution k: k equal shares of one clock reading are one observation, so a
    run timed in a single call gives no interval (inconclusive), not a narrow one."""
    rec = record(None, 1, steps=[0.5] * 4 + [0.25] * 4,
                 options={"steps_per_execution": 4, "xla": False})
    assert step_observations(rec) == [2.0, 1.0]
    one_call = {"steps_per_execution": 10, "xla": False}
    base = folder(tmp_path / "base", [record(None, 1, steps=[0.3] * 10, options=one_call)])
    new = folder(tmp_path / "new", [record(None, 1, steps=[0.6] * 10, options=one_call)])
    row = rows_by_devices(base, new)[1]
    assert row.verdict == INCONCLUSIVE and row.low is None
    assert row.ratio == pytest.approx(0.5)


def test_repeats_on_one_side_and_one_run_on_the_other(tmp_path: Path) -> None:
    base = folder(tmp_path / "base", repeats([100, 101, 99, 100.5, 99.5], 1))
    new = folder(tmp_path / "new", [record(None, 1, steps=steps_at(70.0, 32))])
    row = rows_by_devices(base, new)[1]
    assert row.interval_from == "BASE 5 repeats, NEW steps of one run (20): 95% bootstrap CI"
    assert row.verdict == REGRESSION and row.low < row.ratio < row.high


def test_configurations_on_one_side_are_listed(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    base = folder(tmp_path / "base", repeats([100, 101], 1) + repeats([200, 201], 2))
    new = folder(tmp_path / "new", repeats([100, 101], 1) + repeats([400, 401], 4))
    rows = rows_by_devices(base, new)
    assert set(rows) == {1, 2, 4}
    assert rows[2].verdict == NOT_COMPARED and rows[2].notes == ["only in BASE"]
    assert rows[4].verdict == NOT_COMPARED and rows[4].notes == ["only in NEW"]
    code, out, _ = run(capsys, str(base), str(new))
    assert code == 0
    md = (new / "compare.md").read_text()
    assert "only in BASE" in md and "only in NEW" in md and "2 not compared" in md


def test_failed_in_new_is_a_regression(tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """ok in BASE and timed out in NEW: a regression naming the status and reason; some
    NEW runs failing where BASE's all ran is one too; fixed in NEW is an improvement; failed
    on both sides is listed, not compared."""
    base = folder(tmp_path / "base", repeats([100, 101, 99], 1) + repeats([200, 201, 199], 2)
                  + repeats([None, None], 4, status="failed")
                  + repeats([None], 8, status="oom"))
    new = folder(tmp_path / "new", repeats([None, None, None], 1, status="timeout")
                 + repeats([200, 201], 2) + [record(None, 2, repeat=2, status="failed")]
                 + repeats([400, 401], 4) + repeats([None], 8, status="oom"))
    rows = rows_by_devices(base, new)
    assert rows[1].verdict == REGRESSION and rows[1].ratio is None
    assert "failed in NEW: timeout: boom: the child died" in rows[1].notes[0]
    assert rows[2].verdict == REGRESSION and "1 of 3 runs not ok" in rows[2].notes[-1]
    assert rows[4].verdict == IMPROVEMENT and "failed in BASE" in rows[4].notes[0]
    assert rows[8].verdict == NOT_COMPARED and "failed on both sides" in rows[8].notes[0]
    code, out, _ = run(capsys, str(base), str(new))
    assert code == 1 and "2 regressions, 1 improvement" in out
    assert "timeout: boom" in (new / "compare.md").read_text()


def test_contended_runs_are_named(tmp_path: Path) -> None:
    base = folder(tmp_path / "base", repeats([100, 101, 99], 1))
    new = folder(tmp_path / "new", repeats([70, 71, 69], 1, contended=True))
    row = rows_by_devices(base, new)[1]
    assert row.verdict == REGRESSION
    assert "NEW contended (3/3 runs)" in row.notes and not any("BASE" in n for n in row.notes)


def test_environment_differences_are_warned_and_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    gpu = {"name": "Tesla V100-SXM2-16GB", "driver_version": "470.57", "pcie_max_gen": 3,
           "pcie_max_width": 16, "nvlinks_active": 6, "cuda_driver_version": "11.4"}
    base_env = {**ENV, "gpus": [gpu] * 8}
    new_env = {**ENV, "host": "box-b", "cpu_model": "Intel Xeon 8480", "harness_commit": "bbbb",
               "gpus": [{**gpu, "name": "H100 80GB HBM3", "driver_version": "550.54"}] * 8}
    base = folder(tmp_path / "base", repeats([100, 101], 1), base_env)
    newer = {**ENV, "framework": {"tensorflow": "2.22.0", "keras": "3.15.1"},
             "lock": {"sha256": "0123456789abcdef"}}
    new = folder(tmp_path / "new", repeats([100, 101], 1, environment=newer), new_env)
    code, out, err = run(capsys, str(base), str(new))
    assert code == 0
    expected = ["GPUs: 8x Tesla V100-SXM2-16GB -> 8x H100 80GB HBM3",
                "GPU driver: 470.57 -> 550.54", "CPU: AMD EPYC 7742 -> Intel Xeon 8480",
                "tensorflow (tf): 2.21.0 -> 2.22.0",
                "environment lock (tf): f52ee6d6ddf4 -> 0123456789ab"]
    warned = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    for line in expected:
        assert any(line in w for w in warned), (line, err)
    assert not any("box-b" in w or "bbbb" in w or "keras" in w for w in warned)
    md = (new / "compare.md").read_text()
    section = md.split("### Environment differences")[1]
    for line in expected:
        what, change = line.split(": ", 1)
        b, n = change.split(" -> ")
        assert f"- {what}: `{b}` -> `{n}`" in section
    assert "host `box-a` -> `box-b`" in md  # context, not a warning


def test_same_environment_warns_of_nothing(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    base = folder(tmp_path / "base", repeats([100, 101], 1))
    new = folder(tmp_path / "new", repeats([100, 101], 1), {**ENV, "host": "other-host"})
    _, _, err = run(capsys, str(base), str(new))
    assert "warning" not in err
    assert "none in GPUs" in (new / "compare.md").read_text()


def test_a_folder_compared_with_itself_is_said(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 42, item 7: `compare DIR DIR` says every ratio is 1 by construction."""
    base = folder(tmp_path / "base", repeats([100, 101], 1))
    _, _, err = run(capsys, str(base), str(base))
    assert f"note: BASE and NEW are the same folder ({base})" in err
    other = folder(tmp_path / "new", repeats([100, 101], 1))
    _, _, err = run(capsys, str(base), str(other))
    assert "same folder" not in err


def test_a_run_that_never_loaded_its_framework_is_no_version_difference(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = folder(tmp_path / "base", repeats([100, 101], 1))
    new = folder(tmp_path / "new", repeats([None, None], 1, status="failed"))
    code, _, err = run(capsys, str(base), str(new))
    assert code == 1 and "warning" not in err, err


def test_settings_outside_the_key_are_listed(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    base = folder(tmp_path / "base", repeats([100, 101], 1))
    new = folder(tmp_path / "new", repeats([100, 101], 1, warmup_steps=10,
                                           options={"xla": True, "steps_per_execution": 1}))
    _, out, _ = run(capsys, str(base), str(new))
    md = (new / "compare.md").read_text()
    for text in ("tf_mirrored.xla: False -> True (all 1 configurations)",
                 "warmup_steps: 3 -> 10"):
        assert text in out and text in md


def test_outputs_summary_first_table_and_chart(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    base = folder(tmp_path / "base", repeats([100, 101, 99, 100.5, 99.5], 1))
    new = folder(tmp_path / "new", repeats([80, 81, 79, 80.5, 79.5], 1))
    out_dir = tmp_path / "elsewhere" / "cmp"
    code, out, _ = run(capsys, str(base), str(new), "--out", str(out_dir))
    assert code == 1
    md = (out_dir / "compare.md").read_text().splitlines()
    assert md[0].startswith("**1 regression, 0 improvements**")
    header = next(i for i, ln in enumerate(md) if ln.startswith("| configuration"))
    row = md[header + 2].split(" | ")
    assert row[0] == "| tf_mirrored minigooglenet synthetic fp32 b32/dev 1 vcpu"
    assert row[3] == "0.800" and row[6] == "**regression**"
    assert (out_dir / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (new / "compare.md").exists()
    assert "1 vcpu" in out and "repeats (5 vs 5): 95% bootstrap CI" in out


@pytest.mark.parametrize(("case", "names"), [
    ("missing", ["base:", "does not exist", "allowed:"]),
    ("no_runs", ["new:", "has no runs/ folder", "allowed:"]),
    ("empty_runs", ["new:", "has no benchmark records", "allowed:"]),
    ("threshold_0", ["--threshold: 0.0 is not allowed", "allowed: a fraction between 0 and 1"]),
    ("threshold_1", ["--threshold: 1.0 is not allowed"]),
    ("threshold_neg", ["--threshold: -0.05 is not allowed"]),
    ("threshold_nan", ["--threshold: nan is not allowed"]),
    ("nothing_in_common", ["base, new:", "no configuration in common", "BASE: tf_mirrored",
                           "allowed:"]),
    ("out_is_a_file", ["--out:", "is not a folder", "allowed:"]),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          case: str, names: list[str]) -> None:
    base = folder(tmp_path / "base", repeats([100, 101], 1))
    new = folder(tmp_path / "new", repeats([100, 101], 1))
    args = [str(base), str(new)]
    if case == "missing":
        args[0] = str(tmp_path / "nowhere")
    elif case == "no_runs":
        (tmp_path / "bare").mkdir()
        args[1] = str(tmp_path / "bare")
    elif case == "empty_runs":
        (tmp_path / "empty" / "runs").mkdir(parents=True)
        (tmp_path / "empty" / "runs" / "x.spec.json").write_text("{}")
        args[1] = str(tmp_path / "empty")
    elif case.startswith("threshold_"):
        args += ["--threshold", {"0": "0", "1": "1", "neg": "-0.05", "nan": "nan"}[
            case.split("_")[1]]]
    elif case == "nothing_in_common":
        args[1] = str(folder(tmp_path / "other", repeats([100, 101], 2)))
    elif case == "out_is_a_file":
        (tmp_path / "file").write_text("")
        args += ["--out", str(tmp_path / "file")]
    code, out, err = run(capsys, *args)
    assert code == 2
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for text in names:
        assert text in lines[0]
    assert not (new / "compare.md").exists()


def test_bad_input_through_the_command_line_has_no_traceback(tmp_path: Path) -> None:
    proc = run_cli("compare", str(tmp_path / "nowhere"), str(tmp_path), timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"error: base: {str(tmp_path / 'nowhere')!r} does not exist; allowed: a results "
        "folder written by a sweep (with runs/)"]


# ---------------------------------------------------------------- the acceptance test

SWEEP = ("--config", "configs/cpu-smoke.yaml", "--set", "warmup_steps=2",
         "--set", "measure_steps=8", "--set", "batch_size_per_device=8")


def hog_cpus(count: int) -> list[subprocess.Popen[bytes]]:
    """count busy-loop processes (the test's own, killed by the caller)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for _ in range(count)]


def faster(rec: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """The record with every timed step s times shorter and images/sec s times higher, s
    twice its slowest step over its fastest (step observations): each of its steps is at
    least twice as fast as any of the original's. Everything else, `contended` included, is
    the record's own. (the record, s)"""
    obs = step_observations(rec)
    s = 2 * max(obs) / min(obs)
    out = json.loads(json.dumps(rec))
    out["images_per_sec"] = rec["images_per_sec"] * s
    out["step_times_s"] = [t / s for t in rec["step_times_s"]]
    return out, s


def contended_notes(row: Any, recs: dict[str, dict[str, Any]]) -> None:
    """The row names a side contended exactly when that side's one run says so."""
    for name, rec in recs.items():
        assert (f"{name} contended (1/1 runs)" in row.notes) == bool(rec["contended"]), \
            (name, row.notes, rec["contended"])


@pytest.mark.slow
def test_smoke_sweep_against_itself_passes_and_beside_cpu_hogs_regresses(
        tmp_path: Path, tf_python: str) -> None:
    """The issue's test, with no verdict a busy or idle machine can flip. One real sweep:
    the CPU smoke sweep (shortened: 2 warm-up + 8 timed steps of 8 images per device) beside
    one busy loop per core, through the CLI (HOGGED).

    - Against itself: `compare HOGGED COPY` (a byte copy) exits 0, every configuration "no
      significant change" with NEW/BASE exactly 1 and an interval holding 1. The numbers
      are identical, so however slow or noisy the steps were, both sides resample the same
      steps (only the seeds differ) and the interval is symmetric about 1.
    - Beside CPU hogs regresses: BASE is HOGGED's own records with every step s times
      shorter (images/sec s times higher), s = 2 x the run's slowest over fastest step: any
      resampling of BASE is at least twice as fast as any of HOGGED, so `compare BASE
      HOGGED` exits 1 with every configuration a regression whatever the steps were. The
      ratio is exactly 1/s and the interval exactly the self-comparison's divided by s
      (both sides draw the same steps with the same seeds), so it holds 1/s and stays
      below 1/2.
    - Contention: whether the hogs pushed a run over the harness's CONTENDED line (other
      processes over a quarter of the CPUs) depends on how the scheduler shared the cores,
      so it is not asserted; compare names a side contended exactly when its record says
      so, whichever it is. No assertion is about how fast anything ran or how busy the
      machine was."""
    t0 = time.monotonic()
    hogged, copy, base = tmp_path / "hogged", tmp_path / "copy", tmp_path / "base"
    hogs = hog_cpus(len(os.sched_getaffinity(0)))
    try:
        proc = run_cli(*SWEEP, "--out", str(hogged))
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sweep_s = time.monotonic() - t0
    recs = {r["num_devices"]: r for r in load_records(hogged)}
    assert sorted(recs) == [1, 2] and all(r["status"] == "ok" for r in recs.values())
    shutil.copytree(hogged, copy)

    same = run_cli("compare", str(hogged), str(copy), timeout=120)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "0 regressions, 0 improvements" in same.stdout
    assert (copy / "compare.md").read_text().startswith("**0 regressions, 0 improvements**")
    selves = {r.key[-1]: r for r in compare(str(hogged), str(copy), 0.05).rows}
    assert sorted(selves) == [1, 2]
    for n, row in selves.items():
        assert row.verdict == NO_CHANGE and row.ratio == 1.0, same.stdout
        assert row.interval_from == "steps of one run (8 vs 8): 95% bootstrap CI"
        assert row.low <= 1.0 <= row.high, same.stdout
        contended_notes(row, {"BASE": recs[n], "NEW": recs[n]})

    factors = {}
    for n, rec in recs.items():
        quick, factors[n] = faster(rec)
        assert check_record(quick) == []
        write_json_atomic(base / "runs" / f"{rec['run_id']}.json", quick)
    shutil.copy2(hogged / "environment.json", base / "environment.json")
    cmp = run_cli("compare", str(base), str(hogged), timeout=120)
    assert cmp.returncode == 1, cmp.stdout + cmp.stderr
    assert "2 regressions, 0 improvements" in cmp.stdout
    assert (hogged / "compare.md").read_text().startswith("**2 regressions, 0 improvements**")
    assert (hogged / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = {r.key[-1]: r for r in compare(str(base), str(hogged), 0.05).rows}
    assert sorted(rows) == [1, 2]
    for n, row in rows.items():
        s, self_row = factors[n], selves[n]
        assert row.verdict == REGRESSION, cmp.stdout
        assert row.interval_from == "steps of one run (8 vs 8): 95% bootstrap CI"
        assert row.ratio == pytest.approx(1 / s, rel=1e-12)
        assert row.low == pytest.approx(self_row.low / s, rel=1e-9)
        assert row.high == pytest.approx(self_row.high / s, rel=1e-9)
        assert row.low <= row.ratio * (1 + 1e-9) and row.ratio <= row.high * (1 + 1e-9)
        assert row.high <= 0.5 * (1 + 1e-9)
        contended_notes(row, {"BASE": recs[n], "NEW": recs[n]})
    print(f"acceptance: one sweep beside hogs in {sweep_s:.0f} s, all in "
          f"{time.monotonic() - t0:.0f} s; "
          + "; ".join(f"{r.label}: 1/s {r.ratio:.3f} [{r.low:.3f}, {r.high:.3f}], "
                      f"contended {bool(recs[n]['contended'])}" for n, r in rows.items()))


def test_the_charts_caption_fits_inside_the_image(tmp_path: Path) -> None:
    """Issue 42 item 7: compare.png's caption is wrapped to the figure, not cut at the right
    edge (long configuration labels narrow the axes it was centred under)."""
    from bench.analysis import compare as cmp_module
    from bench.plotting import pyplot

    base = folder(tmp_path / "base", repeats([100, 101, 99], 1))
    new = folder(tmp_path / "new", repeats([80, 81, 79], 1))
    fig = cmp_module.chart_figure(cmp_module.compare(str(base), str(new), 0.05))
    fig.tight_layout()
    renderer = fig.canvas.get_renderer()
    texts = [fig._supxlabel, *fig.axes[0].get_yticklabels(), fig.axes[0].title]
    for text in texts:
        box = text.get_window_extent(renderer)
        assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= fig.bbox.x1, text.get_text()
    assert "no significant change" in fig._supxlabel.get_text()
    pyplot().close(fig)
