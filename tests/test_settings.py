"""The run settings are declared once (contract/settings.py): the config's keys, its model and
JSON Schema, SweepConfig, the child's Spec, what the plan copies into every run and the
record's spec fields are all derived from the declaration, so adding a setting is one entry
there (plus the code that reads it)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from dataclasses import MISSING, fields
from pathlib import Path

from bench.plan.config import BATCH_KEYS, KEYS, SweepConfig, json_schema, sweep_model, validate
from bench.plan.runs import RunSpec, expand
from bench.records import columns
from contract import settings
from contract.settings import REQUIRED, SETTINGS
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


def test_the_spec_is_the_declared_spec_settings_in_the_spec_json_s_order() -> None:
    declared = settings.spec_settings()
    assert [f.name for f in fields(Spec)] == [s.name for s in declared]
    assert {f.name for f in fields(Spec)} == {s.name for s in SETTINGS if s.spec}
    # the spec JSON's keys keep their order
    assert [f.name for f in fields(Spec)] == list(settings.SPEC_ORDER)
    for f, s in zip(fields(Spec), declared, strict=True):
        assert f.type == s.type, s.name
        if s.default is REQUIRED:
            assert f.default is MISSING and f.default_factory is MISSING, s.name
        elif f.default_factory is not MISSING:
            assert f.default_factory() == s.default, s.name
        else:
            assert f.default == s.default, s.name
    assert [f.name for f in fields(RunSpec)] == [f.name for f in fields(Spec)]


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


TOY = """
import json, sys
from contract import settings
from contract.settings import Key, Setting

settings.SETTINGS += (
    Setting("toy_steps", int, 3, "Toy steps each run takes.", Key(help="toy steps",
            minimum=0)),
    Setting("toy_ratio", float, 0.5, "A toy ratio.", Key(minimum=0.0, maximum=1.0),
            record=False),
    Setting("toy_kind", str, "a", "A toy kind.", Key(choices=("a", "b"))),
    Setting("toy_flag", bool, False, "A sweep-only toy flag.", Key(), spec=False),
)

from dataclasses import fields
from pathlib import Path
from bench.plan.config import ConfigError, KEYS, SweepConfig, json_schema, validate
from bench.plan.runs import expand
from bench.records import columns
from bench.run.launch import base_record
from contract.spec import Spec, spec_for

base = {"runners": ["tf_mirrored"], "models": ["minigooglenet"], "devices": [1, 2],
        "batch_size_per_device": 8}
errors = {}
for key, value in [("toy_steps", -1), ("toy_ratio", 2.5), ("toy_kind", "c"),
                   ("toy_flag", "yes"), ("toy_stesp", 1)]:
    try:
        validate({**base, key: value})
    except ConfigError as exc:
        errors[key] = str(exc)
cfg = validate({**base, "toy_steps": 7, "toy_ratio": 0.25, "toy_kind": "b",
                "toy_flag": True})
runs = expand(cfg, "s")
schema = json_schema()
print(json.dumps({
    "keys": list(KEYS),
    "schema": {k: schema["properties"][k] for k in KEYS if k.startswith("toy_")},
    "sweep_fields": [f.name for f in fields(SweepConfig)],
    "config": {k: getattr(cfg, k) for k in ("toy_steps", "toy_ratio", "toy_kind",
                                            "toy_flag")},
    "spec_fields": [f.name for f in fields(Spec)],
    "spec_defaults": {k: getattr(spec_for(), k) for k in ("toy_steps", "toy_ratio",
                                                          "toy_kind")},
    "runs": [{k: getattr(r, k) for k in ("toy_steps", "toy_ratio", "toy_kind")}
             for r in runs],
    "spec_json": json.loads(json.dumps(runs[0].to_dict())),
    "record": {k: v for k, v in base_record(runs[0], {}, Path("x.log")).items()
               if k.startswith("toy_")},
    "spec_view": [k for k in columns.keys("spec") if k.startswith("toy_")],
    "markdown": [line for line in columns.markdown().splitlines() if "toy_" in line],
    "errors": errors,
}))
"""


def test_a_setting_declared_once_reaches_the_model_schema_spec_plan_and_record() -> None:
    """A toy setting added to SETTINGS alone (in a fresh interpreter, before anything reads
    it) is a key of the config with its type, default and words, a field of SweepConfig and
    of the Spec, copied into every run and, where recorded, into the record."""
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(TOY)], cwd=REPO,
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
