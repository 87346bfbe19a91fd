"""The CI use of a sweep: `run --baseline DIR` (bench/analysis/gate.py) judging the sweep
against a baseline folder, junit.xml (bench/report/junit.py), $GITHUB_STEP_SUMMARY."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bench.analysis.gate import NO_BASELINE, REGRESSION_EXIT, clear_gate, read_gate, run_gate
from bench.records.store import load_records
from bench.report.junit import junit_xml
from tests.helpers.cli import run_cli
from tests.helpers.records import run_record, write_folder


def _faster(folder: Path, factor: float) -> None:
    """Every record of `folder` made `factor` times faster (images/sec up, step times down)."""
    for path in (folder / "runs").glob("*.json"):
        rec = json.loads(path.read_text())
        if rec.get("status") == "ok":
            rec["images_per_sec"] *= factor
            rec["step_times_s"] = [t / factor for t in rec["step_times_s"]]
            path.write_text(json.dumps(rec))


def test_junit_has_a_case_per_run_failures_skips_and_regressions() -> None:
    ok, slow = run_record(1, 0, 100.0), run_record(2, 0, 150.0)
    failed = {**run_record(1, 1, 100.0), "status": "failed", "reason": "boom: rank 1 died",
              "run_id": "failed-run"}
    missing = {**run_record(1, 2, 100.0), "status": "unavailable", "reason": "no GPU",
               "run_id": "unavailable-run"}
    gate = {"regressed": ["tf_mirrored minigooglenet synthetic fp32 b32/dev 2 vcpu"]}
    root = ET.fromstring(junit_xml("sweep", [ok, slow, failed, missing], gate))
    cases = {c.get("name"): c for c in root.iter("testcase")}
    assert root.tag == "testsuites" and root.get("tests") == "4" == str(len(cases))
    assert root.get("failures") == "2"
    assert cases[ok["run_id"]].find("failure") is None and cases[ok["run_id"]].get(
        "classname") == "mgbench.tf_mirrored"
    assert cases["failed-run"].find("failure").get("message") == "failed: boom: rank 1 died"
    assert cases["unavailable-run"].find("skipped").get("message") == "unavailable: no GPU"
    assert cases[slow["run_id"]].find("failure").get("type") == "regression"
    suite = next(s for s in root.iter("testsuite") if s.get("name") == ok["run_id"])
    props = {p.get("name"): p.get("value") for p in suite.iter("property")}
    assert props["images_per_sec"] == "100.0" and props["status"] == "ok"


def test_a_missing_baseline_passes_with_a_note(tmp_path: Path) -> None:
    out = write_folder(tmp_path / "new", [run_record(1, 0, 100.0)])
    outcome = run_gate(str(tmp_path / "nowhere"), out, 0.05)
    assert (outcome.status, outcome.code) == (NO_BASELINE, 0)
    assert "nothing to compare" in outcome.line and "does not exist" in outcome.line
    assert read_gate(out)[0]["status"] == NO_BASELINE and read_gate(out)[1] is None


def test_a_slower_sweep_fails_the_gate_and_an_equal_one_passes(tmp_path: Path) -> None:
    new = write_folder(tmp_path / "new", [run_record(1, r, 100.0 + r) for r in range(3)])
    same = write_folder(tmp_path / "same", [run_record(1, r, 100.0 + r) for r in range(3)])
    fast = write_folder(tmp_path / "fast", [run_record(1, r, 150.0 + r) for r in range(3)])
    assert run_gate(str(same), new, 0.05).code == 0
    slower = run_gate(str(fast), new, 0.05)
    assert slower.code == REGRESSION_EXIT and slower.regressed and "1 regression" in slower.line
    assert "| " in read_gate(new)[1]  # baseline.md: compare's table
    clear_gate(new)  # a later sweep without --baseline: no stale comparison is shown
    assert read_gate(new) == (None, None)


@pytest.mark.slow
def test_run_with_baseline_on_real_runs(tmp_path: Path, tf_python: str) -> None:
    """A real 1-device CPU sweep, then `--resume` (nothing left to run: the report again)
    judged against an identical baseline (exit 0), a 2x faster one (exit 4, junit.xml and
    results.md say which) and a missing one (exit 0, a note); the step summary written."""
    sets = ["warmup_steps=2", "measure_steps=3", "batch_size_per_device=8", "devices=[1]"]
    args = ["--config", "configs/cpu-smoke.yaml", *[a for s in sets for a in ("--set", s)]]
    out = tmp_path / "sweep"
    proc = run_cli(*args, "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["status"] for r in load_records(out)] == ["ok"]
    same, fast = tmp_path / "same", tmp_path / "fast"
    shutil.copytree(out, same)
    shutil.copytree(out, fast)
    _faster(fast, 2.0)
    summary = tmp_path / "step-summary.md"

    def judged(baseline: Path) -> tuple[int, str]:
        proc = run_cli(*args, "--out", str(out), "--resume", "--baseline", str(baseline),
                       env={"GITHUB_STEP_SUMMARY": str(summary)})
        return proc.returncode, proc.stdout + proc.stderr

    # the gate's line, then the last line: what decided the exit status
    code, text = judged(same)
    assert code == 0 and "0 regressions" in text.splitlines()[-2], text
    assert text.splitlines()[-1].startswith("exit 0: runs: 1 ok;") and "baseline: pass" in text
    code, text = judged(fast)
    assert code == REGRESSION_EXIT and "1 regression" in text.splitlines()[-2], text
    assert text.splitlines()[-1].startswith("exit 4: ") and "baseline: regression" in text
    failures = list(ET.parse(out / "junit.xml").getroot().iter("failure"))
    assert [f.get("type") for f in failures] == ["regression"]
    assert "## Against the baseline" in (out / "results.md").read_text()
    assert "Against the baseline" in (out / "report.html").read_text()
    code, text = judged(tmp_path / "none")
    assert code == 0 and "nothing to compare" in text.splitlines()[-2], text
    assert summary.read_text().count("# Benchmark results") == 3
