"""The option checks make-dataset and prepare-data share: an integer in its range (the JPEG
quality up to MAX_QUALITY), a new or empty output folder; each fails as a one-line
ConfigError (option, value, what is allowed)."""

from __future__ import annotations

from pathlib import Path

from bench.errors import ConfigError

MAX_QUALITY = 95  # Pillow: above 95 JPEG gets much bigger for no visible gain


def integer_in(flag: str, value: int, low: int, high: int) -> None:
    """ConfigError unless low <= value <= high."""
    if not low <= value <= high:
        raise ConfigError(f"{flag}: {value} is not allowed; allowed: an integer from {low} to "
                          f"{high}")


def new_folder(out: Path) -> None:
    """ConfigError for an --out that is a file or a folder with something in it."""
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        what = "a folder that is not empty" if out.is_dir() else "an existing file"
        raise ConfigError(f"--out: {str(out)!r} is {what}; allowed: a new or empty folder")
