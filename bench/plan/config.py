"""Sweep configuration: YAML in, a validated SweepConfig out, or a one-line ConfigError.

The file's keys are declared once, in contract/settings.py (name, type, default, bounds or
allowed values, description); `sweep_model()` builds the pydantic model from them, with the
registry and models/ (so every runner's options are declared too) and, for the keys whose
validation is their own (`_own_types`), their types here; `run_bench.py schema` prints it as
JSON Schema, and SweepConfig, the resolved config, has a field per key. Pydantic's own errors
never reach the user: `_translate` turns the first one into a one-line ConfigError naming the
key, the value and what is allowed (the words each field declares in its `Says`, and the
closest allowed value). Rules that span keys (the batch key and scaling, what a mode needs,
until_stable and repeats, the dataset's classes) are plain code in `_resolve`.

Parent side only: runners and framework environments never import this module (pydantic).
"""

import difflib
import functools
import json
import operator
import os
import re
import reprlib
import stat
import sys
import typing
from collections import Counter
from dataclasses import asdict, dataclass, make_dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    create_model,
    field_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from bench.catalog.registry import (
    COMMON_OPTIONS,
    PIPELINES,
    PROBES,
    RUNNERS,
    Option,
    runner_options,
)
from bench.errors import ConfigError  # noqa: F401 (raised here, imported from here)
from bench.records.grouping import variant_part
from contract import settings
from contract.settings import DEVICES, MAX_REPEATS, REQUIRED, SCALING, Setting
from models import available_models, get_spec
from models.custom import FRAMEWORKS

PRECISIONS = settings.PRECISIONS
AUGMENTATIONS = ("none", "crop-flip")
# the top-level keys, in the order of the model's fields (the schema's properties)
KEYS = tuple(s.key_name for s in settings.config_settings())
INT_MAX = 2**63 - 1  # integers beyond are no count of anything (and may not even print)
BACKENDS = ("local", "slurm")
# both batch keys resolve to one SweepConfig field, batch_sizes (scaling says which it holds)
BATCH_KEYS = ("batch_size_per_device", "global_batch_size")
# SweepConfig's fields (config.yaml's keys) in the order they had before contract/settings.py
# declared them; a key not named here follows them, in declaration order
_SWEEP_ORDER = (
    "name", "runners", "models", "devices", "scaling", "batch_sizes", "data", "precision",
    "device", "warmup_steps", "measure_steps", "repeats", "timeout_s", "runner_options",
    "description", "dataset", "mode", "pipelines", "pipeline_steps", "probes", "until_stable",
    "telemetry", "nodes", "cluster",
)


def _to_dict(self: Any) -> dict[str, Any]:
    """The resolved config in the user's key names (it loads back unchanged)."""
    d = asdict(self)
    batch_key = "batch_size_per_device" if self.scaling == "weak" else "global_batch_size"
    batch_sizes = d.pop("batch_sizes")
    if batch_sizes:  # an all-reduce-only sweep has no batch
        d[batch_key] = batch_sizes
    return d


def _sweep_fields() -> list[tuple[str, Any]]:
    """SweepConfig's fields: one per key of the sweep file (an axis: a list), the batch keys
    as batch_sizes."""
    types: dict[str, Any] = {s.key_name: list[s.type] if s.key.axis else s.type
                             for s in settings.config_settings() if s.key_name not in BATCH_KEYS}
    types["batch_sizes"] = list[int]  # per device (weak) or global (strong)
    return [(name, types[name]) for name in settings.in_order(list(types), _SWEEP_ORDER)]


# A validated sweep: the matrix and the settings shared by every run, one field per key of
# contract/settings.py's SETTINGS (what each holds: its Setting's help), resolved by _resolve.
SweepConfig = make_dataclass(
    "SweepConfig", _sweep_fields(),
    namespace={"__module__": __name__, "to_dict": _to_dict, "__doc__": "A validated sweep: "
               "the matrix and the settings shared by every run."})


# --- messages -------------------------------------------------------------------------------

SHOW_CHARS = 60  # a value quoted in a message: at most this many characters of it
# repr of a part of a value: a few items of a few levels, short strings, so that showing a
# value costs little however large or deep it is (an alias bomb, a 1 MiB string)
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, SHOW_CHARS, SHOW_CHARS, 40
_REPR.maxlist = _REPR.maxtuple = _REPR.maxset = _REPR.maxdict = 8


def _show(value: Any) -> str:
    """A short repr of value for a message: at most SHOW_CHARS characters of it, cut with
    '...' and its length when longer (never an exception: the repr of an int of more than
    4300 digits, which YAML's hex 0xfff... gives, is a ValueError)."""
    if isinstance(value, str):
        keep = SHOW_CHARS  # characters of it: fewer where escapes lengthen their repr
        while len(repr(value[:keep])) > SHOW_CHARS + 2 and keep > 8:
            keep //= 2
        if keep >= len(value):
            return repr(value)
        return f"{repr(value[:keep])}... ({len(value)} characters)"
    try:
        if isinstance(value, (list, tuple, dict, set, frozenset)):
            text = _REPR.repr(value)
        else:
            text = repr(value)
    except ValueError:
        return f"<{type(value).__name__} too large to show>"
    if len(text) <= SHOW_CHARS and "..." not in text:
        return text
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        size = f"{type(value).__name__} of {len(value)} items"
    else:
        size = f"{len(text)} characters"
    return f"{text[:SHOW_CHARS]}... ({size})"


def _show_path(path: Any) -> str:
    """A path for a message: whole up to 200 characters (a path the user typed, to find
    again), else cut as _show cuts a value."""
    text = str(path)
    return repr(text) if len(text) <= 200 else f"{repr(text[:SHOW_CHARS])}... " \
        f"({len(text)} characters)"


def show_value(value: Any) -> str:
    """_show for the other modules' messages (bench/run/sweep.py, bench/cli.py)."""
    return _show(value)


