"""Child-side real-data pieces every family shares: the prepared dataset, the reference
preprocessing (decode RGB, shorter side up to S, S x S crop at random or the centre, random
flip for `crop-flip`, pixel / 127.5 - 1), the naive PIL loop, and the timing of a pipeline on
its own. Imports numpy and Pillow only. Details: docs/runners/shared.md."""

from __future__ import annotations

import csv
import functools
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from runners.common import Invalid, Spec, Unavailable, timed_loop

AUGMENTATIONS = ("none", "crop-flip")
TOKENS_REAL = ("data real: the prepared datasets are images; a token model trains on synthetic "
               "tokens")


@dataclass(frozen=True)
class RealData:
    """A folder written by `run_bench.py prepare-data`, as one run sees it."""

    path: Path
    augmentation: str
    workers: int
    files: list[tuple[str, int]]  # absolute JPEG path, label
    classes: int
    manifest: dict[str, Any]

    @property
    def images(self) -> int:
        return len(self.files)

    @property
    def recordio(self) -> tuple[Path, Path]:
        """MXNet's train.rec and its index train.idx."""
        return self.path / "train.rec", self.path / "train.idx"

    @property
    def tfrecords(self) -> list[Path]:
        """The TFRecord shards (tf.train.Example: image/encoded, image/class/label, ...)."""
        return sorted(self.path / name for name in self.manifest["formats"]["tfrecord"]["shards"])


def open_dataset(spec: Spec) -> RealData:
    """The run's dataset; Unavailable when the run is not a real-data run or the folder is
    not usable (the parent checked it when the sweep was read, but a sweep can run later)."""
    if spec.data != "real" or not spec.dataset:
        raise Unavailable(f"data {spec.data!r} has no dataset to read")
    ds = spec.dataset
    path = Path(ds["path"])
    try:
        manifest = json.loads((path / "manifest.json").read_text())
        with (path / "files.csv").open(newline="") as fh:
            files = [(str(path / row[0]), int(row[1])) for row in csv.reader(fh) if row]
    except (OSError, ValueError, IndexError) as exc:
        raise Unavailable(f"dataset {str(path)!r} is not a prepare-data folder: {exc}") from exc
    if not files:
        raise Unavailable(f"dataset {str(path)!r} holds no images")
    if ds["augmentation"] not in AUGMENTATIONS:
        raise Unavailable(f"augmentation {ds['augmentation']!r} is not one of "
                          f"{', '.join(AUGMENTATIONS)}")
    return RealData(path=path, augmentation=ds["augmentation"],
                    workers=int(ds["workers"]), files=files,
                    classes=int(manifest["classes"]), manifest=manifest)


def check_classes(data: RealData, num_classes: int, model: str) -> None:
    """A dataset with more classes than the model has outputs cannot train it."""
    if data.classes > num_classes:
        raise Unavailable(f"dataset has {data.classes} classes, model {model} has "
                          f"{num_classes} outputs")


def open_for_model(spec: Spec, model_spec: Any) -> RealData:
    """open_dataset, checked against the model's outputs (check_classes)."""
    data = open_dataset(spec)
    check_classes(data, model_spec.num_classes, spec.model)
    return data


def pipeline_data(spec: Spec, checked: bool = True) -> tuple[RealData, int, int]:
    """A pipeline run's dataset (`checked` against its model's outputs), image size, batch."""
    from models import get_spec

    model_spec = get_spec(spec.model)
    data = open_for_model(spec, model_spec) if checked else open_dataset(spec)
    return data, model_spec.input_shape[0], spec.global_batch_size


def rank_files(files: list[tuple[str, int]], rank: int, world: int) -> list[tuple[str, int]]:
    """The disjoint share of one rank: files rank, rank + world, ..."""
    share = files[rank::world]
    if not share:
        raise Unavailable(f"dataset has {len(files)} images, fewer than the {world} ranks")
    return share


def load_image(path: str) -> np.ndarray:
    """Step 1: decode a JPEG file to RGB uint8 (H, W, 3) with Pillow."""
    from PIL import Image

    with Image.open(path) as img:
        return np.asarray(img.convert("RGB"))


def resize_shorter(image: np.ndarray, size: int) -> np.ndarray:
    """Step 2: bring the shorter side up to `size` (bilinear) when it is smaller."""
    h, w = image.shape[:2]
    if min(h, w) >= size:
        return image
    from PIL import Image

    scale = size / min(h, w)
    new = (max(size, round(w * scale)), max(size, round(h * scale)))
    return np.asarray(Image.fromarray(image).resize(new, Image.BILINEAR))


def crop_flip(image: np.ndarray, size: int, augmentation: str,
              rng: np.random.Generator) -> np.ndarray:
    """Steps 3 and 4 on an image whose shorter side is at least `size`."""
    h, w = image.shape[:2]
    if augmentation == "crop-flip":
        top, left = int(rng.integers(0, h - size + 1)), int(rng.integers(0, w - size + 1))
    else:
        top, left = (h - size) // 2, (w - size) // 2
    out = image[top:top + size, left:left + size]
    if augmentation == "crop-flip" and rng.random() < 0.5:
        out = out[:, ::-1]
    return out


