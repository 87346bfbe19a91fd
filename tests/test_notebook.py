"""notebooks/explore_results.ipynb (issue 30) executed by nbclient against real records (a copy
of tests/golden/converge-results), an empty folder, a folder with damaged files beside a good
and a failed record, and a results root whose newest folder is chosen; the cases without any
folder run its cells in this process. Each asserts on what the cells print."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench.analysis.stats import summarise
from bench.records.store import load_records, record_files
from tests.helpers.cli import REPO

NOTEBOOK = REPO / "notebooks" / "explore_results.ipynb"
GOLDEN = REPO / "tests" / "golden" / "converge-results"
ONE_DEVICE = "converge__tf_mirrored__small_cnn__n1__b32__real-w0__fp32__r0"
TWO_DEVICES = "converge__tf_mirrored__small_cnn__n2__b32__real-w0__fp32__r0"
SUMMARY = 'print("SUMMARY " + summary.to_json(orient="records"))'
COMPARED = ("images_per_sec", "images_per_sec_ci_low", "images_per_sec_ci_high", "speedup",
            "speedup_ci_low", "speedup_ci_high", "scaling_efficiency", "efficiency_ci_low",
            "efficiency_ci_high")


def execute(monkeypatch: pytest.MonkeyPatch, results: Path | None = None,
            root: Path | None = None, extra: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """Run the notebook (and the `extra` cells after it) in a kernel with MGBENCH_RESULTS and
    MGBENCH_RESULTS_ROOT set as given (unset where None): (source, printed text) of each code
    cell. A cell that raises fails the test (CellExecutionError)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    for name, value in (("MGBENCH_RESULTS", results), ("MGBENCH_RESULTS_ROOT", root)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, str(value))
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nb.cells += [nbformat.v4.new_code_cell(source) for source in extra]
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    cells = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in cells)
    return [(c.source, "".join(_text(o) for o in c.outputs)) for c in cells]


def _text(output: Any) -> str:
    if output.get("output_type") == "stream":
        return output["text"]
    data = output.get("data", {})
    return "[image/png]\n" if "image/png" in data else data.get("text/plain", "") + "\n"


def cell(cells: list[tuple[str, str]], marker: str) -> str:
    """The printed text of the code cell whose source holds `marker`."""
    return next(text for source, text in cells if marker in source)


FOLDER, HOLDS, TABLE, CHART = "newest_with_records(", "runs_line(df)", "summarise(", "errorbar("
FAILED, DAMAGED = "itertuples()", "item.line(folder)"


def copy_records(into: Path, run_ids: list[str], failed: bool = False) -> None:
    """Golden records into `into`/runs; failed: each made a failed run with a reason."""
    (into / "runs").mkdir(parents=True, exist_ok=True)
    for run_id in run_ids:
        rec = json.loads((GOLDEN / "runs" / f"{run_id}.json").read_text())
        if failed:
            rec.update(status="failed", reason=f"the child exited 1 ({run_id[-2:]})",
                       images_per_sec=None)
        (into / "runs" / f"{run_id}.json").write_text(json.dumps(rec))


