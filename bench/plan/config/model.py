"""The sweep file's pydantic model, built from the declaration (contract/settings.py), the
registry (every runner's options) and models/; and its JSON Schema."""

import functools
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    create_model,
    field_validator,
)
from pydantic.fields import FieldInfo

from bench.catalog.registry import PIPELINES, PROBES, RUNNERS, runner_options
from bench.errors import ConfigError
from bench.plan.config.batches import per_model
from bench.plan.config.custom_models import _models_key
from bench.plan.config.declared import (
    INT_MAX,
    SIZE_WORDS,
    _axis,
    _count,
    _number,
    _one_of,
    _Section,
    _size,
)
from bench.plan.config.messages import Says, _hint, _models_in, _show
from bench.plan.config.options import _Options, _options_model
from bench.plan.config.sections import (
    CapacitySearch,
    Cluster,
    Converge,
    Dataset,
    Telemetry,
    UntilStable,
    _telemetry_shorthand,
)
from bench.plan.config.sweep_config import BATCH_KEYS, KEYS
from contract import settings
from contract.settings import DEVICES, REQUIRED, SCALING, Setting
from models import available_models


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
    option_fields: dict[str, Any] = {
        f"runner_{i}": (Annotated[per_runner[r] | None, Says("a mapping of option to value")],
                        Field(None, alias=r, description=RUNNERS[r].description))
        for i, r in enumerate(runner_names)}
    options = create_model("runner_options", __base__=_Section, **option_fields)
    Sweep = _sweep_base(runner_names, per_runner)
    # the keys' values the parent knows (the registry's, models/): what the declaration
    # leaves open
    choices = {"runners": runner_names, "models": model_names, "pipelines": tuple(PIPELINES),
               "probes": tuple(PROBES)}
    own = _own_types(options, model_names)
    keys: dict[str, Any] = {
        s.key_name: _key(s, own.get(s.key_name), choices.get(s.key_name, ()))
        for s in settings.config_settings()}
    stale = sorted((set(own) | set(choices)) - set(keys))
    if stale:  # a key the declaration no longer has
        raise ValueError("bench/plan/config/model.py types keys contract/settings.py lacks: "
                         f"{stale}")
    return create_model("Sweep", __base__=Sweep, __doc__=Sweep.__doc__, **keys)


def _sweep_base(runner_names: tuple[str, ...], per_runner: dict[str, type[_Options]]
                ) -> type[_Section]:
    """The base of the sweep's model: its unknown key's words, runner_options checked against
    the sweep's runners, and each runner's options over their defaults."""

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
            return _sweeps_runners(raw, info)

        def options_of(self, runner: str) -> dict[str, Any]:
            """The runner's options over its defaults: on device gpu, an option the file left
            unset takes its gpu_default (contract/catalog.py Option.default_on)."""
            sweep: Any = self  # its fields are the declaration's (create_model)
            given = getattr(sweep.runner_options, f"runner_{runner_names.index(runner)}")
            model = given or per_runner[runner]()
            unset = {f.alias for name, f in type(model).model_fields.items()
                     if name not in model.model_fields_set}
            return {**model.model_dump(by_alias=True),
                    **{k: o.default_on(sweep.device) for k, o in runner_options(runner).items()
                       if k in unset}}

    return Sweep


def _sweeps_runners(raw: Any, info: ValidationInfo) -> Any:
    """Every key of runner_options names a runner of this sweep: a typo or a runner left out
    of `runners` would otherwise be options silently never used. The one exception is
    `narrowed`: runners the config file ran and gave options that a --set runners=[...] then
    dropped; their options are left out with a note."""
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
    choices or a string; an axis takes a list of them, a batch key a mapping of model name to
    them too (batches.per_model); a default of None admits null."""
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
                        "; declare one, or type the key in bench/plan/config/model.py _own_types")
    if key.axis:
        kind = _axis(kind, empty_ok=key.empty_ok)
    if s.key_name in BATCH_KEYS:  # or a mapping of model name to them
        kind = per_model(kind)
    return kind | None if s.key_default is None else kind


def _key(s: Setting, own: Any, choices: tuple[str, ...]) -> tuple[Any, FieldInfo]:
    """The pydantic field of a key: its type (its own, else the declaration's), its default
    and its description (the declaration's)."""
    kind = own if own is not None else _declared(s, choices)
    assert s.key is not None
    words: dict[str, Any] = {"description": s.key.help} if s.key.help else {}
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
