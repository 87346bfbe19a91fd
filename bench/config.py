"""Sweep configuration: YAML in, a validated SweepConfig out, or a one-line ConfigError."""

from __future__ import annotations

import difflib
import json
import math
import re
import sys
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.registry import PIPELINES, RUNNERS, runner_options
from models import available_models, get_spec

SCALING = ("weak", "strong")
DATA = ("synthetic", "real")
AUGMENTATIONS = ("none", "crop-flip")
DATASET_KEYS = ("path", "augmentation", "workers")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
DEVICES = ("cpu", "gpu")
MODES = ("benchmark", "pipeline")

KEYS = (
    "name", "description", "runners", "models", "devices", "batch_size_per_device",
    "global_batch_size", "scaling", "data", "precision", "device", "warmup_steps",
    "measure_steps", "repeats", "timeout_s", "runner_options", "dataset", "mode", "pipelines",
    "pipeline_steps", "until_stable", "telemetry",
)
DEFAULTS: dict[str, Any] = {
    "name": None, "description": "", "data": ["synthetic"], "precision": ["fp32"],
    "device": "cpu", "warmup_steps": 5, "measure_steps": 20, "repeats": 1,
    "timeout_s": 600, "runner_options": {}, "dataset": None, "mode": ["benchmark"],
    "pipelines": None, "pipeline_steps": 200, "until_stable": None, "telemetry": {},
}
INT_MAX = 2**63 - 1  # integers beyond are no count of anything (and may not even print)
# repeats multiply the whole plan: a typo of 10**9 would plan (and dry-run print) forever
MAX_REPEATS = 1000
UNTIL_STABLE_KEYS = ("target_cv", "max_repeats")
TELEMETRY_KEYS = ("enabled", "interval_s", "starved_below_pct")
TELEMETRY_DEFAULTS: dict[str, Any] = {"enabled": True, "interval_s": 0.25,
                                      "starved_below_pct": 50.0}


class ConfigError(ValueError):
    """A bad config: the message is one line naming the key, the value and what is allowed."""

    def __init__(self, message: str) -> None:
        # one line whatever went into it: the CLI prints it as the single line of stderr
        super().__init__(" ".join(str(message).splitlines()))


@dataclass
class SweepConfig:
    """A validated sweep: the matrix and the settings shared by every run."""

    name: str
    runners: list[str]
    models: list[str]
    devices: list[int]
    scaling: str
    batch_sizes: list[int]  # per device (weak) or global (strong)
    data: list[str]
    precision: list[str]
    device: str
    warmup_steps: int
    measure_steps: int
    repeats: int
    timeout_s: float
    runner_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    description: str = ""
    # Real data: the folder prepare-data wrote, the augmentation level, the loader worker
    # counts (a list: an axis of real-data and pipeline runs).
    dataset: dict[str, Any] | None = None
    # "benchmark" trains the runners' models; "pipeline" times the input pipelines alone.
    mode: list[str] = field(default_factory=lambda: ["benchmark"])
    pipelines: list[str] = field(default_factory=list)
    # timed batches of a pipeline run: many, so buffers that fill during warm-up (MXNet runs
    # up to 16 batches ahead) are a small share of the window
    pipeline_steps: int = 200
    # Repeat a configuration beyond `repeats` until the CV of its images/sec is at most
    # target_cv, or it has max_repeats runs; None: exactly `repeats`.
    until_stable: dict[str, Any] | None = None
    # The parent's sampler (GPU through NVML, host through psutil) while each run goes.
    telemetry: dict[str, Any] = field(default_factory=lambda: dict(TELEMETRY_DEFAULTS))

    def to_dict(self) -> dict[str, Any]:
        """The resolved config in the user's key names (it loads back unchanged)."""
        d = asdict(self)
        batch_key = "batch_size_per_device" if self.scaling == "weak" else "global_batch_size"
        d[batch_key] = d.pop("batch_sizes")
        return d


def _show(value: Any) -> str:
    """repr(value) for a message, cut to 200 characters (and never an exception: the repr of
    an int of more than 4300 digits, which YAML's hex 0xfff... gives, is a ValueError)."""
    try:
        text = repr(value)
    except ValueError:
        return f"<{type(value).__name__} too large to show>"
    return text if len(text) <= 200 else text[:190] + "...(cut)"


