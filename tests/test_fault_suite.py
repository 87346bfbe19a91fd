"""The fault suite of results folders (issue 29, class 1): damaged folders generated from a real
sweep's records (tests/golden/converge-results, 12 runs), every field of a record given every
wrong kind of value, and the files a folder holds broken the ways copies, editors and crashes
break them. The tolerant reader (bench/records/store.py) must name each damaged file with a
one-line reason and keep the others; report, compare and predict must print one line per
damaged file, never a traceback and never a number from one; --resume must run a damaged or
incomplete record's run again and keep the damaged file beside the new one."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.records.store import (
    CONFIGURATION,
    IDENTITY,
    MAX_DEPTH,
    MAX_FILE_BYTES,
    STATUSES,
    done_run_ids,
    load_records,
    read_environment,
    read_record,
    record_problems,
    scan_records,
)
from tests.helpers.cli import REPO, run_cli

GOLDEN = REPO / "tests" / "golden" / "converge-results"
GOLDEN_RUNS = sorted((GOLDEN / "runs").glob("*.json"))
# a converge record is not an all-reduce probe; an ok one holds its images/sec
REQUIRED_HERE = (*IDENTITY, *CONFIGURATION, "images_per_sec")

# each wrong kind of value, as JSON text (NaN is not JSON: the text a careless writer leaves)
KINDS: dict[str, str] = {
    "list": "[1, 2]", "dict": '{"a": 1}', "string": '"garbage"', "huge_int": str(10**30),
    "null": "null", "nan_text": "NaN",
}


def golden(i: int = 0) -> dict[str, Any]:
    return json.loads(GOLDEN_RUNS[i].read_text())


FIELDS = sorted(golden())


def kind_of(value: Any) -> str | None:
    """The JSON kind of a golden value (None for null: any kind may be right)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", list: "list", dict: "dict"}[type(value)]


def with_field(rec: dict[str, Any], field: str, kind: str) -> str:
    """The record's JSON text with field's value replaced by the KINDS text of kind."""
    marker = "__FAULT_SUITE_VALUE__"
    return json.dumps({**rec, field: marker}, indent=2).replace(f'"{marker}"', KINDS[kind])


def expected_damaged(field: str, kind: str) -> bool:
    """Whether a golden record with field set to kind's value must be refused: a value of
    another kind than the field holds in a real record, a huge integer, NaN, null where the
    run's identity or configuration needs a value, a status outside STATUSES, a run_id that is
    not the file's name."""
    if kind == "nan_text" or kind == "huge_int":
        return True
    if kind == "null":
        return field in REQUIRED_HERE
    if field == "run_id" or (field == "status" and kind == "string"):
        return True
    real = kind_of(golden()[field])
    if real is None:  # null in the golden records: the schema says, read below
        return False
    return real != {"list": "list", "dict": "dict", "string": "string"}[kind]


def run_all(*calls: tuple[str, ...]) -> list[subprocess.CompletedProcess[str]]:
    """Several `run_bench.py` commands at once (each a real process), in order."""
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda args: run_cli(*args), calls))


def copy_golden(dest: Path) -> Path:
    shutil.copytree(GOLDEN, dest)
    return dest


def assert_clean_exit(proc: subprocess.CompletedProcess[str], codes: tuple[int, ...] = (0,)
                      ) -> None:
    both = proc.stdout + proc.stderr
    assert "Traceback" not in both, both[-3000:]
    assert proc.returncode in codes, both[-3000:]


# -- the reader, field by field --------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_every_field_of_every_wrong_kind_is_damaged_with_its_reason_or_read(
        tmp_path: Path, kind: str) -> None:
    """Each field of a real record, in turn, given the value of this kind: the reader refuses
    the record (naming the field, or NaN / the range) exactly where the value cannot be the
    field's, and the folder's other 11 records are read as they were."""
    out = copy_golden(tmp_path / "f")
    target = out / "runs" / GOLDEN_RUNS[0].name
    others = [r["run_id"] for r in load_records(GOLDEN)][1:]
    for field in FIELDS:
        target.write_text(with_field(golden(), field, kind))
        records, damaged = scan_records(out)
        assert [r["run_id"] for r in records if r["run_id"] != GOLDEN_RUNS[0].stem] == others
        if expected_damaged(field, kind):
            assert [d.path for d in damaged] == [target], (field, kind)
            reason = damaged[0].reason
            assert "\n" not in reason and len(reason) < 300, reason
            assert field in reason or kind in ("nan_text",) or "run_id" in reason, \
                (field, kind, reason)
        elif damaged:  # a field null in every golden record: refused only for its schema kind
            assert repr(field) in damaged[0].reason, (field, kind, damaged[0].reason)