def normalise(image: np.ndarray) -> np.ndarray:
    """Step 5: uint8 pixels to float32 in [-1, 1]."""
    return image.astype(np.float32) / 127.5 - 1.0


def preprocess(path: str, size: int, augmentation: str,
               rng: np.random.Generator) -> np.ndarray:
    """Steps 1-5 for one file with PIL and numpy: the reference every pipeline matches."""
    return normalise(crop_flip(resize_shorter(load_image(path), size), size, augmentation, rng))


@functools.lru_cache(maxsize=4)
def epoch_order(n: int, epoch: int, seed: int = 0) -> np.ndarray:
    """The shuffled order of epoch `epoch` (the same in every framework's Python loaders)."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def batch_at(n: int, batch: int, i: int, seed: int = 0) -> np.ndarray:
    """The indices of batch i of the endless stream of shuffled epochs (random access, for
    loader workers): each epoch's remainder dropped, or across epochs when n < batch."""
    if n >= batch:
        epoch, j = divmod(i, n // batch)
        return epoch_order(n, epoch, seed)[j * batch:(j + 1) * batch]
    pos = np.arange(i * batch, (i + 1) * batch)
    return np.array([epoch_order(n, int(p // n), seed)[p % n] for p in pos])


def load_batch(files: list[tuple[str, int]], idx: np.ndarray, size: int, augmentation: str,
               rng: np.random.Generator, channels_first: bool = False) -> tuple[np.ndarray,
                                                                              np.ndarray]:
    """One batch (x float32 NHWC or NCHW, y int32) through the reference preprocessing."""
    x = np.stack([preprocess(files[i][0], size, augmentation, rng) for i in idx])
    y = np.array([files[i][1] for i in idx], dtype=np.int32)
    return (x.transpose(0, 3, 1, 2) if channels_first else x), y


def pil_batches(files: list[tuple[str, int]], size: int, augmentation: str, batch: int
                ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """The naive loop: one process decodes and augments every image of every batch in turn
    (NHWC, seed 0)."""
    rng = np.random.default_rng(0)
    for i in itertools.count():  # batch_at(0), batch_at(1), ... forever
        yield load_batch(files, batch_at(len(files), batch, i), size, augmentation, rng)


def cores() -> int:
    """CPU cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def tree_cpu_seconds() -> float | None:
    """CPU seconds (user + system, threads included) used so far by this process, its live
    descendants and the ones they reaped (a pipeline's workers); None without /proc."""
    root = os.getpid()
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return None
    for name in entries:
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:  # gone since the listing
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # the command name may hold spaces
        children.setdefault(int(fields[1]), []).append(int(name))
        # utime, stime, and cutime, cstime of reaped children (fields 14-17 of proc(5))
        ticks[int(name)] = sum(int(f) for f in fields[11:15])
    if root not in ticks:
        return None
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total / os.sysconf("SC_CLK_TCK")


def time_pipeline(spec: Spec, batches: Iterator[Any], batch: int,
                  count: Any = None) -> dict[str, Any]:
    """Pipeline mode: pull warmup_steps batches, then time measure_steps batches. `count(b)`
    gives batch b's images (default len(b[0])), touching the data so a lazy pipeline finishes
    it; every batch must be whole. Images per core are over the process tree's CPU seconds in
    the window (threads and worker processes alike)."""
    count = count or (lambda b: len(b[0]))
    seen, cpu0 = 0, None  # images in the window; the tree's CPU seconds when it opens

    def open_window() -> None:
        nonlocal seen, cpu0
        seen, cpu0 = 0, tree_cpu_seconds()

    def produced(b: Any) -> None:
        """Wait for batch b to be produced (count touches its data); check it is whole."""
        nonlocal seen
        got = int(count(b))
        if got != batch:
            raise Invalid(f"the pipeline gave a batch of {got} images, expected {batch}")
        seen += got

    window = timed_loop(lambda: next(batches), produced, spec.warmup_steps, spec.measure_steps,
                        on_start=open_window)
    cpu1 = tree_cpu_seconds()
    result = window.summary(batch, seen)
    workers = spec.dataset["workers"]
    cpu = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    if cpu:
        per_core, basis = seen / cpu, "CPU seconds of the process tree in the window"
    else:
        per_core = result["images_per_sec"] / max(1, min(workers, cores()))
        basis = "images/sec over min(workers, cores) (no /proc CPU times)"
    result.update({
        "loader_workers": workers,
        "cores": cores(),
        "cpu_seconds": cpu,
        "cores_busy": cpu / result["window_s"] if cpu is not None else None,
        "images_per_sec_per_core": per_core,
        "per_core_basis": basis,
    })
    return result


def describe(data: RealData, size: int) -> dict[str, Any]:
    """What every real-data record says about its data."""
    return {"dataset_images": data.images, "dataset_classes": data.classes,
            "augmentation": data.augmentation, "loader_workers": data.workers,
            "image_size": size}