def _hint(item: Any, allowed: tuple[str, ...] | list[str]) -> str:
    """' (did you mean ...?)' with the allowed value closest to item, or ''."""
    if isinstance(item, str) and len(item) > 100:
        return ""  # no allowed value is that long (and difflib's cost grows with it)
    close = difflib.get_close_matches(item if isinstance(item, str) else _show(item),
                                      allowed, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _fail(key: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(f"{key}: {_show(value)} is not allowed; allowed: {allowed}")


def _sub(parent: str, key: Any) -> str:
    """The key path of key under parent: parent.key, or parent[<repr>] for an odd key."""
    if isinstance(key, str) and re.fullmatch(r"[\w-]+", key, re.ASCII):
        return f"{parent}.{key}" if parent else key
    return f"{parent}[{_show(key)}]"


def _unknown(key: str, item: Any, allowed: tuple[str, ...] | list[str]) -> ConfigError:
    return ConfigError(f"{key}: {_show(item)} is not allowed{_hint(item, allowed)}; allowed: "
                       f"{', '.join(allowed)}")


@dataclass(frozen=True)
class Says:
    """A field's words for its one-line error: what is allowed (`allowed`, or for one kind of
    pydantic error `by_error[kind]`); with `choices`, a string value (or, with no `allowed`,
    any value) is told the allowed value closest to it."""

    allowed: str = ""
    choices: tuple[str, ...] = ()
    by_error: tuple[tuple[str, str], ...] = ()


def _refuse(allowed: str) -> PydanticCustomError:
    """A validator's error; _translate adds the key and the value."""
    return PydanticCustomError("config", "allowed: {allowed}", {"allowed": allowed})


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _says_in(info: FieldInfo) -> Says | None:
    """The Says of a field: in its metadata, or in its type (a Says inside an Optional)."""
    def find(items: Any) -> Says | None:
        for item in items:
            found = item if isinstance(item, Says) else find(typing.get_args(item))
            if found:
                return found
        return None
    return find(info.metadata) or find([info.annotation])


# --- declared types -------------------------------------------------------------------------

def _count(minimum: int, maximum: int = INT_MAX) -> Any:
    """An integer in [minimum, maximum], with its words."""
    most = "2**63 - 1" if maximum == INT_MAX else maximum
    return Annotated[int, Field(ge=minimum, le=maximum), Says(
        f"an integer >= {minimum}",
        by_error=(("less_than_equal", f"an integer from {minimum} to {most}"),))]


def _number(minimum: float, maximum: float | None) -> Any:
    """A finite number in [minimum, maximum], with its words."""
    words = f"a number >= {minimum}" if maximum is None else \
        f"a number from {minimum} to {maximum}"
    return Annotated[float, Field(ge=minimum, le=maximum, allow_inf_nan=False), Says(words)]


def _as_list(empty_ok: bool) -> Any:
    def as_list(value: Any) -> Any:
        if isinstance(value, list):
            if not value and not empty_ok:
                raise _refuse("a non-empty list or a single value")
            return value
        if isinstance(value, dict) or value is None:
            raise _refuse("a value or a list of values")
        return [value]
    return as_list


def _unique(items: list[Any]) -> list[Any]:
    """A list key lists each value once: a repeated one would plan the same run twice (one
    run_id, the second run overwriting the first)."""
    for item, count in Counter(items).items():
        if count > 1:
            raise PydanticCustomError("repeated", "listed more than once",
                                      {"item": item, "count": count})
    return items


def _axis(item: Any, says: Says | None = None, empty_ok: bool = False) -> Any:
    """An axis of the sweep: one value or a list of them, each once (a list once validated).
    The words: `says`, else those of the item type."""
    many = Annotated[list[item], Field(min_length=0 if empty_ok else 1,
                                       json_schema_extra={"uniqueItems": True})]
    words = says or _says_in(FieldInfo.from_annotation(item)) or Says()
    return Annotated[list[item], BeforeValidator(
        _as_list(empty_ok), json_schema_input_type=item | many),
        AfterValidator(_unique), words]


def _one_of(values: tuple[str, ...] | list[str]) -> Any:
    """One of values; a wrong one is told the closest."""
    return Annotated[Literal[tuple(values)], Says(choices=tuple(values))]


class _Section(BaseModel):
    """A mapping of the config: strict types (no "1" for 1, no true for 1), no unknown keys."""

    model_config = ConfigDict(extra="forbid", strict=True, protected_namespaces=())

    @classmethod
    def unknown_key(cls, path: str, key: Any, value: Any) -> ConfigError:
        keys = [f.alias or name for name, f in cls.model_fields.items()]
        return _fail(_sub(path, key), value, "keys " + ", ".join(keys))


def _prepared(path: str) -> str:
    """A folder prepare-data wrote (it has a manifest.json), made absolute."""
    try:
        folder = Path(path).expanduser()
        prepared = (folder / "manifest.json").is_file()
        resolved = str(folder.resolve())
    except (OSError, RuntimeError, ValueError) as exc:  # ~nosuchuser, a NUL, a name too long
        raise _refuse("a folder written by `run_bench.py prepare-data` "
                      f"({type(exc).__name__}: {exc})") from None
    if not prepared:
        raise _refuse("a folder written by `run_bench.py prepare-data` (it has no manifest.json)")
    return resolved


class Dataset(_Section):
    """Real data (data: real, mode: pipeline): what the loaders read."""

    path: Annotated[str, Field(min_length=1, description="a folder written by `run_bench.py "
                               "prepare-data`"), AfterValidator(_prepared),
                    Says("a folder written by `run_bench.py prepare-data`")]
    augmentation: Annotated[Literal[AUGMENTATIONS], Says(", ".join(AUGMENTATIONS))] = "crop-flip"
    workers: Annotated[_axis(_count(0), Says("an integer >= 0 or a list of them (parallel "
                                             "decode workers of the loader)")),
                       Field(description="parallel decode workers of the loader; a list is "
                             "an axis")] = [4]


class UntilStable(_Section):
    """More repeats while the coefficient of variation of a configuration's images/sec is high
    (needs repeats >= 2)."""

    target_cv: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False),
                         Says("a number between 0 and 1 (0.02 = 2%)")] = 0.02
    max_repeats: _count(1, MAX_REPEATS) = 10


class Telemetry(_Section):
    """The parent's sampler (GPU through NVML, host through psutil) while each run goes."""

    enabled: Annotated[bool, Says("true or false")] = True
    interval_s: Annotated[float, Field(ge=0.05, le=10, allow_inf_nan=False),
                          Says("seconds between samples, 0.05 to 10")] = 0.25
    starved_below_pct: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False),
                                 Says("a GPU utilisation percentage, 0 to 100")] = 50.0


class Cluster(_Section):
    """Where the runs execute: here (backend local), or each as its own SLURM job (slurm)."""

    backend: Annotated[Literal[BACKENDS], Says("local, slurm", choices=BACKENDS)] = "local"
    partition: Annotated[str | None, Field(min_length=1, description="sbatch --partition "
                                           "(default: the cluster's default partition)"),
                         Says("a partition name")] = None
    account: Annotated[str | None, Field(min_length=1, description="sbatch --account"),
                       Says("an account name")] = None
    gpus_per_node: Annotated[int | None, Field(ge=1, description="GPUs requested per node as "
                             "gres (--gres=gpu:N; default: the run's devices per node on GPU "
                             "runs, none on CPU runs)"), Says("an integer >= 1")] = None
    exclusive: Annotated[bool, Field(description="sbatch --exclusive: no run shares a node"),
                         Says("true or false")] = True
    sbatch_args: Annotated[list[Annotated[str, Field(pattern=r"^[^\x00\n]*$")]], Field(
        description="extra sbatch arguments, each one string (e.g. --qos=high, "
        "--constraint=a100)"), Says("a list of strings")] = []
    max_jobs: Annotated[int, Field(ge=1, le=INT_MAX, description="jobs of the sweep in flight "
                                   "at once (later jobs wait on earlier ones: SLURM "
                                   "dependencies, so the cap holds with --detach too)"),
                        Says("an integer >= 1")] = 8
    poll_s: Annotated[float, Field(ge=0.5, le=600, allow_inf_nan=False, description="seconds "
                                   "between looks at the queue while the sweep waits"),
                      Says("a number of seconds from 0.5 to 600")] = 5.0


class CapacitySearch(_Section):
    """Capacity mode's search (bench/run/capacity.py): doubling from `start` until a probe does
    not fit or `max` is reached, then bisection between the largest fit and the first misfit
    until they are `resolution` apart."""

    start: Annotated[_count(1), Field(description="the first value probed (a batch per device "
                                      "or a layer count)")] = 1
    max: Annotated[_count(1), Field(description="the largest value probed")] = 4096
    resolution: Annotated[_count(1), Field(description="bisection stops once the first misfit "
                                           "is within this of the largest fit (1: exact)")] = 1


LR_SCALINGS = ("linear", "sqrt", "none")
SCHEDULES = ("constant", "poly", "cosine", "step")
LAST_BATCH = ("drop", "pad", "keep")
CONVERGE_AUGMENTATIONS = ("none", "shift-flip")


