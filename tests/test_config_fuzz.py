"""Property-based tests of the config loader: whatever YAML document or `--set` string a user
gives, load_config ends in a SweepConfig or a one-line ConfigError naming a key, never in
another exception (and the CLI in exit 0, or exit 2 with one line on stderr)."""

from __future__ import annotations

import atexit
import copy
import json
import math
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.catalog.registry import PIPELINES, RUNNERS, runner_options
from bench.plan.config import KEYS, ConfigError, SweepConfig, load_config, model_name, validate
from bench.plan.runs import expand
from tests.helpers.cli import REPO, run_cli

SMOKE = REPO / "configs" / "cpu-smoke.yaml"
SMOKE_TEXT = SMOKE.read_text(encoding="utf-8")
SMOKE_RAW: dict[str, Any] = yaml.safe_load(SMOKE_TEXT)

# a folder that passes as a prepared dataset (validation reads only its manifest), so that
# real-data and pipeline-mode configs get past dataset.path
_DATASET = Path(tempfile.mkdtemp(prefix="config-fuzz-"))
atexit.register(shutil.rmtree, _DATASET, True)
(_DATASET / "manifest.json").write_text(json.dumps({"classes": 10}))

IN_PROCESS = settings(max_examples=200, deadline=None, database=None,
                      suppress_health_check=[HealthCheck.too_slow])
# no NUL (argv cannot carry it) and no lone surrogates (a file cannot hold them in UTF-8)
TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
               max_size=20)

# every key path the config reads: top-level keys, nested mappings, every option of a runner
KEY_PATHS = sorted(
    set(KEYS)
    | {f"dataset.{k}" for k in ("path", "augmentation", "workers")}
    | {f"until_stable.{k}" for k in ("target_cv", "max_repeats")}
    | {f"telemetry.{k}" for k in ("enabled", "interval_s", "starved_below_pct")}
    | {f"runner_options.{r}" for r in RUNNERS}
    | {f"runner_options.tf_mirrored.{o}" for o in runner_options("tf_mirrored")}
    | {"runner_options.tf_mirored", "runner_options.tf_mirrored.xal", "datasets", "runner"}
)

# values a config plausibly holds, right and wrong, next to arbitrary ones
PLAUSIBLE = st.sampled_from([
    "tf_mirrored", "torch_ddp", "toy", "minigooglenet", "resnet50", "probe", 1, 2, 8, 0, -1,
    [1, 2], [2, 2], [1, 1.0], ["tf_mirrored", "tf_mirrored"], ["fp32", "bf16", "fp32"],
    "real", "synthetic", ["synthetic", "real"], "pipeline", ["pipeline", "benchmark"],
    ["pipeline", "pipeline"], "benchmark", "gpu", "cpu", "weak", "strong", ["weak"], True,
    False, None, "", "~", "~nosuchuser/x", "/nonexistent", "a\x00b", "x" * 5000,
    str(_DATASET), {"path": str(_DATASET)}, {"path": str(_DATASET), "workers": [1, 1]},
    {"target_cv": 0.05}, {"tf_mirrored": {"xla": True}}, {"tf_mirored": {}}, list(PIPELINES),
    float("nan"), float("inf"), -0.0, 1e308, 10**30, [], {}, [[]], [{}], "fp16", "tf32",
    {"minigooglenet": 8}, {"default": [2, 4]}, {"resnet50": 0, "default": 1},  # batch per model
])
SCALARS = (st.none() | st.booleans() | st.integers() | st.floats() | TEXT)
# YAML source of values that PyYAML resolves and then fails to build, or that nest deeply
RAW_YAML = st.sampled_from([
    "2024-13-01", "2024-02-30 12:00:00", "!!int abc", "!!float x", "!!binary xyz!", "!!timestamp 1",
    "1" * 5000, "0x" + "f" * 5000, "!!python/object:os.system x", "*undefined", "&a [*a]",
    "[" * 3000 + "]" * 3000, "{a: 1, a: 2}", "!!set {a, a}", "<<: 1", "{<<: {a: 1}, a: 2}",
    "!!omap [a: 1, a: 2]", "\"\\ud800\"", "\"\\x00\"", "? [a]\n: 1", "!!str", "%TAG ! x\n---",
    "'unterminated", "\t1", "@x", "`x", "|\n  a\n b", ".nan", "-.inf", "0o777", "0b101", "1_0",
    "190:20:30", "~", "null", "Yes", "off", "!!null x", "!!bool maybe",
]) | TEXT
# dataset.path values: absent, odd or unreadable, next to the one prepared folder
PATHS = st.sampled_from([
    str(_DATASET), "~nosuchuser/data", "~", "a\x00b", "x" * 5000, "/" + "x/" * 3000, "/proc/1",
    "/root/.ssh/nope", "", ".", "/dev/null", "/etc/passwd/x",
]) | TEXT
VALUES = st.recursive(
    SCALARS | PLAUSIBLE,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(TEXT | st.sampled_from(KEY_PATHS), children, max_size=4),
    max_leaves=12,
)

