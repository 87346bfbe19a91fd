"""The run settings are declared once (contract/settings.py): the config's keys, its model and
JSON Schema, SweepConfig, the child's Spec, what the plan copies into every run and the
record's spec fields are all derived from the declaration, so adding a setting is one entry
there (plus the code that reads it)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

import pytest

from bench.plan.config import BATCH_KEYS, KEYS, SweepConfig, json_schema, sweep_model, validate
from bench.plan.config.sweep_config import sweep_fields
from bench.plan.runs import RunSpec, expand
from bench.records import columns
from contract import settings
from contract.settings import REQUIRED, SETTINGS, Key, Setting
from contract.spec import Spec
from tests.helpers.cli import REPO

BASE = {"runners": ["tf_mirrored"], "models": ["minigooglenet"], "devices": [1, 2],
        "batch_size_per_device": 8}


def test_the_declaration_is_stdlib_only() -> None:
    """runners.common builds the Spec from it inside framework environments."""
    tree = ast.parse(Path(settings.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported and {m.split(".")[0] for m in imported} <= sys.stdlib_module_names


def test_the_declaration_is_well_formed() -> None:
    names = [s.name for s in SETTINGS]
    assert len(names) == len(set(names)), "a setting twice"
    assert len(KEYS) == len(set(KEYS)), "a key twice"
    for s in SETTINGS:
        assert s.help.strip(), s.name
        assert s.spec or s.key is not None, f"{s.name}: neither a key nor a spec field"
        if s.key is not None and s.key.choices and s.key_default not in (None, REQUIRED):
            given = s.key_default if s.key.axis else [s.key_default]
            assert set(given) <= set(s.key.choices), s.name


def differences(cls: type, declared: list[tuple[str, Any, Any]]) -> list[str]:
    """What differs between a written dataclass's fields and the declared ones, (name, type,
    default: REQUIRED for none) in order: a line per field, naming it; [] when equal."""
    def default(f: Any) -> Any:
        if f.default_factory is not MISSING:
            return f.default_factory()
        return REQUIRED if f.default is MISSING else f.default
    written = {f.name: (f.type, default(f)) for f in fields(cls)}
    wanted = {name: (kind, value) for name, kind, value in declared}
    out = [f"{cls.__name__}.{n}: declared in contract/settings.py, not written in the class"
           for n in wanted if n not in written]
    out += [f"{cls.__name__}.{n}: written in the class, not declared in contract/settings.py"
            for n in written if n not in wanted]
    for name in [n for n in wanted if n in written]:
        (kind, value), (want_kind, want_value) = written[name], wanted[name]
        if kind != want_kind:
            out.append(f"{cls.__name__}.{name}: type {kind}, declared {want_kind}")
        if value is not want_value and value != want_value:
            out.append(f"{cls.__name__}.{name}: default {value!r}, declared {want_value!r}")
    if not out and list(written) != list(wanted):
        out.append(f"{cls.__name__}: fields in the order {list(written)}, declared "
                   f"{list(wanted)}")
    return out


def declared_spec() -> list[tuple[str, Any, Any]]:
    """The Spec's fields as contract/settings.py declares them, in the spec JSON's order."""
    return [(s.name, s.type, s.default) for s in settings.spec_settings()]


def declared_sweep() -> list[tuple[str, Any, Any]]:
    """SweepConfig's fields as contract/settings.py declares them (none has a default)."""
    return [(name, kind, REQUIRED) for name, kind in sweep_fields()]


def test_the_written_spec_and_sweepconfig_are_the_declared_settings() -> None:
    """Spec and SweepConfig are written out (so editors and mypy see their fields); each is
    what contract/settings.py declares: names, order, types and defaults."""
    assert not differences(Spec, declared_spec()), "\n".join(differences(Spec, declared_spec()))
    assert not differences(SweepConfig, declared_sweep()), \
        "\n".join(differences(SweepConfig, declared_sweep()))
    # the spec JSON's keys keep their order
    assert [f.name for f in fields(Spec)] == list(settings.SPEC_ORDER)
    assert {f.name for f in fields(Spec)} == {s.name for s in SETTINGS if s.spec}
    assert [f.name for f in fields(RunSpec)] == [f.name for f in fields(Spec)]


def test_a_setting_declared_and_not_written_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """A setting added to the declaration alone fails the check above, naming its field; a
    field whose type or default drifts is named too."""
    drifted = [(n, float if n == "num_nodes" else k, 2 if n == "mode" else v)
               for n, k, v in declared_spec()]
    assert differences(Spec, drifted) == ["Spec.mode: default 'benchmark', declared 2",
                                          f"Spec.num_nodes: type {int}, declared {float}"]
    monkeypatch.setattr(settings, "SETTINGS", SETTINGS + (
        Setting("toy_steps", int, 3, "Toy steps.", Key(minimum=0)),))
    assert differences(Spec, declared_spec()) == [
        "Spec.toy_steps: declared in contract/settings.py, not written in the class"]
    assert differences(SweepConfig, declared_sweep()) == [
        "SweepConfig.toy_steps: declared in contract/settings.py, not written in the class"]