class Converge(_Section):
    """Mode converge's training recipe (runners/converge.py): the same for every runner and
    device count of the sweep, every key recorded in each run."""

    target_accuracy: Annotated[float | None, Field(gt=0, le=1, allow_inf_nan=False,
                               description="held-out top-1 accuracy at which a run stops "
                               "(0.9 = 90%); null: train max_epochs"),
                               Says("a number in (0, 1] or null")] = None
    max_epochs: Annotated[_count(1, 100000), Field(description="epochs at most; the "
                          "schedules' horizon")] = 10
    optimizer: Annotated[Literal["sgd"], Field(description="SGD with momentum (the seeds' "
                         "and Goyal et al.'s; the one every runner implements alike)"),
                         Says("sgd")] = "sgd"
    momentum: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False),
                        Says("a number in [0, 1)")] = 0.9
    weight_decay: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False, description="L2 "
                            "penalty added to the gradient (SGD's weight_decay)"),
                            Says("a number in [0, 1)")] = 0.0
    base_lr: Annotated[float, Field(gt=0, le=100, allow_inf_nan=False, description="the "
                       "learning rate for reference_batch images per step"),
                       Says("a number in (0, 100]")] = 0.01
    reference_batch: Annotated[_count(1), Field(description="the global batch base_lr is "
                               "for (lr_scaling scales it to each run's)")] = 64
    lr_scaling: Annotated[Literal[LR_SCALINGS], Field(description="linear (x B/ref, Goyal et "
                          "al. 2017), sqrt (x sqrt(B/ref)) or none"),
                          Says(", ".join(LR_SCALINGS))] = "none"
    warmup_epochs: Annotated[float, Field(ge=0, le=100000, allow_inf_nan=False,
                             description="linear warm-up per step from base_lr to the scaled "
                             "rate"), Says("a number of epochs >= 0")] = 0.0
    schedule: Annotated[Literal[SCHEDULES], Field(description="constant, poly (seed 004's "
                        "polynomial decay), cosine or step, set at each epoch's start"),
                        Says(", ".join(SCHEDULES))] = "poly"
    poly_power: Annotated[float, Field(gt=0, le=100, allow_inf_nan=False),
                          Says("a number in (0, 100]")] = 1.0
    step_epochs: Annotated[_count(1, 100000), Field(description="schedule step: epochs "
                           "between decays")] = 30
    step_gamma: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False, description="schedule "
                          "step: the factor of each decay"), Says("a number in (0, 1]")] = 0.1
    last_batch: Annotated[Literal[LAST_BATCH], Field(description="a short last batch: drop "
                          "it (seed 002's advice), pad it from the epoch's first images, or "
                          "keep it short"), Says(", ".join(LAST_BATCH))] = "drop"
    augmentation: Annotated[Literal[CONVERGE_AUGMENTATIONS], Field(description="none, or "
                            "shift-flip (seed 004's shifts up to 10% and horizontal flips)"),
                            Says(", ".join(CONVERGE_AUGMENTATIONS))] = "none"
    seed: Annotated[_count(0, 2**32 - 1), Field(description="the batches' order and "
                    "augmentation, and the model's initial weights")] = 0


SIZE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12, "kib": 2**10,
              "mib": 2**20, "gib": 2**30, "tib": 2**40}
SIZE_WORDS = "a size in bytes: an integer >= 1 or a string such as 512MiB, 2GiB, 1.5GB"


def parse_size(value: Any) -> int:
    """Bytes of a size: an integer, or a number with a unit (B, kB, MB, GB, TB: powers of
    1000; KiB, MiB, GiB, TiB: of 1024), at least 1 byte; ValueError otherwise."""
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str) and (m := re.fullmatch(
            r"\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*", value, re.IGNORECASE | re.ASCII)) \
            and m.group(2).lower() in (*SIZE_UNITS, ""):
        size = int(float(m.group(1)) * SIZE_UNITS.get(m.group(2).lower(), 1))
    else:
        raise ValueError(SIZE_WORDS)
    if not 1 <= size <= INT_MAX:
        raise ValueError(SIZE_WORDS)
    return size


def _size(value: Any) -> Any:
    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError:
        raise _refuse(SIZE_WORDS) from None


class ModelInput(_Section):
    """What a user's model takes: an image (one sample's shape as the framework takes it, and
    the classes of its logits) or token ids (the sequence length and the vocabulary)."""

    kind: Annotated[Literal["image", "tokens"], Says("image, tokens", choices=("image",
                                                                           "tokens"))]
    shape: Annotated[list[_count(1)] | None, Field(min_length=1, max_length=3, description=(
        "image: one sample's shape as the framework takes it (C, H, W for torch and mxnet; "
        "H, W, C for jax, keras, tf)")), Says("a list of 1 to 3 integers >= 1")] = None
    classes: Annotated[_count(2) | None, Field(description="image: the classes the model's "
                                               "logits score")] = None
    seq_len: Annotated[_count(1) | None, Field(description="tokens: the sequence length")
                       ] = None
    vocab: Annotated[_count(2) | None, Field(description="tokens: the vocabulary (the "
                                             "next-token logits' size)")] = None


def _folder(path: str) -> str:
    """An existing folder, made absolute (put on the child's sys.path)."""
    try:
        folder = Path(path).expanduser()
        ok, resolved = folder.is_dir(), str(folder.resolve())
    except (OSError, RuntimeError, ValueError) as exc:
        raise _refuse(f"an existing folder ({type(exc).__name__}: {exc})") from None
    if not ok:
        raise _refuse("an existing folder (the one holding the build's module)")
    return resolved


