"""What a runner's child reports: its result fields, joined so that no field is given twice.

A runner assembles its result from parts (the timed window's summary, its model fields, its
state and precision records, its own evidence); `join` merges them and fails at once, naming
the field, when two parts give the same field, where a dict literal's `{**a, **b}` would let
the later part win silently."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class FieldClash(RuntimeError):
    """Two parts of a result give the same field: the runner's bug, said at once."""


def join(*parts: Mapping[str, Any]) -> dict[str, Any]:
    """The union of `parts`; FieldClash naming every field that two of them give."""
    out: dict[str, Any] = {}
    clash: set[str] = set()
    for part in parts:
        clash.update(k for k in part if k in out)
        out.update(part)
    if clash:
        raise FieldClash(f"result fields given twice: {sorted(clash)}")
    return out
