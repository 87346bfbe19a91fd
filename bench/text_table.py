"""Plain-text tables for the terminal: cells padded into columns, a rule under the header."""

from __future__ import annotations

from collections.abc import Sequence


def aligned(lines: Sequence[Sequence[object]]) -> list[str]:
    """Rows of cells as text columns, a rule of dashes under the first (the header)."""
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(lines[0]))]
    out = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
           for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return out