class CustomModel(_Section):
    """A user's own model (models/custom.py): built in the child by `build` from `path`, with
    the harness's loss, optimizer and data."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="the "
                    "model's name in run ids and tables"), Says(
        "a name of letters, digits, _ . - (it goes into run ids)")]
    framework: Annotated[Literal[FRAMEWORKS], Says(", ".join(FRAMEWORKS), choices=FRAMEWORKS)]
    build: Annotated[str, Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", description=(
        "module:function, the function returning the framework's model object")), Says(
        "module:function (e.g. mynets:make_model)")]
    path: Annotated[str, Field(min_length=1, description="the folder put on the child's "
                    "sys.path (outside the repo is fine)"), AfterValidator(_folder),
                    Says("an existing folder (the one holding the build's module)")]
    args: Annotated[dict[str, Any], Field(description="keyword arguments for build"),
                    Says("a mapping of argument name to value")] = {}
    input: Annotated[ModelInput, Says("a mapping with kind (image: shape, classes; tokens: "
                                      "seq_len, vocab)")]


_INPUT_KEYS = {"image": ("shape", "classes"), "tokens": ("seq_len", "vocab")}


def _custom_entry(i: int, raw: dict[str, Any], builtin: tuple[str, ...]) -> dict[str, Any]:
    """One `models:` mapping validated (errors name models[i].key) as a plain dict."""
    try:
        entry = CustomModel.model_validate(raw)
    except ValidationError as exc:
        err = _first_error(exc, CustomModel, raw)
        raise ConfigError(f"models[{i}].{err}") from None
    if entry.name in builtin:
        raise _fail(f"models[{i}].name", entry.name, "a name that is not a built-in model's "
                    f"({', '.join(builtin)})")
    kind = entry.input.kind
    given = entry.input.model_fields_set - {"kind"}
    for key in _INPUT_KEYS[kind]:
        if key not in given:
            raise ConfigError(f"models[{i}].input.{key}: missing; this key is required with "
                              f"kind {kind}")
    other = "tokens" if kind == "image" else "image"
    for key in _INPUT_KEYS[other]:
        if key in given:
            raise _fail(f"models[{i}].input.{key}", getattr(entry.input, key),
                        f"nothing with kind {kind} (it is kind {other}'s)")
    out = entry.model_dump()
    out["input"] = {"kind": kind, **{k: out["input"][k] for k in _INPUT_KEYS[kind]}}
    return out


def _models_key(builtin: tuple[str, ...]) -> Any:
    """The models key: one model or a list, each a built-in model's name or a user's model
    (a mapping, CustomModel), each name once."""
    def check(value: Any) -> list[Any]:
        items = _as_list(False)(value)
        out: list[Any] = []
        for i, item in enumerate(items):
            if isinstance(item, dict):
                out.append(_custom_entry(i, item, builtin))
            elif isinstance(item, str) and item in builtin:
                out.append(item)
            elif isinstance(item, str):
                raise _unknown("models", item, list(builtin) + ["a mapping (your own model: "
                               "name, framework, build, path, input)"])
            else:
                raise _fail("models", item, f"a built-in model ({', '.join(builtin)}) or a "
                            "mapping (your own model: name, framework, build, path, input)")
        _unique([model_name(m) for m in out])
        return out

    one = Literal[builtin] | CustomModel  # for the JSON Schema
    return Annotated[list[Any], BeforeValidator(
        check, json_schema_input_type=one | Annotated[list[one], Field(min_length=1)]),
        Says("a model name, your own model (a mapping) or a list of them")]


def model_name(model: str | dict[str, Any]) -> str:
    """A `models:` value's name: a built-in's, or a user's entry's."""
    return model if isinstance(model, str) else model["name"]


def custom_entry(model: str | dict[str, Any]) -> dict[str, Any] | None:
    """A user's model entry (the run's custom_model), None for a built-in model."""
    return model if isinstance(model, dict) else None


def _telemetry_shorthand(value: Any) -> Any:
    """`telemetry: false` turns the sampler off; true or nothing: the defaults."""
    if value is False:
        return {"enabled": False}
    return {} if value is None or value is True else value


class _Options(_Section):
    """One runner's options: a model per runner, built from the registry's Options."""

    @classmethod
    def unknown_key(cls, path: str, key: Any, value: Any) -> ConfigError:
        return _unknown(f"{path} option", key, sorted(f.alias for f in cls.model_fields.values()))


def _not_bool(allowed: str) -> Any:
    """Refuse true and false where the allowed values are no booleans (1 == True)."""
    def check(value: Any) -> Any:
        if isinstance(value, bool):
            raise _refuse(allowed)
        return value
    return check


def _option_axis(name: str, says: Says, kind: Any) -> Any:
    """The validator of an option that may be an axis: a list of its values means one run per
    value (bench.plan.runs.option_variants), each value checked as the option's (an error
    names its index: runner_options.deepspeed.stage[1]) and listed once, and no two alike in
    a run id; a list of one value is that value."""
    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        if not isinstance(value, list):
            return handler(value)
        if not value:
            raise _refuse(f"{says.allowed}, or a non-empty list of them (an option axis: a "
                          "run for each)")
        out = []
        for i, item in enumerate(value):
            try:
                out.append(handler(item))
            except ValidationError as exc:
                error = exc.errors()[0]["type"]
                raise PydanticCustomError("config", "allowed: {allowed}", {
                    "allowed": dict(says.by_error).get(error, says.allowed), "index": i,
                    "item": item}) from None
        _unique(out)
        seen: dict[str, Any] = {}
        for i, item in enumerate(out):
            part = variant_part(name, item)
            if part in seen:
                raise PydanticCustomError("config", "allowed: {allowed}", {
                    "allowed": f"values whose run id parts differ ({_show(seen[part])} and "
                    f"this one are both {_show(part)}: characters but letters, digits, . and - "
                    "read as _)", "index": i, "item": item})
            seen[part] = item
        return out[0] if len(out) == 1 else out
    # the schema: a value, or a non-empty list of them
    return WrapValidator(check, json_schema_input_type=kind | Annotated[
        list[kind], Field(min_length=1, json_schema_extra={"uniqueItems": True})])


def _no_axis(name: str, says: Says) -> Any:
    """A COMMON option (python: the launcher's, the same for every run of the runner) takes one
    value: a list is refused, never an axis."""
    def check(value: Any) -> Any:
        if isinstance(value, list):
            raise _refuse(f"one value ({says.allowed}): {name} is the launcher's, the same for "
                          "every run of the runner, and no option axis")
        return value
    return BeforeValidator(check)


def _option(name: str, opt: Option) -> tuple[Any, FieldInfo]:
    """The declared type and field of one registry Option (the field named by an alias: an
    option may be named like a BaseModel attribute). A list of values is an option axis
    (_option_axis), but for an option whose own type is a list, and a COMMON option's."""
    types = opt.type if isinstance(opt.type, tuple) else (opt.type,)
    # what the child gets (JSON, argv, a path) cannot hold a NUL, an integer beyond 64 bits
    # or a float that is no number; a number is within the option's range where it has one
    low, high = opt.minimum, opt.maximum
    declared = {int: Annotated[int, Field(ge=-INT_MAX if low is None else low,
                                          le=INT_MAX if high is None else high)],
                float: Annotated[float, Field(ge=low, le=high, allow_inf_nan=False)],
                str: Annotated[str, Field(pattern=r"^[^\x00]*$")]}
    kind: Any = functools.reduce(operator.or_, (declared.get(t, t) for t in types))
    words = "an integer of magnitude < 2**63"
    if low is not None or high is not None:
        what = "an integer" if float not in types else "a number"
        words = (f"{what} from {low} to {high}" if low is not None and high is not None else
                 f"{what} >= {low}" if low is not None else f"{what} <= {high}")
    says = Says(words if low is not None or high is not None else
                " or ".join(t.__name__ for t in types), by_error=(
        ("string_pattern_mismatch", "a string without NUL characters"),
        ("less_than_equal", words), ("greater_than_equal", words),
        ("finite_number", "a finite number")))
    if opt.allowed is not None:
        kind, says = Literal[opt.allowed], Says(", ".join(map(str, opt.allowed)))
        if not any(isinstance(v, bool) for v in opt.allowed):  # Literal[1] takes True (== 1)
            kind = Annotated[kind, BeforeValidator(_not_bool(says.allowed))]
    if opt.default is None:
        # None where it is the default: "leave it to the program" (the script's own default,
        # for tf_cnn_benchmarks)
        kind = kind | None
    field = Field(opt.default, alias=name, description=opt.help or None)
    if name in COMMON_OPTIONS:
        return Annotated[kind, says, _no_axis(name, says)], field
    if opt.takes_list:
        return Annotated[kind, says], field
    # dumped as given: a value, or an axis's list
    return Annotated[kind, says, _option_axis(name, says, kind),
                     PlainSerializer(lambda value: value)], field


def _options_model(runner: str) -> type[_Options]:
    fields = {f"option_{i}": _option(name, opt)
              for i, (name, opt) in enumerate(runner_options(runner).items())}
    return create_model(f"{runner}_options", __base__=_Options, **fields)


def sweep_model() -> type[BaseModel]:
    """The pydantic model of a sweep file for this registry and these models (built once; again
    if a runner is added, as the tests' toy runner is)."""
    return _sweep_model(tuple((name, id(info)) for name, info in RUNNERS.items()),
                        tuple(available_models()))


@functools.lru_cache(maxsize=4)
def _sweep_model(runner_ids: tuple[tuple[str, int], ...], model_names: tuple[str, ...]
                 ) -> type[BaseModel]:
    runner_names = tuple(name for name, _ in runner_ids)
    per_runner = {r: _options_model(r) for r in runner_names}
    options = create_model(
        "runner_options", __base__=_Section,
        **{f"runner_{i}": (Annotated[per_runner[r] | None, Says("a mapping of option to value")],
                           Field(None, alias=r, description=RUNNERS[r].description))
           for i, r in enumerate(runner_names)})

    class Sweep(_Section):
        """A sweep: runners x models x data x precision x batch sizes x devices x repeats."""

        model_config = ConfigDict(title="mgbench sweep config")

        @classmethod
        def unknown_key(cls, path: str, key: Any, value: Any) -> ConfigError:
            return ConfigError(f"unknown key {_show(key)}{_hint(key, KEYS)}; allowed keys: "
                               f"{', '.join(KEYS)}")

        @field_validator("runner_options", mode="before", check_fields=False)
        @classmethod
        def _sweeps_runners(cls, raw: Any, info: ValidationInfo) -> Any:
            """Every key of runner_options names a runner of this sweep: a typo or a runner
            left out of `runners` would otherwise be options silently never used. The one
            exception is `narrowed`: runners the config file ran and gave options that a --set
            runners=[...] then dropped; their options are left out with a note."""
            if not isinstance(raw, dict) or "runners" not in info.data:
                return raw  # not a mapping: its own error; bad runners: theirs
            runners = info.data["runners"] or []
            narrowed = (info.context or {}).get("narrowed", frozenset())
            sweep = ", ".join(runners) if runners else "none (this sweep has no runners)"
            for runner in raw:
                if runner in runners:
                    continue
                if runner not in RUNNERS:
                    # the closest of this sweep's runners, else of all runners
                    hint = _hint(runner, runners) or _hint(runner, sorted(RUNNERS))
                    raise ConfigError(f"runner_options: {_show(runner)} is not a runner{hint}; "
                                      f"allowed: this sweep's runners: {sweep}")
                if runner not in narrowed:
                    raise ConfigError(f"runner_options: {runner!r} is not one of this sweep's "
                                      f"runners; allowed: {sweep} (add {runner} to runners, or "
                                      "remove its options)")
                # said once the whole file is valid (validate): one mistake, one line
                (info.context or {}).setdefault("notes", []).append(
                    f"note: runner_options.{runner} not used: --set runners left {runner} "
                    f"out of this sweep ({sweep})")
            return {r: opts for r, opts in raw.items() if r in runners}

        def options_of(self, runner: str) -> dict[str, Any]:
            """The runner's options over its defaults: on device gpu, an option the file left
            unset takes its gpu_default (contract/catalog.py Option.default_on)."""
            given = getattr(self.runner_options, f"runner_{runner_names.index(runner)}")
            model = given or per_runner[runner]()
            unset = {f.alias for name, f in type(model).model_fields.items()
                     if name not in model.model_fields_set}
            return {**model.model_dump(by_alias=True),
                    **{k: o.default_on(self.device) for k, o in runner_options(runner).items()
                       if k in unset}}

    # the keys' values the parent knows (the registry's, models/): what the declaration
    # leaves open
    choices = {"runners": runner_names, "models": model_names, "pipelines": tuple(PIPELINES),
               "probes": tuple(PROBES)}
    own = _own_types(options, model_names)
    keys = {s.key_name: _key(s, own.get(s.key_name), choices.get(s.key_name, ()))
            for s in settings.config_settings()}
    stale = sorted((set(own) | set(choices)) - set(keys))
    if stale:  # a key the declaration no longer has
        raise ValueError(f"bench/plan/config.py types keys contract/settings.py lacks: {stale}")
    return create_model("Sweep", __base__=Sweep, __doc__=Sweep.__doc__, **keys)


def _own_types(options: type[BaseModel], model_names: tuple[str, ...]) -> dict[str, Any]:
    """The keys whose validation is their own (words of their own, a nested mapping): their
    type, by key; the declaration (contract/settings.py) gives their default and description."""
    return {
        "models": _models_key(model_names),
        "name": Annotated[str | None, Field(min_length=1, pattern=r"^[^/\\ ]+$"), Says(
            "a non-empty string of printable characters without spaces or slashes")],
        "scaling": Annotated[Literal[SCALING] | None, Says(
            "one of weak, strong (one value for the whole sweep)", choices=SCALING)],
        "device": Annotated[Literal[DEVICES], Says("cpu, gpu (one value for the whole sweep)")],
        "timeout_s": Annotated[float, Field(gt=0, allow_inf_nan=False),
                               Says("a number of seconds > 0")],
        # a factory: a default naming every runner would fill the schema
        "runner_options": Annotated[options, Field(default_factory=options),
                                    Says("a mapping of runner name to its options")],
        "dataset": Annotated[Dataset | None, Says("a mapping of path, augmentation, workers")],
        "until_stable": Annotated[UntilStable | None, Says(
            "a mapping with target_cv (e.g. 0.02) and max_repeats")],
        "telemetry": Annotated[Telemetry, BeforeValidator(
            _telemetry_shorthand, json_schema_input_type=Telemetry | bool | None), Says(
            "a mapping of enabled, interval_s, starved_below_pct, or false")],
        "device_memory": Annotated[int | None, BeforeValidator(
            _size, json_schema_input_type=int | str | None), Says(SIZE_WORDS)],
        "capacity": Annotated[CapacitySearch, Says("a mapping of start, max, resolution")],
        "converge": Annotated[Converge, Says("a mapping of the training recipe's keys "
                                             "(docs/CONVERGENCE.md)")],
        "cluster": Annotated[Cluster, Says(
            "a mapping of backend, partition, account, gpus_per_node, exclusive, sbatch_args, "
            "max_jobs, poll_s")],
    }


def _declared(s: Setting, choices: tuple[str, ...]) -> Any:
    """The type of a key from its declaration: a count, a number, true or false, one of its
    choices or a string; an axis takes a list of them; a default of None admits null."""
    key = s.key
    assert key is not None
    choices = choices or key.choices
    if s.type is bool:
        kind: Any = Annotated[bool, Says("true or false")]
    elif s.type is int and key.minimum is not None:
        kind = _count(int(key.minimum), INT_MAX if key.maximum is None else int(key.maximum))
    elif s.type is float and key.minimum is not None:
        kind = _number(key.minimum, key.maximum)
    elif s.type is str:
        kind = _one_of(choices) if choices else Annotated[str, Says("a string")]
    else:
        raise TypeError(f"{s.key_name}: no type of {s.type!r} (an int or float needs a minimum)"
                        "; declare one, or type the key in bench/plan/config.py _own_types")
    if key.axis:
        kind = _axis(kind, empty_ok=key.empty_ok)
    return kind | None if s.key_default is None else kind


def _key(s: Setting, own: Any, choices: tuple[str, ...]) -> tuple[Any, FieldInfo]:
    """The pydantic field of a key: its type (its own, else the declaration's), its default
    and its description (the declaration's)."""
    kind = own if own is not None else _declared(s, choices)
    assert s.key is not None
    words = {"description": s.key.help} if s.key.help else {}
    default = s.key_default
    if default is REQUIRED or FieldInfo.from_annotation(kind).default_factory is not None:
        return kind, Field(**words)
    if isinstance(default, dict):  # a mapping's default ({}: every default of its section)
        [section] = _models_in(kind)
        default = section.model_validate(default)
    return kind, Field(default, **words)


def json_schema() -> dict[str, Any]:
    """The JSON Schema of a sweep file (what `run_bench.py schema` prints)."""
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            **sweep_model().model_json_schema()}