# a message names a key: it starts with a config key (or key path), `unknown key`, or the
# command-line option at fault
_HEAD = re.compile(r"[A-Za-z_][\w.]*")


def names_a_key(message: str) -> bool:
    if message.startswith(("--config", "--set", "unknown key ")):
        return True
    head = _HEAD.match(message)
    return bool(head) and head.group().split(".")[0] in KEYS


def _runs(cfg: SweepConfig) -> int:
    """How many runs the plan has, without making them (a fuzzed repeats can be 10**30)."""
    workers = len(cfg.dataset["workers"]) if cfg.dataset else 1
    # each model at its batches (one list for all, or a mapping by model)
    batches = sum(len(cfg.batches_of(model_name(m))) for m in cfg.models)
    per = (len(cfg.runners) * len(cfg.data) * workers * len(cfg.precision) * batches
           * len(cfg.devices))
    return cfg.repeats * (per + len(cfg.pipelines) * batches * workers)


def ends_well(load: Any) -> None:
    """load() returns a SweepConfig that plans and round-trips, or raises a ConfigError whose
    message is one line naming a key; anything else fails the test."""
    try:
        cfg = load()
    except ConfigError as exc:
        message = str(exc)
        assert message and message.splitlines() == [message], repr(message)
        assert names_a_key(message), message
        return
    assert isinstance(cfg, SweepConfig)
    if _runs(cfg) <= 10_000:
        runs = expand(cfg, "fuzz")
        assert len({r.run_id for r in runs}) == len(runs), "two runs share a run_id"
    assert validate(cfg.to_dict(), cfg.name).to_dict() == cfg.to_dict()
    assert isinstance(cfg.timeout_s, float) and math.isfinite(cfg.timeout_s)


def _write(text: str) -> Path:
    fd, name = tempfile.mkstemp(suffix=".yaml", dir=_DATASET)
    with open(fd, "w", encoding="utf-8") as f:
        f.write(text)
    return Path(name)


def _load_text(text: str, overrides: list[str] | tuple[str, ...] = ()) -> None:
    path = _write(text)
    try:
        ends_well(lambda: load_config(path, overrides))
    finally:
        path.unlink()


def _dump(doc: Any) -> str:
    return yaml.safe_dump(doc, allow_unicode=True, sort_keys=False)


def _put(doc: dict[str, Any], path: str, value: Any) -> None:
    """Set a dotted key path in doc, replacing whatever is in the way by a mapping."""
    *parents, last = path.split(".")
    node = doc
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[last] = value


MUTATION = st.tuples(st.sampled_from(KEY_PATHS), VALUES | st.just(...))


@st.composite
def mutated_smoke(draw: st.DrawFn) -> dict[str, Any]:
    """configs/cpu-smoke.yaml with 1 to 4 keys set to random values (or removed: ...)."""
    doc = copy.deepcopy(SMOKE_RAW)
    for path, value in draw(st.lists(MUTATION, min_size=1, max_size=4)):
        if value is ...:
            doc.pop(path.split(".")[0], None)
        else:
            _put(doc, path, value)
    return doc


