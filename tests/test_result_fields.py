"""The declared result (contract/result.py FIELDS): every field a child may report, its JSON
types and meaning; runners.common.main fails a run whose result has a field not declared or of
another type, naming it; bench/records/columns.py takes the per-run fields' meanings from it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench.plan.runs import RunSpec
from bench.records import columns
from bench.run.launch import launch
from contract import result
from contract.result import FIELDS, JSON_TYPES, as_written, mismatch


def test_every_declared_field_has_json_types_and_a_meaning() -> None:
    assert len(FIELDS) > 100
    for name, field in FIELDS.items():
        assert field.name == name and name.isidentifier()
        assert field.types and set(field.types) <= set(JSON_TYPES), name
        assert field.meaning.strip() and "\n" not in field.meaning, name


def test_a_declared_result_passes() -> None:
    assert mismatch(as_written({"status": "ok", "images_per_sec": 12.5, "samples": 40,
                                "step_times_s": [0.1], "reason": None})) is None


@pytest.mark.parametrize(("fields", "reason"), [
    ({"images_per_sek": 12.5},
     "result field 'images_per_sek' is not declared in contract/result.py"),
    ({"status": "ok", "samples": 40.5},
     "result field 'samples' is number, not integer as declared in contract/result.py"),
    ({"step_times_s": {"0": 0.1}},
     "result field 'step_times_s' is object, not array as declared in contract/result.py"),
    ({"images_per_sec": True}, "result field 'images_per_sec' is boolean, not number or null "
                               "as declared in contract/result.py"),
])
def test_an_undeclared_or_mistyped_field_is_named(fields: dict, reason: str) -> None:
    assert mismatch(as_written(fields)) == reason


def test_an_integer_is_a_number_but_not_the_reverse() -> None:
    assert mismatch({"window_s": 3}) is None
    assert mismatch({"timed_steps": 3.0}) is not None


def test_as_written_reads_values_as_the_result_file_holds_them() -> None:
    assert as_written({"devices": ("cpu:0", Path("/x"))}) == {"devices": ["cpu:0", "/x"]}


def test_the_record_s_child_fields_are_declared_and_share_their_meanings() -> None:
    """Every field the record copies from the child is declared; a per-run field (no summary
    table shows it) has the declaration's meaning, read from here."""
    for col in columns.of_view("child"):
        assert col.key in FIELDS, col.key
        if not set(col.views) & {"csv", *columns.DISPLAY_VIEWS}:
            assert col.meaning == FIELDS[col.key].meaning, col.key


def toy_spec(field: str, value: object) -> RunSpec:
    return RunSpec(
        run_id=f"fields-{field or 'none'}", sweep_id="t", runner="toy", family="host",
        module="tests.children.result_fields", model="probe", num_devices=1, device="cpu",
        virtual_devices=True, scaling="weak", batch_size_per_device=8, global_batch_size=8,
        data="synthetic", precision="fp32", warmup_steps=0, measure_steps=1, repeat=0,
        timeout_s=60, options={"field": field, "value": json.dumps(value)})


@pytest.mark.parametrize(("field", "value", "status", "reason"), [
    ("", None, "ok", None),
    ("first_los", 2.5, "failed",
     "result field 'first_los' is not declared in contract/result.py"),
    ("timed_steps", "1", "failed",
     "result field 'timed_steps' is string, not integer as declared in contract/result.py"),
])
def test_main_fails_a_run_whose_result_has_an_undeclared_field(
        tmp_path: Path, field: str, value: object, status: str, reason: str | None) -> None:
    """Through runners.common.main in a real child: the run fails at once, the reason naming
    the field (a result of declared fields is ok)."""
    rec = launch(toy_spec(field, value), sys.executable, tmp_path, {"host": "test"})
    assert (rec["status"], rec["reason"]) == (status, reason)
    assert rec["result"]["threads"], "the failed result keeps what main adds"


def test_the_module_keeps_join() -> None:
    assert result.join({"a": 1}, {"b": 2}) == {"a": 1, "b": 2}


def test_evidence_fields_are_checked_by_name_only() -> None:
    from contract.result import EVIDENCE_NAMES

    assert "compiled_graphs" in EVIDENCE_NAMES and "timed_steps" not in EVIDENCE_NAMES
    assert mismatch({"compiled_graphs": 3}) is None
    assert mismatch({"replicas": "two"}) is None  # its shape is the golden records' to check
    assert "not declared" in (mismatch({"replica": 2}) or "")