# --- pydantic's errors as one line ----------------------------------------------------------

def _translate(err: Any, model: type[BaseModel], raw: dict[str, Any]) -> ConfigError:
    """One pydantic error as the one-line ConfigError of the key it is about."""
    ctx = err.get("ctx") or {}
    if isinstance(ctx.get("error"), ConfigError):
        return ctx["error"]  # a validator's own message
    # walk the error's location down the models: the key path, its field, the mapping
    loc, path, info, section, node = list(err["loc"]), "", None, model, raw
    while loc and section is not None:
        fields = {f.alias or name: f for name, f in section.model_fields.items()}
        if loc[0] not in fields:
            break
        part = loc.pop(0)
        info, path = fields[part], _sub(path, part)
        node = node.get(part) if isinstance(node, dict) else None
        inner = _models_in(info.annotation) if loc and isinstance(node, dict) else []
        section = inner[0] if inner else None
    kind, value = err["type"], err.get("input")
    if kind in ("extra_forbidden", "invalid_key") and section is not None and loc:
        key = value if kind == "invalid_key" else loc[0]
        return section.unknown_key(path, key, node.get(key) if isinstance(node, dict) else None)
    if kind == "missing":
        return ConfigError(f"{path}: missing; this key is required")
    if kind == "repeated":
        times = "twice" if ctx["count"] == 2 else f"{ctx['count']} times"
        return ConfigError(f"{path}: {_show(ctx['item'])} appears {times}; list each value once")
    if "allowed" in ctx and "index" in ctx:  # an item of a list (an option axis)
        return _fail(f"{path}[{ctx['index']}]", ctx["item"], ctx["allowed"])
    if "allowed" in ctx:
        return _fail(path, value, ctx["allowed"])
    says = (_says_in(info) if info is not None else None) or Says(err["msg"])
    if says.choices and (isinstance(value, str) or not says.allowed):
        return _unknown(path, value, says.choices)
    return _fail(path or "config", value, dict(says.by_error).get(kind, says.allowed))


