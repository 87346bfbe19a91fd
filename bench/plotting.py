"""Matplotlib for the report's charts, on the file-only Agg backend (no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def pyplot() -> Any:
    """matplotlib.pyplot with the Agg backend, imported only when a chart is drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path, plt: Any) -> Path:
    """Lay the figure out, write it to path (its folder made) at the report's dpi, close it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
