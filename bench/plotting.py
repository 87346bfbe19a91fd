"""Matplotlib for the report's charts, on the file-only Agg backend (no display needed)."""

from __future__ import annotations

from typing import Any


def pyplot() -> Any:
    """matplotlib.pyplot with the Agg backend, imported only when a chart is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