def _first_error(exc: ValidationError, model: type[BaseModel], raw: dict[str, Any]
                 ) -> ConfigError:
    errors = exc.errors(include_url=False)
    # an unknown top-level key first: often a typo of a key whose absence is an error too
    unknown = [e for e in errors if len(e["loc"]) == 1
               and e["type"] in ("extra_forbidden", "invalid_key")]
    return _translate((unknown or errors)[0], model, raw)


# --- rules that span keys -------------------------------------------------------------------

def _batch_sizes(per_device: list[int] | None, global_batch: list[int] | None,
                 scaling: str | None, devices: list[int]) -> tuple[str, list[int]]:
    """The scaling (given, or that of the batch key given) and its batch sizes."""
    if per_device is not None and global_batch is not None:
        raise ConfigError(
            "batch_size_per_device and global_batch_size: both given; allowed: exactly one "
            "(batch_size_per_device with scaling: weak, global_batch_size with scaling: strong)"
        )
    if per_device is None and global_batch is None:
        raise ConfigError("batch_size_per_device: missing; give it (weak scaling) "
                          "or global_batch_size (strong scaling)")
    if scaling is None:
        scaling = "weak" if per_device is not None else "strong"
    if scaling == "weak":
        if per_device is None:
            raise _fail("global_batch_size", global_batch,
                        "batch_size_per_device with scaling: weak (or set scaling: strong)")
        return scaling, per_device
    if global_batch is None:
        raise _fail("batch_size_per_device", per_device,
                    "global_batch_size with scaling: strong (or set scaling: weak)")
    for b in global_batch:
        for n in devices:
            if b % n:
                raise ConfigError(
                    f"global_batch_size: {b} does not divide by {n} devices; allowed: a "
                    f"multiple of every device count in {_show(devices)} (a remainder would be "
                    "dropped or give a short batch)")
    return scaling, global_batch


def _check_classes(dataset: dict[str, Any], models: list[Any]) -> None:
    """Labels must index the model's outputs: a dataset cannot have more classes (a token
    model takes no prepared dataset: its real-data runs are planned unavailable)."""
    try:
        classes = int(json.loads((Path(dataset["path"]) / "manifest.json").read_text())
                      ["classes"])
    except (OSError, ValueError, KeyError, TypeError, OverflowError) as exc:
        raise _fail("dataset.path", dataset["path"], f"a readable prepare-data folder ({exc})"
                    ) from None
    for model in models:
        entry = custom_entry(model)
        if entry is not None and entry["input"]["kind"] == "tokens":
            continue
        if entry is None and get_spec(model).input_kind == "tokens":
            continue
        outputs = entry["input"]["classes"] if entry else get_spec(model).num_classes
        model = model_name(model)
        if classes > outputs:
            raise _fail("dataset.path", dataset["path"],
                        f"a dataset of at most {outputs} classes for model {model} "
                        f"(this one has {classes})")


def _check_allreduce(s: Any) -> None:
    """mode allreduce: device counts given, at least one of 2 or more (a count of 1 is left
    out of the probe's runs: nothing to reduce; benchmark runs keep it), on this machine."""
    if "devices" not in s.model_fields_set:
        raise ConfigError("devices: missing; this key is required with mode allreduce (device "
                          "counts of 2 or more)")
    if max(s.devices) < 2:
        raise _fail("devices", s.devices, "a device count of 2 or more with mode allreduce (an "
                    "all-reduce needs 2 devices or more; a 1 is left out of the probe's runs)")
    if s.cluster.backend != "local":
        raise _fail("cluster.backend", s.cluster.backend, "local with mode allreduce (the "
                    "probes run on this machine's devices; none crosses nodes yet)")


CAPACITY_KEYS = ("device_memory", "scale", "capacity")  # capacity mode's alone


def depth_models() -> tuple[str, ...]:
    """The models a capacity search of scale depth can deepen: the built-in GPTs (their
    TransformerShape's layers, models.with_layers)."""
    return tuple(m for m in available_models()
                 if getattr(get_spec(m).transformer, "kind", None) == "gpt")


def _check_capacity(s: Any) -> None:
    """mode capacity: alone; runners and devices given; synthetic data, weak scaling, one
    repeat, on this machine; the batch given for depth only (the search sets it for batch),
    deepened models that are built-in GPTs; a device_memory budget on cpu; start <= max.
    Without it, none of its keys."""
    given = s.model_fields_set
    if "capacity" not in s.mode:  # their defaults are fine (a resolved config gives them all)
        defaults = {"device_memory": None, "scale": "batch",
                    "capacity": CapacitySearch().model_dump()}
        for key in CAPACITY_KEYS:
            value = getattr(s, key)
            value = value.model_dump() if isinstance(value, BaseModel) else value
            if value != defaults[key]:
                raise _fail(key, value, "nothing without mode capacity")
        return
    if s.mode != ["capacity"]:
        raise _fail("mode", s.mode, "capacity alone (its probes are benchmark runs of their "
                    "own; run the other modes in a sweep of their own)")
    for key in ("runners", "devices"):
        if key not in given:
            raise ConfigError(f"{key}: missing; this key is required with mode capacity")
    if not s.runners:
        raise _fail("runners", s.runners, "a non-empty list or a single value")
    if s.data != ["synthetic"]:
        raise _fail("data", s.data, "synthetic with mode capacity (a loader's host memory is "
                    "no device's)")
    if s.global_batch_size is not None or s.scaling == "strong":
        raise _fail("global_batch_size" if s.global_batch_size is not None else "scaling",
                    s.global_batch_size if s.global_batch_size is not None else s.scaling,
                    "weak scaling with mode capacity (a search is per device)")
    if s.scale == "batch" and s.batch_size_per_device is not None:
        raise _fail("batch_size_per_device", s.batch_size_per_device, "nothing with mode "
                    "capacity and scale batch (the search sets the batch per device; give it "
                    "with scale depth)")
    if s.scale == "depth":
        if s.batch_size_per_device is None:
            raise ConfigError("batch_size_per_device: missing; this key is required with scale "
                              "depth (the batch each probe trains at)")
        deep = depth_models()
        for model in s.models:
            if model_name(model) not in deep:
                raise _fail("models", model_name(model), f"{', '.join(deep)} with scale depth "
                            "(the built-in GPTs, whose layers a probe sets)")
    if s.device == "cpu" and s.device_memory is None:
        raise ConfigError("device_memory: missing; this key is required with mode capacity on "
                          "device cpu (the budget each virtual device's peak is checked "
                          "against, e.g. 512MiB)")
    if s.capacity.start > s.capacity.max:
        raise _fail("capacity.start", s.capacity.start,
                    f"an integer <= capacity.max ({s.capacity.max})")
    if s.repeats != 1 or s.until_stable is not None:
        raise _fail("repeats" if s.repeats != 1 else "until_stable", s.repeats if
                    s.repeats != 1 else s.until_stable.model_dump(), "1 (and no until_stable) "
                    "with mode capacity (each probe runs once)")
    if s.cluster.backend != "local":
        raise _fail("cluster.backend", s.cluster.backend, "local with mode capacity (each probe "
                    "follows from the one before, on this machine's devices)")