@pytest.mark.parametrize("field", FIELDS)
def test_a_record_without_a_field_is_damaged_only_without_its_identity(
        tmp_path: Path, field: str) -> None:
    rec = golden()
    del rec[field]
    path = tmp_path / "runs" / GOLDEN_RUNS[0].name
    path.parent.mkdir()
    path.write_text(json.dumps(rec))
    got, reason = read_record(path)
    if field in REQUIRED_HERE:
        assert got is None and field in reason
    else:
        assert got == rec and reason is None


# -- the reader, whole files -----------------------------------------------------------------

def _deep(n: int) -> str:
    return "[" * n + "]" * n


# name -> (the file's bytes, or a writer of it, and words its reason must hold)
FILES: dict[str, tuple[Any, str]] = {
    "not_utf8": (b'{"run_id": "\xff\xfe"}', "not UTF-8"),
    "not_json": (b'{"run_id": "x", ', "not JSON"),
    "deep_100k": (_deep(100_000).encode(), "nested deeper"),
    "deep_just_over": (('{"a": ' * (MAX_DEPTH + 1) + "1" + "}" * (MAX_DEPTH + 1)).encode(),
                       "nested deeper"),
    "empty": (b"", "empty file"),
    "blank": (b"  \n", "empty file"),
    "top_level_list": (b'[{"run_id": "x"}]', "top level is a list"),
    "top_level_string": (b'"x"', "top level is a string"),
    "only_run_id": (None, "missing fields"),
    "missing_runner": (None, "runner"),
    "nan_text": (None, "NaN"),
    "infinity_text": (None, "Infinity"),
    "float_overflow": (None, "non-finite"),
    "lone_surrogate": (None, "surrogate"),
    "status_unknown": (None, "status"),
    "run_id_not_its_name": (None, "not the file's name"),
    "over_size_limit": ("sparse", "allowed: at most"),
    "a_folder": ("folder", "not a regular file"),
}


def write_file(path: Path, name: str) -> None:
    """Write the FILES case name at path (a record file of the golden folder's first run)."""
    content, _ = FILES[name]
    rec = golden()
    if content is None:
        text = {
            "only_run_id": lambda: json.dumps({"run_id": path.stem}),
            "missing_runner": lambda: json.dumps({k: v for k, v in rec.items() if k != "runner"}),
            "nan_text": lambda: with_field(rec, "images_per_sec", "nan_text"),
            "infinity_text": lambda: json.dumps(rec).replace(
                json.dumps(rec["images_per_sec"]), "Infinity", 1),
            "float_overflow": lambda: json.dumps(rec).replace(
                json.dumps(rec["images_per_sec"]), "1e400", 1),
            "lone_surrogate": lambda: json.dumps(rec).replace(
                json.dumps(rec["runner"]), '"\\ud800"', 1),
            "status_unknown": lambda: json.dumps({**rec, "status": "great"}),
            "run_id_not_its_name": lambda: json.dumps({**rec, "run_id": "another"}),
        }[name]()
        path.write_text(text)
    elif content == "sparse":
        with open(path, "wb") as fh:
            fh.truncate(MAX_FILE_BYTES + 1)  # a hole: no disk used, never read
    elif content == "folder":
        path.mkdir()
    else:
        path.write_bytes(content)


@pytest.mark.parametrize("name", FILES)
def test_a_broken_file_is_damaged_with_a_one_line_reason_and_the_others_are_read(
        tmp_path: Path, name: str) -> None:
    out = copy_golden(tmp_path / "f")
    path = out / "runs" / GOLDEN_RUNS[0].name
    path.unlink()
    write_file(path, name)
    records, damaged = scan_records(out)
    assert len(records) == 11 and GOLDEN_RUNS[0].stem not in {r["run_id"] for r in records}
    assert [d.path for d in damaged] == [path]
    assert FILES[name][1] in damaged[0].reason and "\n" not in damaged[0].reason
    line = damaged[0].line()
    assert line.startswith(f"damaged: {path}: ") and line.isprintable()