def test_real_records_give_summarise_numbers_and_a_chart(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "converge"
    shutil.copytree(GOLDEN, folder)
    cells = execute(monkeypatch, results=folder, extra=(SUMMARY,))
    assert f"folder: {folder}\nrecords: 12 readable; damaged files: 0" in cell(cells, FOLDER)
    holds = cell(cells, HOLDS)
    assert "12 runs: 12 ok" in holds and "virtual CPU devices: not GPU scaling" in holds
    assert "from 2026-11-26T02:45:26+00:00 to 2026-11-26T02:48:13+00:00" in holds
    assert cell(cells, CHART).count("[image/png]") == 1  # one model: small_cnn
    assert cell(cells, FAILED) == "no failed runs\n"
    assert cell(cells, DAMAGED) == "no damaged files\n"
    assert "no published figures for small_cnn" in cells[-2][1]
    # the table is the report's summary.csv rows: summarise over the same records
    got = json.loads(cells[-1][1].removeprefix("SUMMARY "))
    want = summarise(load_records(folder))
    assert len(got) == len(want) == 6
    for row, ref in zip(got, want, strict=True):
        assert (row["runner"], row["num_devices"], row["status"]) == (
            ref["runner"], ref["num_devices"], "ok")
        assert [row[k] for k in COMPARED] == pytest.approx([ref[k] for k in COMPARED],
                                                           rel=1e-9)


def test_empty_folder_is_a_message_and_every_cell_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    cells = execute(monkeypatch, results=empty)
    message = f"{empty}: no records (runs/*.json): no run has finished, or not a results folder"
    assert cell(cells, FOLDER) == f"folder: {empty}\n{message}\n"
    for marker in (HOLDS, TABLE, CHART, FAILED):
        assert cell(cells, marker) == message + "\n", marker
    assert cell(cells, DAMAGED) == "no damaged files\n"
    assert "[image/png]" not in "".join(text for _, text in cells)


def test_damaged_files_are_a_line_each_beside_the_good_and_failed_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "mixed"
    copy_records(folder, [ONE_DEVICE])
    copy_records(folder, [TWO_DEVICES], failed=True)
    broken = folder / "runs" / "converge__torch_ddp__cut.json"
    broken.write_text((GOLDEN / "runs" / f"{ONE_DEVICE}.json").read_text()[:200])
    (folder / "environment.json").write_text("[1, 2]")
    cells = execute(monkeypatch, results=folder)
    assert "records: 2 readable; damaged files: 2" in cell(cells, FOLDER)
    assert "2 runs: 1 ok, 1 failed" in cell(cells, HOLDS)
    damaged = cell(cells, DAMAGED).splitlines()
    assert len(damaged) == 2
    assert damaged[0].startswith(f"damaged: runs/{broken.name}: not JSON (")
    assert damaged[1] == "damaged: environment.json: top level is a list, not an object"
    assert cell(cells, FAILED) == ("1 of 2 runs did not end ok:\n"
                                   f"failed: {TWO_DEVICES}: the child exited 1 (r0)\n")
    assert cell(cells, CHART).count("[image/png]") == 1  # the ok 1-device run


def test_no_folder_given_opens_the_newest_under_the_root(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The newest by its records' times, not by name: the newest folder here holds only
    failed runs, so the summary and chart say there is no ok run."""
    root = tmp_path / "results"
    shutil.copytree(GOLDEN, root / "z-old")
    copy_records(root / "a-new", [ONE_DEVICE, TWO_DEVICES], failed=True)
    (root / "zz-no-records" / "runs").mkdir(parents=True)
    now = (root / "a-new" / "runs" / f"{ONE_DEVICE}.json").stat().st_mtime
    for path in record_files(root / "z-old"):
        os.utime(path, (now - 3600, now - 3600))
    cells = execute(monkeypatch, root=root)
    assert f"folder: {root / 'a-new'}\n" in cell(cells, FOLDER)
    assert "2 runs: 2 failed" in cell(cells, HOLDS)
    assert "no ok run: no images/sec to summarise (see Failures)" in cell(cells, TABLE)
    assert cell(cells, CHART) == "no ok run: nothing to draw (see Failures)\n"
    assert f"failed: {ONE_DEVICE}: the child exited 1 (r0)" in cell(cells, FAILED)


def run_in_process(monkeypatch: pytest.MonkeyPatch, env: dict[str, str]) -> list[str]:
    """The notebook's code cells run here, in order (no kernel: the cases without a folder
    need no plot), with only `env`'s MGBENCH_ variables set: what each cell printed."""
    nbformat = pytest.importorskip("nbformat")
    for name in ("MGBENCH_RESULTS", "MGBENCH_RESULTS_ROOT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(NOTEBOOK.parent)
    nb = nbformat.read(NOTEBOOK, as_version=4)
    scope: dict[str, Any] = {}
    printed = []
    for c in nb.cells:
        if c.cell_type == "code":
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                exec(compile(c.source, "<cell>", "exec"), scope)
            printed.append(out.getvalue())
    return printed


def test_no_folder_or_no_readable_record_is_a_message_in_every_cell(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "results"
    printed = run_in_process(monkeypatch, {"MGBENCH_RESULTS_ROOT": str(missing)})
    message = f"no results yet: {missing} does not exist; run a sweep"
    assert all(text.startswith(message) for text in printed[1:-1]), printed
    (missing / "empty").mkdir(parents=True)
    (missing / "no-records" / "runs").mkdir(parents=True)
    (missing / "a-file").write_text("")
    printed = run_in_process(monkeypatch, {"MGBENCH_RESULTS_ROOT": str(missing)})
    message = f"no results yet: no folder under {missing} holds records (runs/*.json)"
    assert all(text.startswith(message) for text in printed[1:-1]), printed
    only_damaged = tmp_path / "only-damaged"
    (only_damaged / "runs").mkdir(parents=True)
    (only_damaged / "runs" / "x.json").write_text('{"run_id": "x", "status": "ok"}')
    printed = run_in_process(monkeypatch, {"MGBENCH_RESULTS": str(only_damaged)})
    message = (f"{only_damaged}: no readable records: all 1 record files are damaged (listed "
               "under Damaged files)")
    assert all(text.endswith(message + "\n") for text in printed[1:-2]), printed
    assert printed[-2].startswith("damaged: runs/x.json: missing fields ")
    printed = run_in_process(monkeypatch, {"MGBENCH_RESULTS": "results/not-there"})
    assert printed[1] == ("MGBENCH_RESULTS=results/not-there: no such folder; allowed: a "
                          "results folder\n")


def test_the_readmes_headless_command_keeps_the_outputs(tmp_path: Path) -> None:
    """Issue 42, item 2: `jupyter execute` as the README gives it writes the executed notebook
    with its outputs (without --output, jupyter execute discards them)."""
    import re
    import subprocess
    import sys

    pytest.importorskip("nbclient")
    readme = (REPO / "README.md").read_text()
    words = re.search(r"`MGBENCH_RESULTS=DIR (jupyter execute\s+notebooks/explore_results\.ipynb"
                      r"[^`]*)`", readme)
    assert words, "the README gives no headless jupyter execute command"
    args = words.group(1).split()[2:]  # after `jupyter execute`
    shutil.copy(NOTEBOOK, tmp_path / NOTEBOOK.name)  # its output lands beside the notebook
    results = tmp_path / "results"
    copy_records(results, [ONE_DEVICE, TWO_DEVICES])
    jupyter = shutil.which("jupyter") or shutil.which("jupyter",
                                                      path=str(Path(sys.executable).parent))
    if jupyter is None:
        pytest.skip("no `jupyter` command on PATH (jupyter_core comes with nbclient)")
    proc = subprocess.run(
        [jupyter, "execute", str(tmp_path / NOTEBOOK.name), *args[1:]],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "MGBENCH_RESULTS": str(results), "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    written = [p for p in tmp_path.glob("*.ipynb") if p.name != NOTEBOOK.name]
    assert len(written) == 1, (sorted(tmp_path.iterdir()), proc.stderr[-1000:])
    cells = json.loads(written[0].read_text())["cells"]
    assert any(c.get("outputs") for c in cells if c["cell_type"] == "code")


def test_an_impossible_speedup_is_flagged_and_rates_start_at_zero(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issues 40 and 42 item 13: the issue's recorded 10.90x on 2 devices shows its doubts in
    the summary and beside the chart (not its own undoubted speedup), and the chart's rate
    axes start at 0."""
    folder = tmp_path / "impossible"
    shutil.copytree(REPO / "tests" / "golden" / "impossible-speedup", folder)
    cells = execute(monkeypatch, results=folder,
                    extra=(SUMMARY, 'print("YLOW", [float(a.get_ylim()[0]) for a in fig.axes])'))
    assert "2 runs: 2 ok" in cell(cells, HOLDS)
    assert "gpt2_tiny: flagged, not a result" in cell(cells, CHART)
    got = json.loads(cells[-2][1].removeprefix("SUMMARY "))
    assert [r["doubts"] is not None for r in got] == [False, True]
    assert "impossible, so no result" in got[1]["doubts"]
    assert cells[-1][1].strip() == "YLOW [0.0, 0.0]"