def _check_converge(s: Any) -> None:
    """mode converge: alone; runners and devices given; a dataset with its splits (make-dataset
    wrote splits.npz) whose classes the models have; data real (the splits); warm-up within
    max_epochs. Without it, no converge key."""
    if "converge" not in s.mode:
        if "converge" in s.model_fields_set and s.converge != Converge():
            raise _fail("converge", s.converge.model_dump(), "nothing without mode converge")
        return
    if s.mode != ["converge"]:
        raise _fail("mode", s.mode, "converge alone (its runs train to accuracy; run the other "
                    "modes in a sweep of their own)")
    for key in ("runners", "devices", "dataset"):
        if key not in s.model_fields_set or getattr(s, key) in (None, []):
            raise ConfigError(f"{key}: missing; this key is required with mode converge"
                              + (" (a folder written by `run_bench.py make-dataset --source "
                                 "digits|cifar10`)" if key == "dataset" else ""))
    if "data" in s.model_fields_set and s.data != ["real"]:
        raise _fail("data", s.data, "real with mode converge (it trains on the dataset's "
                    "training split)")
    for key in ("augmentation", "workers"):
        if key in s.dataset.model_fields_set:
            raise _fail(f"dataset.{key}", getattr(s.dataset, key), "nothing with mode converge "
                        "(it trains on the splits in memory; converge.augmentation sets its "
                        "augmentation)")
    path = Path(s.dataset.path) / "splits.npz"
    if not path.is_file():
        raise _fail("dataset.path", s.dataset.path, "a folder with a training and held-out "
                    "split (splits.npz) with mode converge: one written by `run_bench.py "
                    "make-dataset --source digits|cifar10`")
    if s.converge.warmup_epochs > s.converge.max_epochs:
        raise _fail("converge.warmup_epochs", s.converge.warmup_epochs,
                    f"a number <= converge.max_epochs ({s.converge.max_epochs})")
    _check_classes(s.dataset.model_dump(), s.models)


def _resolve(s: Any, default_name: str) -> SweepConfig:
    """The validated file as a SweepConfig, once the rules that span keys hold."""
    benchmark, pipeline = "benchmark" in s.mode, "pipeline" in s.mode
    allreduce = "allreduce" in s.mode
    _check_capacity(s)
    _check_converge(s)
    custom = [model_name(m) for m in s.models if custom_entry(m)]
    if custom and (pipeline or allreduce):
        raise _fail("models", custom[0], "a built-in model with mode "
                    f"{'pipeline' if pipeline else 'allreduce'} (your own model's input size "
                    "and gradient bytes are known only in its run; mode benchmark runs it)")
    if allreduce:
        _check_allreduce(s)
    if benchmark:
        for key in ("runners", "devices"):
            if key not in s.model_fields_set:
                raise ConfigError(f"{key}: missing; this key is required")
        if not s.runners:
            raise _fail("runners", s.runners, "a value or a list of values" if s.runners is None
                        else "a non-empty list or a single value")
    if max(s.nodes) > 1 and s.cluster.backend != "slurm":
        raise _fail("nodes", s.nodes, "[1] unless cluster.backend is slurm (a run over "
                    "several nodes is one SLURM job; set cluster: {backend: slurm})")
    if s.until_stable is not None and s.cluster.backend == "slurm":
        raise _fail("until_stable", s.until_stable.model_dump(), "nothing with cluster.backend: "
                    "slurm (its repeats are decided run by run; use repeats)")
    # strong scaling divides the global batch by the devices of all nodes
    totals = s.devices if s.nodes == [1] else sorted({n * d for n in s.nodes for d in s.devices})
    if not (benchmark or pipeline or "converge" in s.mode) and s.batch_size_per_device is None \
            and s.global_batch_size is None:
        scaling, batch_sizes = s.scaling or "weak", []  # the probe alone: no batch
    else:
        scaling, batch_sizes = _batch_sizes(s.batch_size_per_device, s.global_batch_size,
                                            s.scaling, totals)
    name = s.name if s.name is not None else default_name
    # the name is a folder name (results/<name>-<time>) and printed: printable characters
    if not name or not name.isprintable() or any(c in name for c in "/\\ "):
        raise _fail("name", name, "a non-empty string of printable characters without spaces "
                    "or slashes")
    if s.dataset is None and (pipeline or (benchmark and "real" in s.data)):
        why = "mode includes pipeline" if pipeline else "data includes real"
        raise _fail("dataset", None, "a mapping with path: <a folder written by "
                    f"`run_bench.py prepare-data`> when {why}")
    dataset = s.dataset.model_dump() if s.dataset is not None else None
    if dataset and "converge" in s.mode:  # its path alone (the splits in memory)
        dataset = {"path": dataset["path"]}
    if dataset and "real" in s.data and benchmark:
        _check_classes(dataset, s.models)
    if s.until_stable is not None and s.repeats < 2:
        raise _fail("repeats", s.repeats, "an integer >= 2 with until_stable (the coefficient "
                    "of variation of one run is undefined)")
    if s.until_stable is not None and s.until_stable.max_repeats < s.repeats:
        raise _fail("until_stable.max_repeats", s.until_stable.max_repeats,
                    f"an integer >= {s.repeats}")
    # a pipeline-only sweep needs no runners (but checks those of the file it came from)
    runners = s.runners or []
    # every key as the file gave it (a mapping as a dict), but those resolved here
    given = {key: getattr(s, key) for key in KEYS if key not in BATCH_KEYS}
    return SweepConfig(**{
        **{k: v.model_dump() if isinstance(v, BaseModel) else v for k, v in given.items()},
        "name": name, "runners": runners, "scaling": scaling, "batch_sizes": batch_sizes,
        **({"data": ["real"]} if "converge" in s.mode else {}),
        "runner_options": {r: s.options_of(r) for r in runners}, "dataset": dataset,
        # every pipeline unless named (named ones are checked even when mode leaves them out,
        # so a typo never waits for the day they run)
        "pipelines": s.pipelines or (list(PIPELINES) if pipeline else []),
        # every probe unless named (named ones are checked whatever the mode, as pipelines)
        "probes": s.probes or (list(PROBES) if allreduce else []),
    })


def validate(raw: Any, default_name: str = "sweep", narrowed: frozenset[str] = frozenset()
             ) -> SweepConfig:
    """Turn a parsed YAML mapping into a SweepConfig, or raise ConfigError."""
    if not isinstance(raw, dict):
        raise ConfigError("config: expected a mapping of keys at the top level, got "
                          f"{_show(raw)}")
    model = sweep_model()
    context: dict[str, Any] = {"narrowed": narrowed, "notes": []}
    try:
        sweep = model.model_validate(raw, context=context)
    except ValidationError as exc:
        raise _first_error(exc, model, raw) from None
    resolved = _resolve(sweep, default_name)
    for note in context["notes"]:
        print(note, file=sys.stderr)
    return resolved