def test_record_problems_of_a_real_record_are_none_and_status_is_checked() -> None:
    for i in range(len(GOLDEN_RUNS)):
        assert record_problems(golden(i), GOLDEN_RUNS[i].stem) == []
    for status in STATUSES:
        assert not any("status" in p for p in record_problems({**golden(), "status": status}))


# -- the commands on damaged folders ---------------------------------------------------------

def as_benchmark(out: Path) -> Path:
    """The golden folder's runs as benchmark-mode records (each with its step times), so
    predict has a 1-device step to start from."""
    for path in (out / "runs").glob("*.json"):
        rec = json.loads(path.read_text())
        ips = rec["images_per_sec"]
        rec.update(mode="benchmark", step_times_s=[rec["global_batch_size"] / ips] * 10)
        path.write_text(json.dumps(rec))
    return out


def mutants(base: Path, damaged: bool) -> list[Path]:
    """Into base/runs, one file per (field, kind) whose record the reader refuses (damaged) or
    reads, each under a run id of its own (so a read one is one more run, never a copy)."""
    written = []
    rec0 = json.loads((base / "runs" / GOLDEN_RUNS[0].name).read_text())
    for i, field in enumerate(FIELDS):
        for kind in KINDS:
            run_id = f"{rec0['run_id'][:-3]}__m{i}{kind}__r9"
            path = base / "runs" / f"{run_id}.json"
            path.write_text(with_field({**rec0, "run_id": run_id, "repeat": 9}, field, kind))
            if (read_record(path)[0] is None) == damaged:
                written.append(path)
            else:
                path.unlink()
    return written


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """clean / damaged / read (mutants the reader accepts) folders, converge and benchmark."""
    root = tmp_path_factory.mktemp("faults")
    made = {}
    for mode in ("converge", "benchmark"):
        for what in ("clean", "damaged", "read"):
            out = copy_golden(root / f"{mode}-{what}")
            if mode == "benchmark":
                as_benchmark(out)
            if what == "damaged":
                mutants(out, damaged=True)
                for name in FILES:
                    write_file(out / "runs" / f"{name}.json", name)
            elif what == "read":
                mutants(out, damaged=False)
            made[f"{mode}-{what}"] = out
    return made


@pytest.mark.parametrize("mode", ["converge", "benchmark"])
def test_report_names_each_damaged_file_once_and_uses_no_number_of_one(
        folders: dict[str, Path], mode: str) -> None:
    clean, damaged = folders[f"{mode}-clean"], folders[f"{mode}-damaged"]
    ref, proc = run_all(("report", str(clean)), ("report", str(damaged)))
    assert_clean_exit(ref)
    assert_clean_exit(proc)
    bad = scan_records(damaged)[1]
    assert len(bad) > 100
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("damaged: ")]
    assert sorted(lines) == sorted(d.line() for d in bad)
    assert (damaged / "summary.csv").read_text() == (clean / "summary.csv").read_text()
    assert proc.stdout.replace(str(damaged), "X") == ref.stdout.replace(str(clean), "X")
    page = (damaged / "report.html").read_text()  # a report mailed on names them too
    assert "<h2>Damaged files</h2>" in page and page.count("<li>damaged: ") == len(bad)
    assert "<h2>Damaged files</h2>" not in (clean / "report.html").read_text()


@pytest.mark.parametrize("mode", ["converge", "benchmark"])
def test_compare_and_predict_name_each_damaged_file_and_never_fail_on_one(
        folders: dict[str, Path], mode: str, tmp_path: Path) -> None:
    clean, damaged = folders[f"{mode}-clean"], folders[f"{mode}-damaged"]
    bad = {d.line() for d in scan_records(damaged)[1]}
    ref, same, both, pred, pred_ref = run_all(
        ("compare", str(clean), str(clean), "--out", str(tmp_path / "ref")),
        ("compare", str(clean), str(damaged), "--out", str(tmp_path / "cmp")),
        ("compare", str(damaged), str(damaged), "--out", str(tmp_path / "both")),
        ("predict", str(damaged)), ("predict", str(clean)))
    for proc in (ref, same, both):
        assert_clean_exit(proc)
    assert {ln for ln in same.stderr.splitlines() if ln.startswith("damaged: ")} == bad
    assert sorted(ln for ln in both.stderr.splitlines() if ln.startswith("damaged: ")) == \
        sorted([*bad, *bad])  # once per side
    # the comparison itself is the clean folders': no number of a damaged file in it
    assert same.stdout.replace(str(damaged), str(clean)).replace(str(tmp_path / "cmp"), "O") \
        == ref.stdout.replace(str(tmp_path / "ref"), "O")
    assert_clean_exit(pred, (0,) if mode == "benchmark" else (2,))
    assert {ln for ln in pred.stderr.splitlines() if ln.startswith("damaged: ")} == bad
    assert pred.stdout.replace(str(damaged), "X") == pred_ref.stdout.replace(str(clean), "X")


