"""runner_options: a pydantic model per runner from the registry's Options; a list given to
an option is an option axis (a run per value)."""

import functools
import operator
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    PlainSerializer,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    create_model,
)
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from bench.catalog.registry import COMMON_OPTIONS, Option, runner_options
from bench.errors import ConfigError
from bench.plan.config.declared import INT_MAX, _Section, _unique
from bench.plan.config.messages import Says, _refuse, _show, _unknown
from bench.records.grouping import variant_part


class _Options(_Section):
    """One runner's options: a model per runner, built from the registry's Options."""

    @classmethod
    def unknown_key(cls, path: str, key: Any, value: Any) -> ConfigError:
        return _unknown(f"{path} option", key, sorted(f.alias for f in cls.model_fields.values()
                                                          if f.alias))


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
        if isinstance(value, str) and not value.strip():  # it was taken for "not given"
            raise _refuse("a non-empty path of the Python interpreter to use")
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
    fields: dict[str, Any] = {f"option_{i}": _option(name, opt)
              for i, (name, opt) in enumerate(runner_options(runner).items())}
    return create_model(f"{runner}_options", __base__=_Options, **fields)
