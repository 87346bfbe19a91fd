"""The baseline gate of `run --baseline DIR`: a finished sweep judged against a baseline results
folder with compare's rules (bench/analysis/compare.py), for a CI job.

The outcome is one line and an exit code: REGRESSION_EXIT on a significant regression, else 0.
A baseline that is missing, damaged or shares no configuration passes with a note (the first
run of a new runner or model has nothing to be slower than). The comparison is written to
baseline.md and baseline.json in the results folder; results.md, report.html and junit.xml
show it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.analysis.compare import REGRESSION, compare, counts, markdown
from bench.atomic import write_text_atomic
from bench.errors import ConfigError
from bench.records.store import write_json_atomic

REGRESSION_EXIT = 4  # docs/CI.md: 0 all ok, 2 bad input, 3 runs failed, 4 slower than the baseline
MD_NAME, JSON_NAME = "baseline.md", "baseline.json"
PASS, REGRESSED, NO_BASELINE = "pass", "regression", "no baseline"


@dataclass
class GateOutcome:
    """What the gate decided: its status, the line the terminal ends with, the exit code and
    the labels of the configurations that regressed (junit.xml fails their runs)."""
    status: str
    line: str
    code: int
    baseline: str
    regressed: list[str] = field(default_factory=list)


def run_gate(baseline: str, out: Path, threshold: float) -> GateOutcome:
    """Compare the sweep in `out` with `baseline`; write baseline.md and baseline.json."""
    try:
        cmp = compare(baseline, str(out), threshold)
    except ConfigError as exc:
        outcome = GateOutcome(NO_BASELINE, f"baseline: nothing to compare ({exc}); passing "
                              "without a comparison", 0, baseline)
        write_json_atomic(out / JSON_NAME, asdict(outcome))
        return outcome
    regressed = [r.label for r in cmp.rows if r.verdict == REGRESSION]
    write_text_atomic(out / MD_NAME, markdown(cmp, baseline, str(out)))
    if regressed:
        outcome = GateOutcome(REGRESSED, f"baseline: {counts(cmp)} against {baseline}; "
                              f"slower: {'; '.join(regressed)} (exit {REGRESSION_EXIT})",
                              REGRESSION_EXIT, baseline, regressed)
    else:
        outcome = GateOutcome(PASS, f"baseline: {counts(cmp)} against {baseline}; no "
                              "significant regression", 0, baseline)
    write_json_atomic(out / JSON_NAME, asdict(outcome))
    return outcome


def clear_gate(results_dir: Path) -> None:
    """Remove an earlier gate's files: a sweep that ended without --baseline has records
    that earlier comparison did not judge."""
    for name in (MD_NAME, JSON_NAME):
        (Path(results_dir) / name).unlink(missing_ok=True)


def read_gate(results_dir: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The gate's outcome (baseline.json) and comparison (baseline.md) kept in a results
    folder, each None where absent or unreadable."""
    try:
        outcome = json.loads((Path(results_dir) / JSON_NAME).read_text())
    except (OSError, ValueError):
        outcome = None
    try:
        text = (Path(results_dir) / MD_NAME).read_text()
    except (OSError, UnicodeDecodeError):
        text = None
    return (outcome if isinstance(outcome, dict) else None), text
