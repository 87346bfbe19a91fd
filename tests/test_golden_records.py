"""Golden records (tests/golden_records.py): the shape a record is held to, the conditions a
captured golden derives, and the check's verdicts; and the golden files themselves, one per
runner and mode the family tests run, for every family."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.catalog.registry import RUNNERS
from contract.result import JSON_TYPES
from tests import golden_records as gr

FAMILIES = ("tf", "torch", "jax", "mxnet", "horovod", "cntk")


def record(status: str = "ok", n: int = 1, **result: object) -> dict:
    """A record of tf_mirrored's shape, cut down: a few top-level fields and a result."""
    return {"schema_version": 1, "runner": "tf_mirrored", "mode": "benchmark", "status": status,
            "num_devices": n, "images_per_sec": 10.0 if status == "ok" else None,
            "memory_per_device": {f"process0:cpu:{i}": 100 for i in range(n)},
            "options": {"xla": False}, "result": dict(result)}


def test_the_shape_flattens_the_child_s_fields_and_maps_by_their_values() -> None:
    shape = gr.shape(record(curve=[{"epoch": 1, "accuracy": 0.5}], placement={"cpu:0": 3}))
    assert shape["result.curve[].accuracy"] == {"number"}
    assert shape["result.placement{}"] == {"integer"}  # keyed by device: its values only
    assert shape["memory_per_device{}"] == {"integer"}
    assert shape["options"] == {"object"} and "options.xla" not in shape  # the parent's own


def test_a_field_only_some_records_have_gets_the_condition_that_explains_it() -> None:
    records = [record("ok", 1, batchnorm="global"), record("ok", 2, batchnorm="global"),
               record("failed", 1), record("failed", 2)]
    fields = gr.golden(records)
    assert fields["result.batchnorm"] == {"types": ["string"], "when": [{"status": "ok"}]}
    assert fields["images_per_sec"] == {"types": ["null", "number"], "when": "always"}
    rare = gr.golden([record(xla=True), record(), record()])  # nothing says which: optional
    assert rare["result.xla"]["when"] == "optional"


def test_a_golden_holds_its_own_records_and_names_what_differs() -> None:
    records = [record("ok", 1, batchnorm="global"), record("failed", 2)]
    fields = gr.golden(records)
    assert all(gr.problems(r, fields) == [] for r in records)
    missing = record("ok", 1)
    assert gr.problems(missing, fields) == [
        "tf_mirrored.benchmark: field 'result.batchnorm' is missing (its golden record has it "
        'when [{"status": "ok"}])']
    extra = record("ok", 1, batchnorm="global", batchnrom="global")
    assert gr.problems(extra, fields) == [
        "tf_mirrored.benchmark: field 'result.batchnrom' (string) is not in its golden record"]
    retyped = record("ok", 1, batchnorm=1)
    assert gr.problems(retyped, fields) == [
        "tf_mirrored.benchmark: field 'result.batchnorm' is integer, its golden record says "
        "string"]


def test_a_record_without_a_golden_file_is_a_problem() -> None:
    rec = {**record(), "runner": "no_such_runner"}
    [problem] = gr.check(rec)
    assert problem.startswith("no_such_runner.benchmark: no golden record")


def test_only_the_tests_the_goldens_were_captured_from_are_checked(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(gr.MODE_VAR, raising=False)
    captured = frozenset({"tests/test_tf_mirrored.py::test_x"})
    assert gr.in_scope("tests/test_tf_mirrored.py::test_x", ["slow", "framework"], captured)
    assert not gr.in_scope("tests/test_tf_mirrored.py::test_y", ["slow"], captured)
    assert not gr.in_scope("tests/test_tf_mirrored.py::test_x", ["slurm"], captured)
    monkeypatch.setenv(gr.MODE_VAR, "write")
    assert gr.in_scope("tests/test_tf_mirrored.py::test_y", ["slow"], captured)
    assert set(gr.captured_tests()) >= {"tests/test_cli.py::test_keras_cntk_is_listed_and_"
                                        "recorded_unavailable"}


def golden_files() -> list[Path]:
    files = sorted(gr.GOLDEN.glob("*.json"))
    assert files, f"no golden records in {gr.GOLDEN}"
    return files


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_has_golden_records(family: str) -> None:
    names = {json.loads(p.read_text())["runner"] for p in golden_files()}
    assert any(RUNNERS[n].family == family for n in names if n in RUNNERS), family


def test_each_golden_file_is_a_runner_s_with_json_types() -> None:
    for path in golden_files():
        golden = json.loads(path.read_text())
        assert path.stem == f"{golden['runner']}.{golden['mode']}"
        assert golden["runner"] in RUNNERS and golden["records"] > 0 and golden["fields"]
        for name, field in golden["fields"].items():
            assert field["types"] and set(field["types"]) <= set(JSON_TYPES), (path, name)
            assert field["when"] in ("always", "optional") or isinstance(field["when"], list)
        assert golden["fields"]["status"]["when"] == "always", path