@pytest.mark.parametrize("mode", ["converge", "benchmark"])
def test_records_the_reader_accepts_never_break_report_compare_or_predict(
        folders: dict[str, Path], mode: str, tmp_path: Path) -> None:
    """A value of the right kind in a surprising place (a string where real records hold
    null, a list in a list field): one more run, and every command ends without a traceback."""
    read = folders[f"{mode}-read"]
    records, damaged = scan_records(read)
    assert not damaged and len(records) > 12
    report, compare, predict = run_all(
        ("report", str(read)),
        ("compare", str(folders[f"{mode}-clean"]), str(read), "--out", str(tmp_path / "c")),
        ("predict", str(read)))
    assert_clean_exit(report)
    assert_clean_exit(compare, (0, 1))
    # (a mode of null reads as benchmark: predict may start from that run)
    assert_clean_exit(predict, (0,) if mode == "benchmark" else (0, 2))


ENVIRONMENTS = {
    "not_json": "{", "deep": _deep(100_000), "list": "[]", "gpus_a_string": '{"gpus": "A100"}',
    "gpu_name_a_list": '{"gpus": [{"name": [1]}]}', "pcie_gen_a_dict": (
        '{"gpus": [{"name": "A100", "pcie_max_gen": {"a": 1}, "pcie_max_width": 16}]}'),
}
CONFIGS = {
    "not_yaml": "until_stable: [", "deep": "[" * 100_000,
    "alias_bomb": "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)) + "until_stable: *i\n",
    "target_a_list": yaml.safe_dump({"until_stable": {"target_cv": [1]}}),
    "target_nan": "until_stable: {target_cv: .nan}\n",
    "not_utf8": "until_stable: \xff",
}


@pytest.mark.parametrize("env", ENVIRONMENTS)
def test_a_damaged_environment_json_is_damaged_with_a_one_line_reason(
        tmp_path: Path, env: str) -> None:
    (tmp_path / "environment.json").write_text(ENVIRONMENTS[env])
    got, damage = read_environment(tmp_path)
    assert got is None and damage is not None and "\n" not in damage.reason
    assert damage.line().startswith(f"damaged: {tmp_path / 'environment.json'}: ")


@pytest.mark.parametrize("env", ["deep", "pcie_gen_a_dict"])
def test_a_damaged_environment_json_is_named_and_the_commands_go_on(
        tmp_path: Path, env: str) -> None:
    out = as_benchmark(copy_golden(tmp_path / "f"))
    (out / "environment.json").write_text(ENVIRONMENTS[env])
    line = f"damaged: {out / 'environment.json'}: "
    procs = run_all(("report", str(out)), ("predict", str(out)),
                    ("compare", str(out), str(out), "--out", str(tmp_path / "c")))
    for proc, times in zip(procs, (1, 1, 2), strict=True):  # compare: the folder is both sides
        assert_clean_exit(proc)
        assert sum(ln.startswith(line) for ln in proc.stderr.splitlines()) == times, \
            proc.stderr


@pytest.mark.parametrize("config", CONFIGS)
def test_a_damaged_config_yaml_leaves_the_report_its_default_cv_target(
        tmp_path: Path, config: str) -> None:
    from bench.analysis.stats import CV_TARGET
    from bench.report.summary import cv_target

    text = CONFIGS[config]
    (tmp_path / "config.yaml").write_bytes(text.encode("latin-1") if config == "not_utf8"
                                           else text.encode())
    assert cv_target(tmp_path) == CV_TARGET


def test_report_of_a_folder_with_a_deeply_nested_config_yaml(tmp_path: Path) -> None:
    out = copy_golden(tmp_path / "f")
    (out / "config.yaml").write_text(CONFIGS["deep"])
    assert_clean_exit(run_cli("report", str(out)))


