"""Pydantic's errors as one line: the first error of a validation, as the ConfigError of the
key it is about (its path, the value, the words its field declares)."""

from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from bench.errors import ConfigError
from bench.plan.config.messages import Says, _fail, _models_in, _says_in, _show, _sub, _unknown


def _translate(err: Any, model: type[BaseModel], raw: dict[str, Any]) -> ConfigError:
    """One pydantic error as the one-line ConfigError of the key it is about."""
    ctx = err.get("ctx") or {}
    if isinstance(ctx.get("error"), ConfigError):
        return ctx["error"]  # a validator's own message
    # walk the error's location down the models: the key path, its field, the mapping
    loc, path, info = list(err["loc"]), "", None
    section: Any = model  # a _Section (its unknown_key), None below the models
    node: Any = raw  # the mapping at path, as the file gave it
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
    return leaf_error(err, path, info)


def leaf_error(err: Any, path: str, info: FieldInfo | None) -> ConfigError:
    """The error of a value (no mapping of the config below it) at path, in the words of its
    field (info)."""
    ctx, kind, value = err.get("ctx") or {}, err["type"], err.get("input")
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
