"""Matplotlib for the report's charts, on the file-only Agg backend (no display needed), and
the style every chart shares: a series is told apart by its marker AND its line style, not
only its colour, so a greyscale print still separates them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

# Filled markers and solid/dashed/dash-dot lines for measured series: 8 markers x 3 styles
# give 24 distinct (marker, style) pairs (lcm(8, 3)). Dotted lines and hollow markers are
# left to the published figures (bench/analysis/published.py), so the two never share a pair.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", "-.")
PUBLISHED_MARKERS = ("s", "D", "^", "v", "P", "X", "*", "<", ">", "h", "p", "d", "8", "H")
# tab10's colours differ in lightness as well as hue; the published points use Dark2.
COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
PUBLISHED_COLOURS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02",
                     "#a6761d", "#666666")
IDEAL = {"color": "0.4", "linestyle": (0, (2, 2)), "linewidth": 1.0}  # short dashes, no marker
# A flagged point (bench/records/trust.py doubts: not a result): its series' marker, larger and
# white inside, with "?" and its value beside; the published figures' hollow markers are
# smaller, unlabelled and on dotted lines. A flagged bar is hatched.
FLAGGED = {"markerfacecolor": "white", "markersize": 10, "markeredgewidth": 1.8,
           "linestyle": "none", "zorder": 4}
FLAGGED_HATCH = "xx"
# A configuration that failed (no figure): a red x on the panel's floor at its device count.
FAILED = {"marker": "x", "color": "#d62728", "markersize": 9, "markeredgewidth": 2,
          "linestyle": "none"}


def series_style(i: int) -> dict[str, Any]:
    """Keyword arguments of ax.plot for the i-th measured series of a chart."""
    return {"color": COLOURS[i % len(COLOURS)], "marker": MARKERS[i % len(MARKERS)],
            "linestyle": LINESTYLES[i % len(LINESTYLES)], "markersize": 5, "linewidth": 1.6,
            "zorder": 3}  # over the published points


def published_style(i: int) -> dict[str, Any]:
    """Keyword arguments of ax.plot for the i-th published system of a chart: a hollow
    marker on a dotted line."""
    return {"color": PUBLISHED_COLOURS[i % len(PUBLISHED_COLOURS)],
            "marker": PUBLISHED_MARKERS[i % len(PUBLISHED_MARKERS)], "linestyle": ":",
            "markersize": 7, "markerfacecolor": "none", "linewidth": 0.9}


def virtual_note(rows: Iterable[Mapping[str, Any]]) -> str:
    """The title's words for a chart whose rows ran on virtual CPU devices ('' otherwise):
    in the title, not only small print, so nobody reads it as GPU scaling."""
    return (", virtual CPU devices (not GPU scaling)"
            if any(r.get("virtual_devices") for r in rows) else "")


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
    (bench.records.store.atomic_file: a temporary name, the umask's permissions). A PNG is
    stored with a palette of 256 colours (Pillow's fast octree, ~10 ms a chart): about a third
    of matplotlib's RGBA bytes for the same picture, which report.html carries inline for
    every chart and run."""
    import io

    from bench.atomic import atomic_file

    kind = Path(path).suffix.lstrip(".") or "png"
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=dpi, format=kind)
    data = buffer.getvalue()
    if kind == "png":
        data = _palette_png(data)
    with atomic_file(path, "wb") as fh:
        fh.write(data)
    return path


def _palette_png(data: bytes) -> bytes:
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as image:
        out = io.BytesIO()
        image.convert("RGB").quantize(colors=PALETTE_COLOURS,
                                      method=Image.Quantize.FASTOCTREE).save(out, "PNG")
    return out.getvalue()


PALETTE_COLOURS = 256
