"""A generated block of a doc: the text between a begin and an end marker, rewritten by its
generator's `--markdown` and kept current by a fast test. Framework-free."""

from __future__ import annotations


def splice(text: str, begin: str, end: str, body: str) -> str:
    """`text` with what lies between `begin` and `end` replaced by body (newline-framed)."""
    start, stop = text.index(begin) + len(begin), text.index(end)
    return text[:start] + "\n" + body + text[stop:]
