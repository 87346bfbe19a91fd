"""The declared config: `run_bench.py schema` prints the JSON Schema of a sweep file (runners,
models and every runner's options from the registry), the shipped configs validate against it,
and pydantic's own errors never reach the user."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.catalog.registry import PIPELINES, RUNNERS, runner_options
from bench.plan.config import KEYS, ConfigError, json_schema, validate
from models import available_models
from tests.helpers.cli import REPO, run_cli

BASE = {"runners": ["tf_mirrored"], "models": ["minigooglenet"], "devices": [1, 2],
        "batch_size_per_device": 32}
CONFIGS = sorted(p.stem for p in (REPO / "configs").glob("*.yaml"))


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    """What `run_bench.py schema` prints (one subprocess for the module)."""
    proc = run_cli("schema", timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _ref(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """node, or the definition its $ref (or its one non-null anyOf branch) points to."""
    if "anyOf" in node:
        [node] = [n for n in node["anyOf"] if n.get("type") != "null"]
    if "$ref" in node:
        return schema["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def _enum(node: dict[str, Any]) -> list[str]:
    """The enum of an axis: one value, or a list of them."""
    one, many = [n for n in node["anyOf"] if n.get("type") != "null"][:2]
    assert many["type"] == "array" and many["items"]["enum"] == one["enum"]
    return one["enum"]


def test_schema_prints_the_config_keys_with_runner_and_model_enums(schema: dict) -> None:
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert tuple(schema["properties"]) == KEYS and schema["additionalProperties"] is False
    props = schema["properties"]
    assert sorted(_enum(props["runners"])) == sorted(RUNNERS)
    # a model: a built-in's name or your own (a mapping); a list of either
    one, custom, many = props["models"]["anyOf"]
    assert one["enum"] == available_models() and custom["$ref"].endswith("/CustomModel")
    assert many["type"] == "array" and many["items"]["anyOf"] == [one, custom]
    entry = schema["$defs"]["CustomModel"]
    assert set(entry["required"]) == {"name", "framework", "build", "path", "input"}
    assert entry["properties"]["framework"]["enum"] == ["torch", "jax", "keras", "tf", "mxnet"]
    assert sorted(_enum(props["pipelines"])) == sorted(PIPELINES)
    assert _enum(props["precision"]) == ["fp32", "tf32", "bf16", "fp16"]
    devices = props["devices"]["anyOf"]
    assert devices[0] == {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}
    assert devices[1]["minItems"] == 1 and devices[1]["uniqueItems"] is True
    assert "models" in schema["required"]


def test_schema_declares_every_runners_options(schema: dict) -> None:
    options = _ref(schema, schema["properties"]["runner_options"])
    assert set(options["properties"]) == set(RUNNERS)
    assert options["additionalProperties"] is False
    for runner in RUNNERS:
        declared = _ref(schema, options["properties"][runner])
        assert list(declared["properties"]) == list(runner_options(runner)), runner
        assert declared["additionalProperties"] is False
    mirrored = _ref(schema, options["properties"]["tf_mirrored"])["properties"]
    # an option: a value, or a list of them (an option axis, one run per value)
    one, axis = mirrored["xla"]["anyOf"]
    assert one["type"] == "boolean" and mirrored["xla"]["default"] is False
    assert axis["type"] == "array" and axis["items"] == one and axis["minItems"] == 1
    assert mirrored["data_format"]["anyOf"][0]["enum"] == ["channels_last", "channels_first"]
    assert mirrored["data_format"]["description"] == "tensor layout"
    # a COMMON option (the launcher's) is one value, never an axis
    assert "array" not in json.dumps(mirrored["python"])


@pytest.mark.parametrize("name", CONFIGS)
def test_shipped_configs_validate_against_the_schema(name: str) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    doc = yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())
    jsonschema.validate(doc, json_schema())


def test_the_schema_refuses_what_the_loader_refuses(real_dataset: Path) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema = json_schema()
    # a resolved config (every default written out) is a valid file too
    cfg = validate({**BASE, "data": ["synthetic", "real"], "until_stable": {"target_cv": 0.1},
                    "repeats": 2, "dataset": {"path": str(real_dataset)}})
    jsonschema.validate(cfg.to_dict(), schema)
    for bad in ({"runners": ["tf_mirored"]}, {"devices": [0]}, {"measure_step": 10},
                {"runner_options": {"tf_mirrored": {"xal": True}}}, {"precision": "fp8"},
                {"runner_options": {"tf_mirrored": {"data_format": "nchw"}}},
                {"devices": [2, 2]}, {"telemetry": {"interval_s": 0}}, {"name": "a b"},
                {"runner_options": {"tf_mirrored": {"xla": []}}},
                {"runner_options": {"tf_mirrored": {"xla": [True, True]}}},
                {"runner_options": {"tf_mirrored": {"python": ["a", "b"]}}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**BASE, **bad}, schema)
        with pytest.raises(ConfigError):
            validate({**BASE, **bad})


@pytest.mark.parametrize("changes, message", [
    ({"runner_options": {"tf_mirrored": []}},
     "runner_options.tf_mirrored: [] is not allowed; allowed: a mapping of option to value"),
    ({"runner_options": {"tf_mirrored": {"xla": None}}},
     "runner_options.tf_mirrored.xla: None is not allowed; allowed: bool"),
    ({"runner_options": {"tf_mirrored": {"steps_per_execution": 2**63}}},
     "runner_options.tf_mirrored.steps_per_execution: 9223372036854775808 is not allowed; "
     "allowed: an integer from 1 to 10000"),
    ({"runner_options": {"tf_mirrored": {"python": "a\x00b"}}},
     "runner_options.tf_mirrored.python: 'a\\x00b' is not allowed; allowed: a string without "
     "NUL characters"),
    ({"runner_options": []},
     "runner_options: [] is not allowed; allowed: a mapping of runner name to its options"),
    ({"devices": {"a": 1}}, "devices: {'a': 1} is not allowed; allowed: a value or a list of "
     "values"),
    ({"devices": 2**63}, "devices: 9223372036854775808 is not allowed; allowed: an integer "
     "from 1 to 2**63 - 1"),
    ({"scaling": "strnog"}, "scaling: 'strnog' is not allowed (did you mean 'strong'?); "
     "allowed: weak, strong"),
    ({"models": ["minigooglenet", 7]}, "models: 7 is not allowed; allowed: a built-in model "
     "(gpt2, gpt2_tiny, minigooglenet, probe, resnet50, small_cnn, vit_b16, vit_tiny) or a "
     "mapping (your own model: name, framework, build, path, input)"),
    ({"dataset": {"workers": 1}}, "dataset.path: missing; this key is required"),
    ({"until_stable": {"target_cv": float("nan")}}, "until_stable.target_cv: nan is not "
     "allowed; allowed: a number between 0 and 1 (0.02 = 2%)"),
    ({"telemetry": {1: 2}}, "telemetry[1]: 2 is not allowed; allowed: keys enabled, "
     "interval_s, starved_below_pct"),
    ({None: 1}, "unknown key None; allowed keys: " + ", ".join(KEYS)),
])
def test_pydantic_errors_become_the_one_line_message(changes: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate({**BASE, **changes})
    assert str(info.value) == message


def test_options_whose_default_is_none_take_none_and_the_rest_keep_their_defaults() -> None:
    cfg = validate({**BASE, "runners": ["tf_mirrored", "tf_cnn_benchmarks"],
                    "runner_options": {"tf_cnn_benchmarks": {"variable_update": None},
                                       "tf_mirrored": None}})
    assert cfg.runner_options["tf_cnn_benchmarks"]["variable_update"] is None
    assert cfg.runner_options["tf_mirrored"] == {
        name: opt.default for name, opt in runner_options("tf_mirrored").items()}


def test_the_child_side_never_imports_pydantic() -> None:
    """Runners and what they import run in the framework environments, which lack pydantic:
    only the parent's config module uses it."""
    script = ("import sys, runners.common, bench.catalog.registry, bench.plan.runs, "
              "bench.run.launch; "
              "print('pydantic' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "False", proc.stdout + proc.stderr