def _hint(item: Any, allowed: tuple[str, ...] | list[str]) -> str:
    """' (did you mean ...?)' with the allowed value closest to item, or ''."""
    close = difflib.get_close_matches(item if isinstance(item, str) else _show(item),
                                      allowed, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _fail(key: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{key}: {_show(value)} is not allowed; allowed: {allowed}")


def _sub(parent: str, key: Any) -> str:
    """The key path of key under parent: parent.key, or parent[<repr>] for an odd key."""
    if isinstance(key, str) and re.fullmatch(r"[\w-]+", key, re.ASCII):
        return f"{parent}.{key}"
    return f"{parent}[{_show(key)}]"


def _unknown(key: str, item: Any, allowed: tuple[str, ...] | list[str]) -> ConfigError:
    return ConfigError(f"{key}: {_show(item)} is not allowed{_hint(item, allowed)}; allowed: "
                       f"{', '.join(allowed)}")


def _choices(key: str, value: Any, allowed: tuple[str, ...] | list[str]) -> list[str]:
    items = _as_list(key, value)
    for item in items:
        if item not in allowed:
            raise _unknown(key, item, allowed)
    return _unique(key, items)


def _choice(key: str, value: Any, allowed: tuple[str, ...] | list[str]) -> str:
    """One value of allowed (a key that is not an axis of the sweep: no list)."""
    if isinstance(value, str) and value in allowed:
        return value
    if not isinstance(value, str):
        raise _fail(key, value, f"one of {', '.join(allowed)} (one value for the whole sweep)")
    raise _unknown(key, value, allowed)


def _unique(key: str, items: list[Any]) -> list[Any]:
    """A list key lists each value once: a repeated one would plan the same run twice (one
    run_id, the second run overwriting the first)."""
    for item, count in Counter(items).items():
        if count > 1:
            times = "twice" if count == 2 else f"{count} times"
            raise ConfigError(f"{key}: {_show(item)} appears {times}; list each value once")
    return items


def _as_list(key: str, value: Any) -> list[Any]:
    if isinstance(value, list):
        if not value:
            raise _fail(key, value, "a non-empty list or a single value")
        return value
    if isinstance(value, dict) or value is None:
        raise _fail(key, value, "a value or a list of values")
    return [value]


def _int(key: str, value: Any, minimum: int, maximum: int = INT_MAX) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(key, value, f"an integer >= {minimum}")
    if value < minimum:
        raise _fail(key, value, f"an integer >= {minimum}")
    if value > maximum:
        most = "2**63 - 1" if maximum == INT_MAX else maximum
        raise _fail(key, value, f"an integer from {minimum} to {most}")
    return value


def _ints(key: str, value: Any, minimum: int) -> list[int]:
    return _unique(key, [_int(key, v, minimum) for v in _as_list(key, value)])


def _runner_options(raw: Any, runners: list[str], narrowed: frozenset[str] = frozenset()
                    ) -> dict[str, dict[str, Any]]:
    """Each runner's options over its defaults. Every key of runner_options names a runner of
    this sweep: a typo or a runner left out of `runners` would otherwise be options silently
    never used. The one exception is `narrowed`: runners the config file ran and gave options
    that a --set runners=[...] then dropped; their options are left out with a note."""
    if not isinstance(raw, dict):
        raise _fail("runner_options", raw, "a mapping of runner name to its options")
    sweep = ", ".join(runners) if runners else "none (this sweep has no runners)"
    for runner in raw:
        if runner in runners:
            continue
        if runner not in RUNNERS:
            # the closest of this sweep's runners, else of all runners
            hint = _hint(runner, runners) or _hint(runner, sorted(RUNNERS))
            raise ConfigError(f"runner_options: {_show(runner)} is not a runner{hint}; "
                              f"allowed: this sweep's runners: {sweep}")
        if runner in narrowed:
            print(f"note: runner_options.{runner} not used: --set runners left {runner} out "
                  f"of this sweep ({sweep})", file=sys.stderr)
            continue
        raise ConfigError(f"runner_options: {runner!r} is not one of this sweep's runners; "
                          f"allowed: {sweep} (add {runner} to runners, or remove its options)")
    resolved: dict[str, dict[str, Any]] = {}
    for runner in runners:
        given = raw.get(runner)
        given = {} if given is None else given
        if not isinstance(given, dict):
            raise _fail(f"runner_options.{runner}", given, "a mapping of option to value")
        spec = runner_options(runner)
        opts = {name: opt.default for name, opt in spec.items()}
        for name, value in given.items():
            key = f"runner_options.{runner}.{name}"
            if name not in spec:
                raise _unknown(f"runner_options.{runner} option", name, sorted(spec))
            opt = spec[name]
            if value is not None and (
                not isinstance(value, opt.type) or (isinstance(value, bool) and opt.type is int)
            ):
                types = opt.type if isinstance(opt.type, tuple) else (opt.type,)
                raise _fail(key, value, " or ".join(t.__name__ for t in types))
            # what the child gets (JSON, argv, a path) cannot hold these
            if isinstance(value, int) and not -INT_MAX <= value <= INT_MAX:
                raise _fail(key, value, "an integer of magnitude < 2**63")
            if isinstance(value, str) and "\x00" in value:
                raise _fail(key, value, "a string without NUL characters")
            # None is allowed where it is the default: "leave it to the program" (the script's
            # own default, for tf_cnn_benchmarks)
            if opt.allowed is not None and value not in opt.allowed and not (
                    value is None and opt.default is None):
                raise _fail(key, value, ", ".join(map(str, opt.allowed)))
            opts[name] = value
        resolved[runner] = opts
    return resolved


def validate(raw: Any, default_name: str = "sweep", narrowed: frozenset[str] = frozenset()
             ) -> SweepConfig:
    """Turn a parsed YAML mapping into a SweepConfig, or raise ConfigError."""
    if not isinstance(raw, dict):
        raise ConfigError("config: expected a mapping of keys at the top level, got "
                          f"{_show(raw)}")
    for key in raw:
        if key not in KEYS:
            raise ConfigError(f"unknown key {_show(key)}{_hint(key, KEYS)}; allowed keys: "
                              f"{', '.join(KEYS)}")
    mode = _choices("mode", raw.get("mode", DEFAULTS["mode"]), MODES)
    required = ("runners", "models", "devices") if "benchmark" in mode else ("models",)
    for key in required:
        if key not in raw:
            raise ConfigError(f"{key}: missing; this key is required")
    cfg = {**DEFAULTS, "runners": [], "devices": [1], **raw}

    # a pipeline-only sweep ignores (but still checks) the runners of the config it came from
    runners = (_choices("runners", cfg["runners"], sorted(RUNNERS))
               if "benchmark" in mode or raw.get("runners") else [])
    models = _choices("models", cfg["models"], available_models())
    devices = _ints("devices", cfg["devices"], 1)
    per_device, global_batch = cfg.get("batch_size_per_device"), cfg.get("global_batch_size")
    if per_device is not None and global_batch is not None:
        raise ConfigError(
            "batch_size_per_device and global_batch_size: both given; allowed: exactly one "
            "(batch_size_per_device with scaling: weak, global_batch_size with scaling: strong)"
        )
    if per_device is None and global_batch is None:
        raise ConfigError("batch_size_per_device: missing; give it (weak scaling) "
                          "or global_batch_size (strong scaling)")
    scaling = cfg.get("scaling")
    if scaling is None:
        scaling = "weak" if per_device is not None else "strong"
    scaling = _choice("scaling", scaling, SCALING)
    if scaling == "weak":
        if per_device is None:
            raise _fail("global_batch_size", global_batch,
                        "batch_size_per_device with scaling: weak (or set scaling: strong)")
        batch_sizes = _ints("batch_size_per_device", per_device, 1)
    else:
        if global_batch is None:
            raise _fail("batch_size_per_device", per_device,
                        "global_batch_size with scaling: strong (or set scaling: weak)")
        batch_sizes = _ints("global_batch_size", global_batch, 1)
        for b in batch_sizes:
            for n in devices:
                if b % n:
                    raise ConfigError(
                        f"global_batch_size: {b} does not divide by {n} devices; allowed: a "
                        f"multiple of every device count in {devices} (a remainder would be "
                        "dropped or give a short batch)"
                    )
    name = cfg["name"] if cfg["name"] is not None else default_name
    # the name is a folder name (results/<name>-<time>) and printed: printable characters
    if not isinstance(name, str) or not name or not name.isprintable() \
            or any(c in name for c in "/\\ "):
        raise _fail("name", name, "a non-empty string of printable characters without spaces "
                    "or slashes")
    if not isinstance(cfg["description"], str):
        raise _fail("description", cfg["description"], "a string")
    timeout = _seconds("timeout_s", cfg["timeout_s"])
    data = _choices("data", cfg["data"], DATA)
    pipelines = _pipelines(cfg["pipelines"], mode)
    dataset = _dataset(cfg["dataset"], data if "benchmark" in mode else [],
                       "pipeline" in mode)
    if dataset and "real" in data and "benchmark" in mode:
        _check_classes(dataset, models)
    return SweepConfig(
        name=name,
        description=cfg["description"],
        runners=runners,
        models=models,
        devices=devices,
        scaling=scaling,
        batch_sizes=batch_sizes,
        data=data,
        precision=_choices("precision", cfg["precision"], PRECISIONS),
        device=_device(cfg["device"]),
        warmup_steps=_int("warmup_steps", cfg["warmup_steps"], 0),
        measure_steps=_int("measure_steps", cfg["measure_steps"], 1),
        repeats=_int("repeats", cfg["repeats"], 1, MAX_REPEATS),
        timeout_s=timeout,
        runner_options=_runner_options(cfg["runner_options"], runners, narrowed),
        dataset=dataset,
        mode=mode,
        pipelines=pipelines,
        pipeline_steps=_int("pipeline_steps", cfg["pipeline_steps"], 1),
        until_stable=_until_stable(cfg["until_stable"], cfg["repeats"]),
        telemetry=_telemetry(cfg["telemetry"]),
    )


def _seconds(key: str, value: Any) -> float:
    """A finite number of seconds > 0, as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise _fail(key, value, "a number of seconds > 0")
    try:
        seconds = float(value)
    except OverflowError:  # an int beyond any float
        seconds = math.inf
    if not math.isfinite(seconds):
        raise _fail(key, value, "a number of seconds > 0")
    return seconds


def _until_stable(raw: Any, repeats: int) -> dict[str, Any] | None:
    """target_cv in (0, 1) and max_repeats >= repeats; repeats >= 2 (one run has no CV)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _fail("until_stable", raw, "a mapping with target_cv (e.g. 0.02) and max_repeats")
    for key in raw:
        if key not in UNTIL_STABLE_KEYS:
            raise _fail(_sub("until_stable", key), raw[key], "keys " + ", ".join(UNTIL_STABLE_KEYS))
    target = raw.get("target_cv", 0.02)
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target < 1:
        raise _fail("until_stable.target_cv", target, "a number between 0 and 1 (0.02 = 2%)")
    if repeats < 2:
        raise _fail("repeats", repeats, "an integer >= 2 with until_stable (the coefficient "
                    "of variation of one run is undefined)")
    maximum = _int("until_stable.max_repeats", raw.get("max_repeats", 10), repeats, MAX_REPEATS)
    return {"target_cv": float(target), "max_repeats": maximum}


def _telemetry(raw: Any) -> dict[str, Any]:
    """The sampler's settings over TELEMETRY_DEFAULTS; `false` turns it off."""
    if raw is False:
        return {**TELEMETRY_DEFAULTS, "enabled": False}
    if raw is None or raw is True:
        raw = {}
    if not isinstance(raw, dict):
        raise _fail("telemetry", raw, "a mapping of " + ", ".join(TELEMETRY_KEYS) + ", or false")
    for key in raw:
        if key not in TELEMETRY_KEYS:
            raise _fail(_sub("telemetry", key), raw[key], "keys " + ", ".join(TELEMETRY_KEYS))
    out = {**TELEMETRY_DEFAULTS, **raw}
    if not isinstance(out["enabled"], bool):
        raise _fail("telemetry.enabled", out["enabled"], "true or false")
    interval = out["interval_s"]
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) \
            or not 0.05 <= interval <= 10:
        raise _fail("telemetry.interval_s", interval, "seconds between samples, 0.05 to 10")
    starved = out["starved_below_pct"]
    if isinstance(starved, bool) or not isinstance(starved, (int, float)) \
            or not 0 <= starved <= 100:
        raise _fail("telemetry.starved_below_pct", starved, "a GPU utilisation percentage, "
                    "0 to 100")
    return {"enabled": out["enabled"], "interval_s": float(interval),
            "starved_below_pct": float(starved)}


def _pipelines(raw: Any, mode: list[str]) -> list[str]:
    """The input pipelines a pipeline-mode sweep times: all of them unless named (checked
    even when mode leaves them out, so a typo never waits for the day they run)."""
    if raw is None or raw == []:
        return list(PIPELINES) if "pipeline" in mode else []
    return _choices("pipelines", raw, list(PIPELINES))


def _check_classes(dataset: dict[str, Any], models: list[str]) -> None:
    """Labels must index the model's outputs: a dataset cannot have more classes."""
    try:
        classes = int(json.loads((Path(dataset["path"]) / "manifest.json").read_text())
                      ["classes"])
    except (OSError, ValueError, KeyError, TypeError, OverflowError) as exc:
        raise _fail("dataset.path", dataset["path"], f"a readable prepare-data folder ({exc})"
                    ) from None
    for model in models:
        outputs = get_spec(model).num_classes
        if classes > outputs:
            raise _fail("dataset.path", dataset["path"],
                        f"a dataset of at most {outputs} classes for model {model} "
                        f"(this one has {classes})")


def _dataset(raw: Any, data: list[str], pipeline: bool = False) -> dict[str, Any] | None:
    """The dataset mapping: required when data includes real or mode includes pipeline,
    checked against the folder."""
    if raw is None:
        if "real" in data or pipeline:
            why = "mode includes pipeline" if pipeline else "data includes real"
            raise _fail("dataset", raw, "a mapping with path: <a folder written by "
                        f"`run_bench.py prepare-data`> when {why}")
        return None
    if not isinstance(raw, dict):
        raise _fail("dataset", raw, "a mapping of " + ", ".join(DATASET_KEYS))
    for key in raw:
        if key not in DATASET_KEYS:
            raise _fail(_sub("dataset", key), raw[key], "keys " + ", ".join(DATASET_KEYS))
    path = raw.get("path")
    if not isinstance(path, str) or not path:
        raise _fail("dataset.path", path, "a folder written by `run_bench.py prepare-data`")
    try:
        folder = Path(path).expanduser()
        prepared = (folder / "manifest.json").is_file()
        resolved = str(folder.resolve())
    except (OSError, RuntimeError, ValueError) as exc:  # ~nosuchuser, a NUL, a name too long
        raise _fail("dataset.path", path, "a folder written by `run_bench.py prepare-data` "
                    f"({type(exc).__name__}: {exc})") from None
    if not prepared:
        raise _fail("dataset.path", path, "a folder written by `run_bench.py prepare-data` "
                    "(it has no manifest.json)")
    augmentation = raw.get("augmentation", "crop-flip")
    if augmentation not in AUGMENTATIONS:
        raise _fail("dataset.augmentation", augmentation, ", ".join(AUGMENTATIONS))
    workers = raw.get("workers", 4)
    for w in workers if isinstance(workers, list) and workers else [workers]:
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise _fail("dataset.workers", workers, "an integer >= 0 or a list of them "
                        "(parallel decode workers of the loader)")
    workers = _unique("dataset.workers", workers if isinstance(workers, list) else [workers])
    return {"path": resolved, "augmentation": augmentation, "workers": workers}


def _device(value: Any) -> str:
    if not isinstance(value, str) or value not in DEVICES:
        raise _fail("device", value, ", ".join(DEVICES) + " (one value for the whole sweep)")
    return value


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping in the YAML gives one key twice (YAML forbids it; PyYAML keeps the last)."""

    def __init__(self, key: Any, line: int, first_line: int) -> None:
        self.key, self.line, self.first_line = key, line, first_line
        super().__init__(problem=f"key {_show(key)} appears twice (lines {first_line} and "
                         f"{line})")


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping, at any depth (a second
    `runners:` line would silently replace the first), and turns a scalar that cannot be
    built (an int of more than 4300 digits, the 13th month) into a YAMLError with its line."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._checked: set[int] = set()

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        # Here, before flattening merges the keys of `<<: *anchor` into the node (keys a
        # mapping may override), see the node's own keys once.
        if id(node) not in self._checked:
            self._checked.add(id(node))
            seen: dict[Any, yaml.Node] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) \
                        or key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:  # unhashable: construct_mapping says so
                    continue
                if first is not key_node:
                    raise DuplicateKeyError(key, key_node.start_mark.line + 1,
                                            first.start_mark.line + 1)
        super().flatten_mapping(node)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, OverflowError, KeyError, AttributeError,
                IndexError) as exc:  # e.g. `2024-13-01`, `!!bool maybe`, `!!timestamp 1`
            text = node.value if isinstance(node, yaml.ScalarNode) else node.tag
            shown = repr(text) if len(str(text)) <= 40 else repr(str(text)[:37]) + "..."
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read {shown} as {node.tag.rsplit(':', 1)[-1]} "
                f"({type(exc).__name__}: {exc})",
                node.start_mark) from None


def parse_yaml(text: str, where: str) -> Any:
    """YAML text into Python objects (as yaml.safe_load, refusing a key given twice), or a
    ConfigError that starts with `where` (the file or the --set value)."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader
    except DuplicateKeyError as exc:
        raise ConfigError(f"{where}: key {_show(exc.key)} at line {exc.line} appears twice (first "
                          f"at line {exc.first_line}); give each key once") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where} is not valid YAML ({_yaml_reason(exc)})") from None
    except RecursionError:
        raise ConfigError(f"{where} is not allowed; allowed: YAML nested less deeply") from None