def test_the_config_model_schema_and_sweepconfig_are_the_declared_keys() -> None:
    declared = settings.config_settings()
    assert tuple(s.key_name for s in declared) == KEYS
    assert tuple(sweep_model().model_fields) == KEYS
    props = json_schema()["properties"]
    assert tuple(props) == KEYS
    for s in declared:
        assert props[s.key_name].get("description", "") == s.key.help, s.key_name
        default = s.key_default
        if default is REQUIRED:
            assert s.key_name in json_schema()["required"]
        elif s.key_name != "runner_options":  # a factory: no default in the schema
            got = props[s.key_name]["default"]
            assert got == default or isinstance(default, dict) and default.items() <= \
                got.items(), s.key_name
    assert {f.name for f in fields(SweepConfig)} == \
        {*KEYS} - set(BATCH_KEYS) | {"batch_sizes"}


def test_the_record_s_spec_fields_are_the_declared_recorded_settings() -> None:
    assert set(columns.keys("spec")) == set(settings.recorded())
    for col in columns.of_view("spec"):
        assert col.meaning == settings.setting(col.key).help, col.key
    for key in {s.name for s in SETTINGS if s.spec and not s.record}:
        assert key not in columns.keys("spec")


def test_every_run_takes_the_copied_settings_from_the_config(tmp_path) -> None:
    (tmp_path / "manifest.json").write_text('{"classes": 10}')
    cfg = validate({**BASE, "warmup_steps": 2, "measure_steps": 3, "timeout_s": 9.5,
                    "device": "gpu", "scaling": "weak", "mode": ["pipeline", "benchmark"],
                    "dataset": {"path": str(tmp_path)}, "pipelines": ["pil_loop"]})
    copied = {s.name for s in settings.copied()}
    assert copied == {"device", "scaling", "warmup_steps", "measure_steps", "timeout_s"}
    runs = expand(cfg, "s")
    assert {r.mode for r in runs} == {"pipeline", "benchmark"}
    for run in runs:
        # a pipeline run times pipeline_steps batches
        want = {"measure_steps": cfg.pipeline_steps} if run.mode == "pipeline" else {}
        for name in copied:
            assert getattr(run, name) == want.get(name, getattr(cfg, name)), (run.mode, name)


def test_a_setting_declared_once_reaches_the_model_schema_spec_plan_and_record() -> None:
    """A toy setting declared in SETTINGS and written in SweepConfig and the Spec (in a fresh
    interpreter, before anything reads them: tests/children/toy_setting.py) is a key of the
    config with its type, default and words, copied into every run and, where recorded, into
    the record."""
    proc = subprocess.run([sys.executable, "-m", "tests.children.toy_setting"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    toys = ["toy_steps", "toy_ratio", "toy_kind", "toy_flag"]
    assert got["keys"][-4:] == toys and got["sweep_fields"][-4:] == toys
    assert got["schema"] == {
        "toy_steps": {"default": 3, "description": "toy steps", "maximum": 2**63 - 1,
                      "minimum": 0, "title": "Toy Steps", "type": "integer"},
        "toy_ratio": {"default": 0.5, "maximum": 1.0, "minimum": 0.0, "title": "Toy Ratio",
                      "type": "number"},
        "toy_kind": {"default": "a", "enum": ["a", "b"], "title": "Toy Kind",
                     "type": "string"},
        "toy_flag": {"default": False, "title": "Toy Flag", "type": "boolean"},
    }
    assert got["config"] == {"toy_steps": 7, "toy_ratio": 0.25, "toy_kind": "b",
                             "toy_flag": True}
    assert got["spec_fields"][-3:] == ["toy_steps", "toy_ratio", "toy_kind"]
    assert got["spec_defaults"] == {"toy_steps": 3, "toy_ratio": 0.5, "toy_kind": "a"}
    assert got["runs"] and all(r == {"toy_steps": 7, "toy_ratio": 0.25, "toy_kind": "b"}
                               for r in got["runs"])
    assert list(got["spec_json"])[-3:] == ["toy_steps", "toy_ratio", "toy_kind"]
    assert got["record"] == {"toy_steps": 7, "toy_kind": "b"}  # toy_ratio: record=False
    assert got["spec_view"] == ["toy_steps", "toy_kind"]
    assert got["markdown"] == ["| `toy_steps` | spec | Toy steps each run takes. |",
                               "| `toy_kind` | spec | A toy kind. |"]
    assert got["errors"] == {
        "toy_steps": "toy_steps: -1 is not allowed; allowed: an integer >= 0",
        "toy_ratio": "toy_ratio: 2.5 is not allowed; allowed: a number from 0.0 to 1.0",
        "toy_kind": "toy_kind: 'c' is not allowed; allowed: a, b",
        "toy_flag": "toy_flag: 'yes' is not allowed; allowed: true or false",
        "toy_stesp": "unknown key 'toy_stesp' (did you mean 'toy_steps'?); allowed keys: "
                     + ", ".join([*KEYS, *toys]),
    }
