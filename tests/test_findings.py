"""The Findings (bench/analysis/findings.py, issue 42) on summary rows made by summarise from
crafted records: a winner is named only where the intervals do not overlap, never with one run
each; flagged figures, failures and implausible peaks are listed with why; report.html opens
with them. No framework runs here."""

from __future__ import annotations

import shutil
from typing import Any

from bench.analysis import findings
from bench.analysis.stats import summarise
from bench.records.store import load_records
from bench.report.summary import build_report, findings_text
from tests.helpers.cli import REPO
from tests.helpers.records import gpu_record


def _runs(runner: str, n: int, rates: list[float], **kw: Any) -> list[dict[str, Any]]:
    return [gpu_record(n, ips, run_id=f"{runner}-n{n}-r{i}", runner=runner, repeat=i, **kw)
            for i, ips in enumerate(rates)]


def _lines(records: list[dict[str, Any]]) -> list[str]:
    found = dict(findings.findings(summarise(records), records))
    return found["resnet50"]


def _at(lines: list[str], start: str) -> str:
    return next(line for line in lines if line.startswith(start))


def test_a_winner_is_named_where_the_intervals_do_not_overlap() -> None:
    lines = _lines(_runs("torch_ddp", 1, [100.0, 101.0, 102.0])
                   + _runs("horovod", 1, [80.0, 81.0, 82.0]))
    one = _at(lines, "1 gpu: ")
    assert one.startswith("1 gpu: fastest torch_ddp 101.0 img/s (CI ")
    assert "1.25x the next, horovod 81.0 img/s (CI " in one
    assert "the intervals do not overlap" in one and "no clear winner" not in one


def test_overlapping_intervals_name_no_winner() -> None:
    lines = _lines(_runs("torch_ddp", 1, [90.0, 100.0, 110.0])
                   + _runs("horovod", 1, [95.0, 97.0, 99.0]))
    one = _at(lines, "1 gpu: ")
    assert one.startswith(f"1 gpu: {findings.NO_WINNER}; torch_ddp 100.0 img/s")
    assert "fastest" not in one and "against horovod 97.0 img/s" in one


def test_one_run_each_names_no_winner() -> None:
    lines = _lines(_runs("torch_ddp", 1, [100.0]) + _runs("horovod", 1, [50.0]))
    one = _at(lines, "1 gpu: ")
    assert one.startswith(f"1 gpu: {findings.NO_INTERVAL}") and "fastest" not in one
    assert "2.00x" in one  # by how much, without claiming a winner


def test_the_best_sound_efficiency_and_the_least_memory() -> None:
    mem = {"memory_per_device": {"cuda:0": 2**30}}
    records = (_runs("torch_ddp", 1, [100.0, 100.5, 101.0])
               + _runs("torch_ddp", 2, [180.0, 181.0, 182.0], **mem)
               + _runs("horovod", 1, [100.0, 100.5, 101.0])
               + _runs("horovod", 2, [150.0, 151.0, 152.0],
                       memory_per_device={"cuda:0": 2**31}))
    lines = _lines(records)
    best = _at(lines, "best scaling efficiency at 2 gpu: ")
    assert best.startswith("best scaling efficiency at 2 gpu: torch_ddp 90% (speedup 1.80x, "
                           "interval ")
    assert "horovod 75% is below its interval" in best and findings.FLAGGED not in best
    assert _at(lines, "least memory per device at 2 gpu: ") == (
        "least memory per device at 2 gpu: torch_ddp 1.00 GiB (next horovod 2.00 GiB)")


def test_flagged_and_failed_rows_are_listed_with_why() -> None:
    records = (_runs("torch_ddp", 1, [10.0], contended=True)
               + _runs("torch_ddp", 2, [100.0])
               + [gpu_record(2, None, run_id="horovod-n2", runner="horovod",
                             status="timeout", reason="exceeded timeout_s=300")])
    lines = _lines(records)
    assert "horovod on 2 gpu: timeout: exceeded timeout_s=300" in lines
    assert any(line.startswith("torch_ddp on 2 gpu: not a result: speedup 10.00x on 2 devices")
               for line in lines)
    assert ("torch_ddp on 2 gpu: not a result: its 1-device baseline was contended: the "
            "speedup and efficiency divide by a figure that is not the device's own") in lines
    assert any(line.startswith("torch_ddp on 1 gpu: flagged CONTENDED (other processes")
               for line in lines)
    # the flagged speedup is no scaling figure
    assert "scaling: no sound efficiency; every multi-device figure is flagged (below)" in lines
    assert "1 gpu: torch_ddp 10.0 img/s [flagged: below], the only configuration that ran " \
           "ok here" in lines


def test_an_implausible_peak_is_listed() -> None:
    why = "0.5 GFLOP/s is under 1/20 of the machine's best"
    records = (_runs("torch_ddp", 1, [100.0], mfu={"peak": {"implausible": why}})
               + _runs("horovod", 1, [90.0], mfu={"own_peak": {"implausible": why,
                                                               "family": "torch"}}))
    lines = _lines(records)
    assert (f"torch_ddp on 1 gpu: MFU is no result: the peak it is taken against is "
            f"implausible: {why}") in lines
    assert (f"horovod on 1 gpu: its own torch peak probe was implausible ({why}); MFU is "
            "against the machine's best") in lines


def test_the_terminal_and_the_page_lead_with_the_findings(tmp_path) -> None:
    folder = tmp_path / "sweep"
    shutil.copytree(REPO / "tests" / "golden" / "impossible-speedup", folder)
    rows, _, _ = build_report(folder)
    text = findings_text(rows, load_records(folder))
    assert text.startswith("Findings (from the records; the table and its flags below):")
    assert "  gpt2_tiny:\n" in text and "not a result: speedup 10.90x on 2 devices" in text
    page = (folder / "report.html").read_text()
    assert page.index("<h2 id='findings'>Findings</h2>") < page.index("<h2>Summary</h2>") \
        < page.index("<h2>Machine</h2>")
    assert '<table class="core">' in page and "<summary>Details per row: " in page
    assert "<dt>interval</dt><dd>The interval of img/s over repeats" in page
    assert findings.text([], []) == ""
