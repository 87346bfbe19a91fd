"""The batch keys (batch_size_per_device, global_batch_size): one value or a list of them for
every model, or a mapping of model name (as `models:` names it; a user's model by its name)
to its own, with a `default` entry for the models it does not name. `per_model` types a key;
`model_batches` resolves a mapping against the sweep's models; `batch_entries` lists what
the strong-scaling rule checks."""

from typing import Annotated, Any

from pydantic import ValidationError, ValidatorFunctionWrapHandler, WrapValidator
from pydantic.fields import FieldInfo
from pydantic_core.core_schema import ValidationInfo

from bench.errors import ConfigError
from bench.plan.config.messages import _fail, _hint, _show, _sub
from bench.plan.config.sweep_config import BATCH_KEYS
from bench.plan.config.translate import leaf_error

DEFAULT = "default"  # a mapping's entry for the models it does not name
ENTRY_WORDS = "an integer >= 1 or a list of them"


def per_model(axis: Any) -> Any:
    """The type of a batch key: `axis` (its declared type: one value or a list), or a mapping
    of name to such a value, each entry validated as the axis is (its error names key.name).
    The rule that spans keys (the names are the sweep's models) is model_batches'."""
    info = FieldInfo.from_annotation(axis)

    def check(value: Any, handler: ValidatorFunctionWrapHandler, where: ValidationInfo) -> Any:
        if not isinstance(value, dict):
            return handler(value)
        out = {}
        for name, entry in value.items():
            path = _sub(str(where.field_name), name)
            if entry is None:
                raise _fail(path, entry, ENTRY_WORDS)
            try:
                out[name] = handler(entry)
            except ValidationError as exc:
                raise leaf_error(exc.errors(include_url=False)[0], path, info) from None
        return out

    return Annotated[axis, WrapValidator(check, json_schema_input_type=axis | dict[str, axis])]


def model_batches(key: str, given: dict[Any, list[int]], models: list[str]
                  ) -> dict[str, list[int]]:
    """Each model's batches from a mapping (its entry, else the default), by model in the
    sweep's order; a name that is no model of the sweep, or a model with neither, refused."""
    allowed = [*models, DEFAULT]
    for name in given:
        if name not in allowed:
            raise ConfigError(f"{key}: {_show(name)} is not one of this sweep's models"
                              f"{_hint(name, allowed)}; allowed: {', '.join(allowed)}")
    out = {}
    for model in models:
        batches = given.get(model, given.get(DEFAULT))
        if batches is None:
            raise ConfigError(f"{_sub(key, model)}: missing; give {model} its batch, or a "
                              f"{DEFAULT} entry for the models the mapping does not name")
        out[model] = batches
    return out


def batch_entries(key: str, batches: list[int] | dict[str, list[int]]
                  ) -> list[tuple[str, list[int]]]:
    """(the key path, its batches): the key's one list, or each model's."""
    if isinstance(batches, dict):
        return [(_sub(key, model), own) for model, own in batches.items()]
    return [(key, batches)]


def model_names(models: Any) -> set[str]:
    """The names a `models:` value gives, read before validation: a name, or a mapping's
    name (anything else is its own error later)."""
    items = models if isinstance(models, list) else [models]
    names = [m if isinstance(m, str) else m.get("name") if isinstance(m, dict) else None
             for m in items]
    return {n for n in names if isinstance(n, str)}


def narrow_batches(raw: dict[str, Any], file_models: set[str], keep: set[str]) -> list[str]:
    """After a --set models=[...]: a batch mapping's entries for models the file named and the
    new models leave out, dropped (or the mapping would name no model of the sweep), with a
    note each; the batch keys in `keep` (given by a --set of their own) are left as given."""
    kept, notes = model_names(raw.get("models")), []
    for key in BATCH_KEYS:
        given = raw.get(key)
        if key in keep or not isinstance(given, dict):
            continue
        dropped = [n for n in given if n in file_models and n not in kept]
        raw[key] = {n: v for n, v in given.items() if n not in dropped}
        notes += [f"note: {key}.{n} not used: --set models left {n} out of this sweep"
                  for n in dropped]
    return notes