@st.composite
def edited_smoke_text(draw: st.DrawFn) -> str:
    """configs/cpu-smoke.yaml's text with lines repeated, dropped or replaced by any text."""
    lines = SMOKE_TEXT.splitlines()
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        how = draw(st.sampled_from(["repeat", "drop", "replace", "revalue", "indent"]))
        if how == "repeat":
            lines.insert(i, lines[i])
        elif how == "drop" and len(lines) > 1:
            del lines[i]
        elif how == "replace":
            lines[i] = draw(TEXT)
        elif how == "revalue" and ":" in lines[i]:
            lines[i] = lines[i].split(":", 1)[0] + ": " + draw(RAW_YAML)
        else:
            lines[i] = "  " + lines[i]
    return "\n".join(lines) + "\n"


@st.composite
def real_data_smoke(draw: st.DrawFn) -> dict[str, Any]:
    """configs/cpu-smoke.yaml on real data, or pipeline mode, with a random dataset mapping."""
    doc = copy.deepcopy(SMOKE_RAW)
    doc.update(draw(st.sampled_from([{"data": "real"}, {"data": ["synthetic", "real"]},
                                     {"mode": "pipeline"}, {"mode": ["benchmark", "pipeline"]}])))
    doc["dataset"] = draw(st.fixed_dictionaries(
        {"path": PATHS}, optional={"workers": VALUES, "augmentation": VALUES}))
    return doc


DOCUMENTS = (
    st.dictionaries(st.sampled_from(KEY_PATHS) | TEXT, VALUES, max_size=8).map(_dump)
    | VALUES.map(_dump)
    | mutated_smoke().map(_dump)
    | real_data_smoke().map(_dump)
    | edited_smoke_text()
    | st.lists(st.tuples(st.sampled_from(KEY_PATHS), RAW_YAML), max_size=6).map(
        lambda pairs: "".join(f"{k}: {v}\n" for k, v in pairs))
    | TEXT
)


@IN_PROCESS
@given(DOCUMENTS)
def test_any_yaml_document_is_a_config_or_one_line_error(text: str) -> None:
    _load_text(text)


@IN_PROCESS
@given(mutated_smoke())
def test_any_mutation_of_the_smoke_config_is_a_config_or_one_line_error(doc: dict) -> None:
    _load_text(_dump(doc))


def _flow(value: Any) -> str:
    """A value as one line of YAML, as a user types it after `--set key=`."""
    return yaml.safe_dump(value, default_flow_style=True, width=math.inf,
                          allow_unicode=True).strip().removesuffix("\n...").strip()


SETS = (
    TEXT
    | st.builds(lambda k, v: f"{k}={v}", st.sampled_from(KEY_PATHS),
                TEXT | VALUES.map(_flow) | RAW_YAML)
    | st.builds(lambda v: f"dataset.path={_flow(v)}", PATHS)
    | st.builds(lambda k, v: f"{k}={v}", TEXT, TEXT)
)


@IN_PROCESS
@given(st.lists(SETS, min_size=1, max_size=3))
def test_any_set_string_is_a_config_or_one_line_error(sets: list[str]) -> None:
    _load_text(SMOKE_TEXT, sets)


@settings(max_examples=15, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(document=DOCUMENTS | st.just(SMOKE_TEXT), assignment=SETS)
def test_cli_exits_0_or_2_with_one_line(document: str, assignment: str) -> None:
    path = _write(document)
    try:
        # --set=S: a value that starts with "-" is still the option's argument
        proc = run_cli("--config", str(path), f"--set={assignment}", "--dry-run", timeout=60)
    finally:
        path.unlink()
    assert proc.returncode in (0, 2), proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr + proc.stdout
    if proc.returncode == 2:
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
