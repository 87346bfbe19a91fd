"""MXNet's real-data pipeline (mxnet_native, keras_mxnet, pipeline mode): mx.io.ImageRecordIter
over the prepared train.rec, runners.real_data's preprocessing with MXNet's own ops; NCHW
float32 batches, float32 labels. Differs: MXNet's resize also scales larger images down when
sizes are mixed (said in the record). docs/runners/mxnet_native.md, "Notes from the code"."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import mxnet as mx
import numpy as np

from runners.common import Invalid, Unavailable
from runners.real_data import RealData, cores

# MXNet's defaults, named for the record: batches the producer runs ahead (kMaxPrefetchBuffer),
# and batches handed out that are held before their buffers are reused
READ_AHEAD, PREFETCH = 16, 4
_SIDES: dict[Path, tuple[int, int]] = {}  # the header scan, once per dataset


def shorter_sides(data: RealData) -> tuple[int, int]:
    """The smallest and largest shorter side of the images (manifest, else JPEG headers)."""
    resize = int(data.manifest.get("options", {}).get("resize", 0))
    if resize > 0:
        return resize, resize
    if data.path not in _SIDES:
        from PIL import Image

        sides = []
        for path, _ in data.files:
            with Image.open(path) as img:
                sides.append(min(img.size))
        _SIDES[data.path] = min(sides), max(sides)
    return _SIDES[data.path]


def resize_for(data: RealData, size: int) -> tuple[int, str]:
    """ImageRecordIter's `resize` for input size S (-1: none) and what it does, in words (MXNet
    scales larger shorter sides down too, where the reference only scales smaller ones up)."""
    low, high = shorter_sides(data)
    if low >= size:
        return -1, "no resize (every shorter side >= S)"
    if high <= size:
        return size, f"shorter side resized up to {size} (bilinear)"
    return size, (f"shorter side resized to {size} (bilinear), images larger than {size} "
                  "scaled down too (MXNet's resize has no up-only mode)")


def record_iter(data: RealData, size: int, batch: int, device: str = "cpu", shuffle: bool = True,
                part_index: int = 0, num_parts: int = 1) -> mx.io.ImageRecordIter:
    """The ImageRecordIter over train.rec giving `batch` images of S x S per batch; part_index
    of num_parts reads a disjoint share (a multi-node worker's)."""
    share = len(data.files[part_index::num_parts])
    if share < batch:
        # ImageRecordIter aborts the process (a C++ CHECK) when a batch outgrows the share
        raise Unavailable(f"dataset share of {share} images is smaller than the batch of "
                          f"{batch}; ImageRecordIter cannot fill a batch")
    rec, idx = data.recordio
    resize, _ = resize_for(data, size)
    flip = data.augmentation == "crop-flip"
    # ctx "gpu": ImageRecordIter2 (pinned for a GPU id); seed_aug unset (repeats the crops)
    return mx.io.ImageRecordIter(
        path_imgrec=str(rec), path_imgidx=str(idx), data_shape=(3, size, size),
        batch_size=batch, label_width=1, shuffle=shuffle, seed=0, round_batch=True,
        resize=resize, inter_method=1, rand_crop=flip, rand_mirror=flip,
        mean_r=127.5, mean_g=127.5, mean_b=127.5, scale=1 / 127.5, dtype="float32",
        preprocess_threads=max(1, data.workers), prefetch_buffer=PREFETCH,
        ctx="gpu", device_id=0 if device == "gpu" else -1,
        part_index=part_index, num_parts=num_parts, verbose=False)


def stream(it: mx.io.DataIter) -> Iterator[mx.io.DataBatch]:
    """The iterator's batches forever: reset at the end of every epoch."""
    while True:
        got = 0
        for batch in it:
            got += 1
            yield batch
        if not got:
            raise Invalid("ImageRecordIter gave an epoch with no batch")
        it.reset()


def numpy_batches(batches: Iterator[mx.io.DataBatch]) -> Iterator[tuple[np.ndarray,
                                                                        np.ndarray]]:
    """Each batch as host numpy copies: x float32 NCHW, y int32."""
    for batch in batches:
        yield batch.data[0].asnumpy(), batch.label[0].asnumpy().astype(np.int32)


def describe_pipeline(data: RealData, size: int, device: str = "cpu") -> str:
    """One line saying what the ImageRecordIter does; its decode threads are the run's workers,
    at least 1, capped at the cores this process may use, as MXNet caps them."""
    aug = ("random crop + random mirror" if data.augmentation == "crop-flip"
           else "centre crop")
    asked = max(1, data.workers)
    threads = min(asked, cores())
    note = (f" (workers {data.workers} capped at the {cores()} cores, as MXNet does)"
            if threads < asked else "")
    return (f"mx.io.ImageRecordIter over train.rec: OpenCV decode in "
            f"{threads} preprocess thread(s){note}, {resize_for(data, size)[1]}, "
            f"{aug} to {size}x{size}, (x-127.5)/127.5, NCHW float32, shuffled per epoch, "
            f"round_batch; a producer thread runs up to {READ_AHEAD} batches ahead"
            + (" in pinned host memory" if device == "gpu" else ""))
