"""Declared types of the config's keys: pydantic types with their words (`Says`): a count, a
number, an axis (one value or a list of them, each once), one of some strings, a size in
bytes; and `_Section`, the base of every mapping (strict, no unknown keys)."""

import re
from collections import Counter
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from bench.errors import ConfigError
from bench.plan.config.messages import Says, _fail, _refuse, _says_in, _sub

INT_MAX = 2**63 - 1  # integers beyond are no count of anything (and may not even print)


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
