"""Synthetic real-JPEG datasets in ImageNet folder style: <out>/<class>/<image>.jpg."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from bench import __version__
from bench.data.checks import MAX_QUALITY, integer_in, new_folder
from bench.errors import ConfigError

MIN_SIZE, MAX_SIZE = 8, 4096
MAX_IMAGES = 10_000_000  # images (and classes) of one synthetic dataset


def class_names(classes: int) -> list[str]:
    """Folder names class_000, class_001, ... (wider when there are more than 1000)."""
    width = max(3, len(str(classes - 1)))
    return [f"class_{k:0{width}d}" for k in range(classes)]


def per_class_counts(classes: int, images: int) -> list[int]:
    """N images spread evenly over K classes; the first N mod K classes get one more."""
    base, extra = divmod(images, classes)
    return [base + (1 if k < extra else 0) for k in range(classes)]


def validate(out: Path, classes: int, images: int, size: int, quality: int) -> None:
    """ConfigError (one line: option, value, what is allowed) for bad make-dataset input."""
    integer_in("--classes", classes, 1, MAX_IMAGES)
    if not classes <= images <= MAX_IMAGES:
        raise ConfigError(f"--images: {images} is not allowed; allowed: an integer from "
                          f"--classes ({classes}), so every class gets an image, to {MAX_IMAGES}")
    integer_in("--size", size, MIN_SIZE, MAX_SIZE)
    integer_in("--quality", quality, 1, MAX_QUALITY)
    new_folder(out)


def class_style(seed: int, k: int, classes: int) -> tuple[float, float, np.ndarray]:
    """A class's stripe angle, frequency and colour: what a model could learn to tell apart."""
    rng = np.random.default_rng([seed, k, 0])
    angle = np.pi * k / classes + rng.uniform(0, np.pi / (2 * classes))
    freq = rng.uniform(2.0, 9.0)
    return angle, freq, rng.uniform(0, 255, size=3).astype(np.float32)


def make_image(seed: int, k: int, i: int, size: int,
               style: tuple[float, float, np.ndarray]) -> Image.Image:
    """One RGB image: a seeded smooth colour field, the class's stripes, and per-pixel noise."""
    # Distinct spawn key from class_style's ([seed, k, 0]) so image 0 is not tied to the style.
    rng = np.random.default_rng([seed, k, 1, i])
    coarse = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
    field = np.asarray(Image.fromarray(coarse).resize((size, size), Image.BICUBIC),
                       dtype=np.float32)
    angle, freq, colour = style
    axis = np.linspace(0.0, 1.0, size, dtype=np.float32)
    yy, xx = np.meshgrid(axis, axis, indexing="ij")
    phase = rng.uniform(0, 2 * np.pi)
    stripes = 0.5 + 0.5 * np.sin(2 * np.pi * freq * (xx * np.cos(angle) + yy * np.sin(angle))
                                 + phase)
    mix = stripes[..., None] * 0.6
    pixels = field * (1 - mix) + colour * mix
    # Noise makes each file's size differ, so a decoder benchmark sees realistic entropy.
    pixels += rng.normal(0, 12, size=pixels.shape).astype(np.float32)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def make_dataset(out: Path, classes: int, images: int, size: int, seed: int = 0,
                 quality: int = 90, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Write the dataset and <out>/manifest.json; returns the manifest."""
    out = Path(out)
    validate(out, classes, images, size, quality)
    out.mkdir(parents=True, exist_ok=True)
    names = class_names(classes)
    counts = per_class_counts(classes, images)
    total_bytes = 0
    written = 0
    step = max(1, images // 10)
    for k, (name, count) in enumerate(zip(names, counts, strict=True)):
        folder = out / name
        folder.mkdir()
        style = class_style(seed, k, classes)
        for i in range(count):
            path = folder / f"{name}_{i:05d}.jpg"
            make_image(seed, k, i, size, style).save(path, format="JPEG", quality=quality)
            total_bytes += path.stat().st_size
            written += 1
            if log and (written % step == 0 or written == images):
                log(f"  {written}/{images} images ({total_bytes:,} bytes)")
    manifest: dict[str, Any] = {
        "tool": "mgbench make-dataset",
        "version": __version__,
        "format": "jpeg",
        "layout": "<class>/<image>.jpg",
        "classes": names,
        "counts": dict(zip(names, counts, strict=True)),
        "images": images,
        "size": size,
        "mode": "RGB",
        "seed": seed,
        "quality": quality,
        "total_bytes": total_bytes,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
