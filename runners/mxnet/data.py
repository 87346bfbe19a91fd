"""MXNet's real-data pipeline, shared by mxnet_native, keras_mxnet and pipeline mode: the C++
mx.io.ImageRecordIter over the prepared train.rec, as MXNet's own ImageNet scripts feed it.

The iterator implements runners.real_data's preprocessing with its own ops: OpenCV decodes the
JPEG (BGR, handed out as RGB) in `preprocess_threads` threads (the run's loader workers, at
least 1); `resize` brings the shorter side to S only when some image is smaller than S (the
manifest's resize option says so, or the image headers when prepare-data kept the sizes);
`rand_crop`/`rand_mirror` give crop-flip, a centre crop otherwise; (pixel - 127.5) / 127.5
gives [-1, 1]. It reshuffles every epoch (shuffle through the index file); round_batch wraps the
last batch of an epoch into the next, so every batch is whole; the stream below resets the
iterator at each epoch's end, forever. Batches are NCHW float32 (MXNet's layout), labels
float32 holding the integer class (what MXNet's losses take).

Imports MXNet: only MXNet-family children import this module.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mxnet as mx
import numpy as np

from runners.common import Invalid, Unavailable
from runners.real_data import RealData, cores

# MXNet's defaults, named for the record: the producer thread runs up to READ_AHEAD batches
# ahead (kMaxPrefetchBuffer in iter_image_recordio_2.cc); PREFETCH batches already handed out
# are held before their buffers are reused, so the engine can still be reading them.
READ_AHEAD, PREFETCH = 16, 4
_SIDES: dict[Path, tuple[int, int]] = {}  # the header scan, once per dataset


def shorter_sides(data: RealData) -> tuple[int, int]:
    """The smallest and largest shorter side of the dataset's images.

    From the manifest when prepare-data resized every shorter side to one value, else from the
    JPEG headers (Pillow reads only the header)."""
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
    """ImageRecordIter's `resize` for input size S (-1: none) and what it does, in words.

    MXNet's resize scales every image's shorter side to S, larger ones down as well; the
    reference only scales smaller ones up. With a mix of both, the larger images are scaled
    down too, and the description says so."""
    low, high = shorter_sides(data)
    if low >= size:
        return -1, "no resize (every shorter side >= S)"
    if high <= size:
        return size, f"shorter side resized up to {size} (bilinear)"
    return size, (f"shorter side resized to {size} (bilinear), images larger than {size} "
                  "scaled down too (MXNet's resize has no up-only mode)")


def record_iter(data: RealData, size: int, batch: int, device: str = "cpu",
                shuffle: bool = True, seed: int = 0, part_index: int = 0,
                num_parts: int = 1) -> mx.io.ImageRecordIter:
    """The ImageRecordIter over train.rec giving `batch` images of S x S per batch.

    part_index of num_parts reads a disjoint share (one process per device; the runners here
    are single-process and read it all)."""
    share = len(data.files[part_index::num_parts])
    if share < batch:
        # ImageRecordIter wraps a short epoch only once: it aborts the process (a C++ CHECK)
        # when one batch needs more images than the whole share holds
        raise Unavailable(f"dataset share of {share} images is smaller than the batch of "
                          f"{batch}; ImageRecordIter cannot fill a batch")
    rec, idx = data.recordio
    resize, _ = resize_for(data, size)
    flip = data.augmentation == "crop-flip"
    # ctx "gpu" picks MXNet's prefetching ImageRecordIter2 (a producer thread keeps batches
    # ready while the model trains); ctx "cpu" would pick ImageRecordIter2CPU, which decodes
    # inside next() with no prefetch. device_id -1 fills plain host memory (CPU runs), a GPU
    # id fills pinned memory for the copies to the GPUs. seed_aug is not set: MXNet reseeds
    # with it by position in the batch, which repeats the same crops and flips every batch.
    return mx.io.ImageRecordIter(
        path_imgrec=str(rec), path_imgidx=str(idx), data_shape=(3, size, size),
        batch_size=batch, label_width=1, shuffle=shuffle, seed=seed, round_batch=True,
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
    """Each batch as host numpy: x float32 NCHW, y int32 (copies, so the iterator may reuse
    its buffers)."""
    for batch in batches:
        yield batch.data[0].asnumpy(), batch.label[0].asnumpy().astype(np.int32)


def nd_batches(batches: Iterator[mx.io.DataBatch]) -> Iterator[tuple[Any, Any]]:
    """Each batch as the iterator's NDArrays (x NCHW float32, y float32 class ids), no copy."""
    for batch in batches:
        yield batch.data[0], batch.label[0]


def decode_threads(data: RealData) -> tuple[int, str]:
    """The decode threads MXNet runs, and how they came from the run's workers: at least 1,
    and at most the cores this process may use (MXNet caps preprocess_threads there)."""
    asked = max(1, data.workers)
    threads = min(asked, cores())
    note = (f" (workers {data.workers} capped at the {cores()} cores, as MXNet does)"
            if threads < asked else "")
    return threads, note


def describe_pipeline(data: RealData, size: int, device: str = "cpu") -> str:
    """One line saying what the ImageRecordIter does."""
    aug = ("random crop + random mirror" if data.augmentation == "crop-flip"
           else "centre crop")
    threads, note = decode_threads(data)
    return (f"mx.io.ImageRecordIter over train.rec: OpenCV decode in "
            f"{threads} preprocess thread(s){note}, {resize_for(data, size)[1]}, "
            f"{aug} to {size}x{size}, (x-127.5)/127.5, NCHW float32, shuffled per epoch, "
            f"round_batch; a producer thread runs up to {READ_AHEAD} batches ahead"
            + (" in pinned host memory" if device == "gpu" else ""))
