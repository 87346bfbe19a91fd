"""A fresh interpreter that adds toy settings as a developer would, before anything reads them:
a `Setting` each in contract/settings.py's SETTINGS, and the field each in the written
dataclasses (SweepConfig for a key, Spec for a spec setting), loaded from their own source with
the fields appended. Prints what reached the config, schema, plan, spec and record as JSON
(tests/test_settings.py)."""

import ast
import importlib.util
import json
import sys
from pathlib import Path

from contract import settings
from contract.settings import Key, Setting

REPO = Path(__file__).resolve().parents[2]

settings.SETTINGS += (
    Setting("toy_steps", int, 3, "Toy steps each run takes.", Key(help="toy steps",
            minimum=0)),
    Setting("toy_ratio", float, 0.5, "A toy ratio.", Key(minimum=0.0, maximum=1.0),
            record=False),
    Setting("toy_kind", str, "a", "A toy kind.", Key(choices=("a", "b"))),
    Setting("toy_flag", bool, False, "A sweep-only toy flag.", Key(), spec=False),
)


def with_fields(module: str, path: str, cls: str, lines: list[str]) -> None:
    """Import `module` from its file with `lines` appended to class `cls`'s fields (before
    any module that imports it: those see the toy fields)."""
    file = REPO / path
    source = file.read_text().splitlines(keepends=True)
    node = next(n for n in ast.parse("".join(source)).body
                if isinstance(n, ast.ClassDef) and n.name == cls)
    last = max(n.end_lineno or 0 for n in node.body if isinstance(n, ast.AnnAssign))
    source[last:last] = [f"    {line}\n" for line in lines]
    spec = importlib.util.spec_from_file_location(module, file)
    assert spec is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[module] = mod
    exec(compile("".join(source), str(file), "exec"), mod.__dict__)  # noqa: S102


with_fields("contract.spec", "contract/spec.py", "Spec",
            ["toy_steps: int = 3", "toy_ratio: float = 0.5", "toy_kind: str = 'a'"])
with_fields("bench.plan.config.sweep_config", "bench/plan/config/sweep_config.py",
            "SweepConfig", ["toy_steps: int", "toy_ratio: float", "toy_kind: str",
                            "toy_flag: bool"])

from dataclasses import fields  # noqa: E402

from bench.plan.config import KEYS, ConfigError, SweepConfig, json_schema, validate  # noqa: E402
from bench.plan.runs import expand  # noqa: E402
from bench.records import columns  # noqa: E402
from bench.run.launch import base_record  # noqa: E402
from contract.spec import Spec, spec_for  # noqa: E402

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
