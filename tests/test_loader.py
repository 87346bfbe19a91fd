"""bench/analysis/loader.py, what the notebook reads (issues 40 and 42 item 13): its speedup
carries the report's doubts, run counts read in the singular, and a host is one row even when a
record lacks its versions. Recorded records (tests/golden/impossible-speedup) and their copies
changed as a timed-out run's would be."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from bench.analysis.loader import hosts, load_results, runs_line
from tests.helpers.cli import REPO

IMPOSSIBLE = REPO / "tests" / "golden" / "impossible-speedup"
TWO = "torch_ddp__gpt2_tiny__n2__b8__synthetic__fp32__r0.json"


def test_the_loaders_speedup_carries_the_reports_doubts() -> None:
    """The issue's 10.90x on 2 devices is flagged in the frame as in the report: impossible,
    over a contended baseline; the 1-device row has no doubt."""
    df = load_results(IMPOSSIBLE).set_index("num_devices")
    assert df.loc[2, "speedup"] > 10
    assert "impossible, so no result" in df.loc[2, "doubts"]
    assert "1-device baseline was contended" in df.loc[2, "doubts"]
    assert pd.isna(df.loc[1, "doubts"])


def test_one_run_is_one_run_and_a_timed_out_record_without_versions_joins_its_host(
        tmp_path: Path) -> None:
    folder = tmp_path / "one"
    (folder / "runs").mkdir(parents=True)
    shutil.copy(IMPOSSIBLE / "runs" / TWO, folder / "runs" / TWO)
    assert runs_line(load_results(folder)) == "1 run: 1 ok"
    shutil.copytree(IMPOSSIBLE, tmp_path / "both")
    path = tmp_path / "both" / "runs" / TWO
    rec = json.loads(path.read_text())
    rec["environment"]["framework"] = {}
    rec.update(status="timeout", reason="exceeded timeout_s=300; process group killed",
               images_per_sec=None)
    path.write_text(json.dumps(rec))
    df = load_results(tmp_path / "both")
    assert runs_line(df) == "2 runs: 1 ok, 1 timeout"
    [host] = hosts(df).to_dict("records")
    assert host["runs"] == 2 and host["version_torch"] == "2.13.0+cpu"