def test_cv_target_is_read_from_a_sound_config_yaml(tmp_path: Path) -> None:
    from bench.report.summary import cv_target

    (tmp_path / "config.yaml").write_text("until_stable: {target_cv: 0.03, max_repeats: 5}\n")
    assert cv_target(tmp_path) == 0.03


# -- --resume --------------------------------------------------------------------------------

def test_done_run_ids_leave_out_damaged_and_incomplete_records(tmp_path: Path) -> None:
    out = copy_golden(tmp_path / "f")
    ids = [p.stem for p in GOLDEN_RUNS]
    assert done_run_ids(out) == set(ids)
    (out / "runs" / f"{ids[0]}.json").write_text(json.dumps({"run_id": ids[0]}))
    (out / "runs" / f"{ids[1]}.json").write_text("{")
    (out / "runs" / f"{ids[2]}.json").write_text(with_field(golden(2), "runner", "null"))
    assert done_run_ids(out) == set(ids[3:])


TOY = [sys.executable, "-m", "tests.children.cli_with_toy"]


def test_resume_reruns_damaged_and_incomplete_records_and_keeps_them_beside(
        tmp_path: Path) -> None:
    """A real sweep (the toy runner, two instant runs); one record cut to its run_id, the other
    made not JSON, a stray damaged file beside them: --resume runs both again, keeps each
    damaged record as <name>.json.damaged, prints one line per damaged file."""
    cfg = tmp_path / "toy.yaml"
    cfg.write_text(yaml.safe_dump({
        "name": "toy", "runners": ["toy"], "models": ["probe"], "devices": [1, 2],
        "batch_size_per_device": 8, "warmup_steps": 1, "measure_steps": 3, "timeout_s": 60,
        "runner_options": {"toy": {"python": sys.executable, "behaviour": "ok"}}}))
    out = tmp_path / "out"

    def toy(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*TOY, "--config", str(cfg), "--out", str(out), *args], cwd=REPO,
                              capture_output=True, text=True, timeout=180,
                              env={**os.environ})

    first = toy()
    assert first.returncode == 0, first.stderr
    (one, two) = sorted((out / "runs").glob("*__r0.json"))
    one.write_text(json.dumps({"run_id": one.stem}))
    two.write_bytes(b"\xff not json")
    stray = out / "runs" / "stray.json"
    stray.write_text("[]")
    resumed = toy("--resume")
    assert_clean_exit(resumed)
    assert "2 runs, 0 already done" in resumed.stdout
    lines = [ln for ln in resumed.stderr.splitlines() if ln.startswith("damaged: ")]
    assert len(lines) == 3 and all(
        any(ln.startswith(f"damaged: {p}: ") for ln in lines) for p in (one, two, stray))
    assert json.loads(one.with_name(one.name + ".damaged").read_text()) == {"run_id": one.stem}
    assert two.with_name(two.name + ".damaged").read_bytes() == b"\xff not json"
    assert stray.read_text() == "[]"  # not a run of this sweep: left where it was
    records, damaged = scan_records(out)
    assert sorted(r["run_id"] for r in records) == [one.stem, two.stem]
    assert {r["status"] for r in records} == {"ok"} and [d.path for d in damaged] == [stray]
    # a second resume: nothing to run again, the stray file named again, nothing renamed
    again = toy("--resume")
    assert_clean_exit(again)
    assert "2 runs, 2 already done" in again.stdout
    assert [ln for ln in again.stderr.splitlines() if ln.startswith("damaged: ")] == \
        [f"damaged: {stray}: top level is a list, not an object "
         "(not a run of this sweep: left as it is)"]


def test_damaged_capacity_records_are_left_out_and_searched_again(tmp_path: Path) -> None:
    """Capacity mode's records (capacity/<search>.json) go through the same bounded reader: a
    deep, non-object or non-JSON one is no row of the table and its search is not done."""
    from bench.report.capacity import capacity_rows
    from bench.run.capacity import CAPACITY_DIR, load_capacity

    folder = tmp_path / "cap"
    (folder / CAPACITY_DIR).mkdir(parents=True)
    (folder / CAPACITY_DIR / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (folder / CAPACITY_DIR / "list.json").write_text("[1, 2]")
    (folder / CAPACITY_DIR / "text.json").write_bytes(b"\xff\xfe not json")
    assert load_capacity(folder) == [] and capacity_rows(folder) == []
    proc = run_cli("report", str(folder))
    assert proc.returncode in (0, 2) and "Traceback" not in proc.stdout + proc.stderr
