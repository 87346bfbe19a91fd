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
    fig.tight_layout()
    try:
        save_figure(fig, path, 110)
    finally:
        plt.close(fig)
    return path


def save_figure(fig: Any, path: Path, dpi: int) -> Path:
    """fig as an image at path (its format from the suffix), written whole or not at all
    (bench.records.store.atomic_file: a temporary name, the umask's permissions)."""
    from bench.atomic import atomic_file

    with atomic_file(path, "wb") as fh:
        fig.savefig(fh, dpi=dpi, format=Path(path).suffix.lstrip(".") or "png")
    return path