class DuplicateKeyError(yaml.constructor.ConstructorError):
    """A mapping in the YAML gives one key twice (YAML forbids it; PyYAML keeps the last)."""

    def __init__(self, key: Any, line: int, first_line: int) -> None:
        self.key, self.line, self.first_line = key, line, first_line
        super().__init__(problem=f"key {_show(key)} appears twice (lines {first_line} and "
                         f"{line})")


# What a sweep file (or a --set value) may hold, checked before anything is built from it:
MAX_CONFIG_BYTES = 2**20  # a sweep file: 1 MiB (read no further)
MAX_SET_BYTES = 2**16  # one --set value: 64 KiB
MAX_SET_PARTS = 8  # dotted parts of a --set key (runner_options.<runner>.<option> has 3)
MAX_YAML_DEPTH = 32  # levels of nesting, aliases expanded
# nodes plus the characters of the scalars, aliases expanded: an alias bomb (anchors of
# anchors, each listing the one before ten times) grows tenfold a line; refused here, before
# Python objects are built, whatever the value is for
MAX_YAML_SIZE = 4 * MAX_CONFIG_BYTES


class YamlTooLarge(yaml.YAMLError):
    """A YAML document past a bound (MAX_YAML_DEPTH, MAX_YAML_SIZE): what, where, what is
    allowed."""

    def __init__(self, what: str, allowed: str, mark: Any = None) -> None:
        where = f" at line {mark.line + 1}" if mark is not None else ""
        self.what, self.allowed = what + where, allowed
        super().__init__(self.what)


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a key given twice in one mapping, at any depth (a second
    `runners:` line would silently replace the first), turns a scalar that cannot be
    built (an int of more than 4300 digits, the 13th month) into a YAMLError with its line,
    and refuses a document nested more than MAX_YAML_DEPTH levels or larger than
    MAX_YAML_SIZE once its aliases are expanded (YamlTooLarge), before building it."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._checked: set[int] = set()
        self._depth = 0
        self._sizes: dict[int, tuple[int, int]] = {}  # id(node): (size, levels), expanded

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise YamlTooLarge(f"nested more than {MAX_YAML_DEPTH} levels deep",
                                   f"YAML nested at most {MAX_YAML_DEPTH} levels deep",
                                   self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Any:
        node = super().compose_document()
        self._expanded(node, 1)
        return node

    def _expanded(self, node: yaml.Node, depth: int) -> tuple[int, int]:
        """(size, levels) of node with its aliases expanded: its nodes plus its scalars'
        characters, and the levels it nests; YamlTooLarge past a bound. Each node once (an
        alias is the node it names), so the cost is the document's, not the expansion's."""
        known = self._sizes.get(id(node))
        if known is None:
            if depth > MAX_YAML_DEPTH:  # an alias of an alias ..., or of its own anchor
                raise YamlTooLarge(f"nested more than {MAX_YAML_DEPTH} levels deep once its "
                                   "aliases are expanded",
                                   f"YAML nested at most {MAX_YAML_DEPTH} levels deep",
                                   node.start_mark)
            if isinstance(node, yaml.ScalarNode):
                known = (1 + len(node.value), 0)
            else:
                children = [n for pair in node.value for n in pair] \
                    if isinstance(node, yaml.MappingNode) else node.value
                size, levels = 1, 0
                for child in children:
                    child_size, child_levels = self._expanded(child, depth + 1)
                    size, levels = size + child_size, max(levels, child_levels + 1)
                    if size > MAX_YAML_SIZE:
                        break
                known = (size, levels)
            self._sizes[id(node)] = known
        if depth + known[1] > MAX_YAML_DEPTH:
            raise YamlTooLarge(f"nested more than {MAX_YAML_DEPTH} levels deep once its "
                               "aliases are expanded",
                               f"YAML nested at most {MAX_YAML_DEPTH} levels deep",
                               node.start_mark)
        if known[0] > MAX_YAML_SIZE:
            raise YamlTooLarge(f"more than {MAX_YAML_SIZE:,} nodes and characters once its "
                               "aliases are expanded", "YAML whose aliases expand to at most "
                               f"{MAX_YAML_SIZE:,} nodes and characters", node.start_mark)
        return known

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
    except YamlTooLarge as exc:
        raise ConfigError(f"{where} is not allowed: {exc.what}; allowed: {exc.allowed}"
                          ) from None
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
    shown = key if re.fullmatch(r"[\w.-]+", key, re.ASCII) and len(key) <= SHOW_CHARS \
        else _show(key)
    parts = key.split(".")
    if len(parts) > MAX_SET_PARTS:
        raise ConfigError(f"--set {shown}: a key of {len(parts)} dotted parts is not allowed; "
                          f"allowed: at most {MAX_SET_PARTS} (e.g. "
                          "runner_options.tf_mirrored.xla)")
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SET_BYTES:
        raise ConfigError(f"--set {shown}: {_show(text)} is not allowed; allowed: a value of "
                          f"at most {MAX_SET_BYTES // 1024} KiB (put a longer one in the "
                          "config file)")
    value = parse_yaml(text, f"--set {shown}: {_show(text)}")
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
    if len(problem) > 2 * SHOW_CHARS:  # it may quote a token: an alias or tag 1 MiB long
        problem = f"{problem[:2 * SHOW_CHARS]}... ({len(problem)} characters)"
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark else problem


_FILE_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISSOCK, "a socket"))


def read_config_text(path: Path) -> str:
    """The text of a sweep file: a regular file (a FIFO or a device is refused before it is
    read: /dev/zero would never end), at most MAX_CONFIG_BYTES of it read, in UTF-8; a
    ConfigError naming --config otherwise."""
    shown = _show_path(path)
    try:
        # O_NONBLOCK: opening a FIFO waits for no writer (it is refused below, unread)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except FileNotFoundError:
        raise ConfigError(f"--config: {shown} does not exist; allowed: a path to a YAML "
                          "file (e.g. configs/cpu-smoke.yaml)") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise ConfigError(f"--config: {shown} cannot be read "
                          f"({getattr(exc, 'strerror', None) or exc})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            kind = next((name for test, name in _FILE_KINDS if test(mode)), "no regular file")
            raise ConfigError(f"--config: {shown} is {kind}; allowed: a YAML file")
        with os.fdopen(fd, "rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"--config: {shown} cannot be read ({exc.strerror or exc})") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"--config: {shown} is larger than {MAX_CONFIG_BYTES // 2**20} MiB; "
                          f"allowed: a YAML file of at most {MAX_CONFIG_BYTES:,} bytes")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--config: {shown} is not UTF-8 text (byte {exc.start}); "
                          "allowed: a YAML file in UTF-8") from None


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> SweepConfig:
    """Read, override and validate a YAML sweep file."""
    path = Path(path)
    text = read_config_text(path)
    raw = parse_yaml(text, f"--config: {_show_path(path)}")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"--config: {_show_path(path)} holds {type(raw).__name__}; allowed: a "
                          "mapping of keys (runners, models, devices, ...)")
    # runners the file runs and gives options to: a --set runners=[...] may drop them
    own = raw.get("runners") if isinstance(raw.get("runners"), list) else [raw.get("runners")]
    opts = raw.get("runner_options") if isinstance(raw.get("runner_options"), dict) else {}
    given = frozenset(r for r in opts if isinstance(r, str) and r in own)
    for assignment in overrides:
        apply_override(raw, assignment)
    sets_runners = any(str(a).split("=", 1)[0].strip() == "runners" for a in overrides)
    return validate(raw, default_name=path.stem, narrowed=given if sets_runners else frozenset())