def apply_override(raw: dict[str, Any], assignment: str) -> None:
    """Apply one `--set key.sub=value` (value parsed as YAML) to the raw config in place."""
    key, sep, text = assignment.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set: {_show(assignment)} is not allowed; allowed: key=value "
                          "(e.g. devices=[1,2] or runner_options.tf_mirrored.xla=true)")
    shown = key if re.fullmatch(r"[\w.-]+", key, re.ASCII) else _show(key)
    value = parse_yaml(text, f"--set {shown}: {_show(text)}")
    parts = key.split(".")
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(parts[: i + 1])
            raise ConfigError(f"--set {shown}: {_show(where)} is {_show(child)}, not a mapping "
                              "to set keys in")
        node = child
    node[parts[-1]] = value


def _yaml_reason(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc) or type(exc).__name__
    problem = " ".join(problem.split())  # one line
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> SweepConfig:
    """Read, override and validate a YAML sweep file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"--config: {str(path)!r} does not exist; allowed: a path to a YAML "
                          "file (e.g. configs/cpu-smoke.yaml)") from None
    except OSError as exc:
        raise ConfigError(f"--config: {str(path)!r} cannot be read ({exc.strerror})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--config: {str(path)!r} is not UTF-8 text (byte {exc.start}); "
                          "allowed: a YAML file in UTF-8") from None
    raw = parse_yaml(text, f"--config: {str(path)!r}")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"--config: {str(path)!r} holds {type(raw).__name__}; allowed: a "
                          "mapping of keys (runners, models, devices, ...)")
    # runners the file runs and gives options to: a --set runners=[...] may drop them
    own = raw.get("runners") if isinstance(raw.get("runners"), list) else [raw.get("runners")]
    opts = raw.get("runner_options") if isinstance(raw.get("runner_options"), dict) else {}
    given = frozenset(r for r in opts if isinstance(r, str) and r in own)
    for assignment in overrides:
        apply_override(raw, assignment)
    sets_runners = any(str(a).split("=", 1)[0].strip() == "runners" for a in overrides)
    return validate(raw, default_name=path.stem, narrowed=given if sets_runners else frozenset())
