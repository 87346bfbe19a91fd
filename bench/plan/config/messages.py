"""The config's one-line messages: a value shown short, the key path it sits at, the closest
allowed value, and `Says`, the words a field declares for its error."""

import difflib
import re
import reprlib
import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError

from bench.errors import ConfigError

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
