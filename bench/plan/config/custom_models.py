"""The models key: built-in models by name, a user's own model as a mapping (CustomModel),
each name once."""

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, ValidationError

from bench.errors import ConfigError
from bench.plan.config.declared import _as_list, _unique
from bench.plan.config.messages import Says, _fail, _unknown
from bench.plan.config.sections import CustomModel
from bench.plan.config.translate import _first_error

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

    one: Any = Literal[builtin] | CustomModel  # for the JSON Schema
    return Annotated[list[Any], BeforeValidator(
        check, json_schema_input_type=one | Annotated[list[one], Field(min_length=1)]),
        Says("a model name, your own model (a mapping) or a list of them")]


def model_name(model: str | dict[str, Any]) -> str:
    """A `models:` value's name: a built-in's, or a user's entry's."""
    return model if isinstance(model, str) else model["name"]


def custom_entry(model: str | dict[str, Any]) -> dict[str, Any] | None:
    """A user's model entry (the run's custom_model), None for a built-in model."""
    return model if isinstance(model, dict) else None
