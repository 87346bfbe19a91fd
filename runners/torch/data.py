"""The PyTorch runners' input: each rank's synthetic slice made on its device once, or its share of
the prepared JPEGs through a DataLoader (DistributedSampler, workers, pinned memory) or DALI on
GPUs (written from DALI's documentation, untested here); records name the loader (`loader`)."""

from __future__ import annotations

import gc
import itertools
import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from models import ModelSpec
from runners.common import Spec, Unavailable, rows_per_device
from runners.real_data import TOKENS_REAL, RealData, describe, open_for_model, preprocess

LOADERS = ("auto", "dataloader", "dali")  # runner option `data_loader` (auto: DALI on GPUs
# when installed, else the DataLoader)
PREFETCH_FACTOR = 2  # the DataLoader's default: batches each worker keeps ready

Batch = tuple[torch.Tensor, torch.Tensor, "torch.Tensor | None"]


class JpegDataset(Dataset):
    """Image i of the file list through the reference preprocessing, as a float32 tensor.

    Keys are (epoch, index) pairs (EpochSampler's), so the random crop and flip are drawn from
    a generator seeded by the image and the epoch: the same in every run, whichever worker
    decodes it."""

    def __init__(self, files: list[tuple[str, int]], size: int, augmentation: str,
                 channels_first: bool = True, seed: int = 0) -> None:
        self.files, self.size, self.augmentation = files, size, augmentation
        self.channels_first, self.seed = channels_first, seed

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, key: tuple[int, int]) -> tuple[torch.Tensor, int, int]:
        epoch, i = key
        rng = np.random.default_rng([self.seed, epoch, i])
        path, label = self.files[i]
        image = preprocess(path, self.size, self.augmentation, rng)
        if self.channels_first:
            image = image.transpose(2, 0, 1)
        return torch.from_numpy(np.ascontiguousarray(image)), label, i


class EpochSampler(DistributedSampler):
    """torch's DistributedSampler (a rank's disjoint share of a shuffled epoch) yielding
    (epoch, index) keys for JpegDataset."""

    def __iter__(self) -> Iterator[tuple[int, int]]:  # type: ignore[override]
        epoch = self.epoch
        return ((epoch, int(i)) for i in super().__iter__())


@dataclass(frozen=True)
class Place:
    """Where a rank's input goes: rank `rank` of `world`, on `device`."""

    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")


@dataclass(frozen=True)
class LoaderConfig:
    """How a rank's batches reach its model: NCHW or NHWC, the memory format, the start method
    of the DataLoader's workers (None: the platform's), pinned host memory."""

    channels_first: bool = True
    memory_format: torch.memory_format = torch.contiguous_format
    context: str | None = None
    pin_memory: bool = False


def make_dataloader(data: RealData, size: int, batch: int, rank: int, world: int,
                    config: LoaderConfig = LoaderConfig(), seed: int = 0) -> DataLoader:
    """The DataLoader of one rank: its DistributedSampler share, `data.workers` processes."""
    dataset = JpegDataset(data.files, size, data.augmentation, config.channels_first, seed)
    sampler = EpochSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=seed,
                           drop_last=True)
    workers = max(0, data.workers)
    loader = DataLoader(dataset, batch_size=batch, sampler=sampler, num_workers=workers,
                        pin_memory=config.pin_memory, drop_last=True,
                        persistent_workers=workers > 0,
                        prefetch_factor=PREFETCH_FACTOR if workers else None,
                        multiprocessing_context=config.context if workers else None)
    if len(loader) == 0:
        raise Unavailable(f"dataset has {data.images} images: each of the {world} ranks' "
                          f"share ({len(sampler)} per epoch) is smaller than its batch of "
                          f"{batch}")
    return loader


def epochs(loader: DataLoader) -> Iterator[Batch]:
    """The loader's batches forever: set_epoch(e), then pass e (persistent workers stay).

    The first pass starts now, so the worker processes start (and begin decoding) at once."""
    loader.sampler.set_epoch(0)  # type: ignore[attr-defined]
    first = iter(loader)

    def passes() -> Iterator[Batch]:
        yield from first
        for epoch in itertools.count(1):
            loader.sampler.set_epoch(epoch)  # type: ignore[attr-defined]
            yield from loader

    return passes()


class SyntheticInput:
    """One rank's synthetic slice, made on its device once and fed at every step."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x, self.y

    def close(self) -> None:
        pass

    def record(self) -> dict[str, Any]:
        return {"data_placement": "one synthetic slice per rank, generated on its device once"}


class RealInput:
    """One rank's real-data batches on its device, and what the record says about them.

    `next()` returns (images, labels) on the device (copied asynchronously from pinned memory);
    the first batch's files and labels (as they reach the model) are kept for the record."""

    def __init__(self, kind: str, description: str, batches: Iterator[Batch],
                 device: torch.device, memory_format: torch.memory_format, data: RealData,
                 size: int, share: int) -> None:
        self.kind, self.description, self.share = kind, description, share
        self._batches, self._device, self._memory_format = batches, device, memory_format
        self._data, self._size = data, size
        self.first_batch: dict[str, Any] | None = None

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        x, y, index = next(self._batches)
        x = x.to(self._device, non_blocking=x.is_pinned()).contiguous(
            memory_format=self._memory_format)
        y = y.to(self._device, non_blocking=y.is_pinned()).long()
        if self.first_batch is None:
            self.first_batch = {
                "labels": [int(v) for v in y.tolist()],
                "files": None if index is None else [
                    os.path.relpath(self._data.files[int(i)][0], self._data.path)
                    for i in index],
            }
        return x, y

    def close(self) -> None:
        """Stop the loader's workers now: runners end with os._exit, which skips the
        DataLoader's own shutdown (its worker processes, queues and semaphores)."""
        self._batches.close()  # type: ignore[attr-defined]
        self._batches = iter(())
        gc.collect()

    def record(self) -> dict[str, Any]:
        """The fields a real-data run adds to its result."""
        return {**describe(self._data, self._size), "loader": self.kind,
                "input_pipeline": self.description, "rank_images_per_epoch": self.share,
                "first_batch": self.first_batch,
                "data_placement": "each rank loads its B/N images every step, in the timed "
                                  "window"}


def dataloader_description(data: RealData, config: LoaderConfig) -> str:
    layout = "NCHW" if config.channels_first else "NHWC"
    if config.memory_format == torch.channels_last:
        layout += " (channels_last memory format)"
    workers = (f"{data.workers} worker process(es), {PREFETCH_FACTOR} batches prefetched "
               "each" if data.workers else "the main process (workers 0)")
    return (f"torch DataLoader over the JPEG file list: DistributedSampler share per rank, "
            f"Pillow decode + numpy {data.augmentation} in {workers}, float32 {layout} "
            "batches, " + ("pinned memory, non_blocking copy to the GPU" if config.pin_memory
                           else "host memory (CPU device)"))


def dali_importable() -> bool:
    try:
        import nvidia.dali  # noqa: F401
    except (ImportError, OSError):  # absent, or present without its CUDA libraries
        return False
    return True


def choose_loader(spec: Spec, device: torch.device) -> str:
    """dataloader or dali, from the runner option `data_loader` (auto when not given)."""
    wanted = spec.options.get("data_loader", "auto")
    if wanted not in LOADERS:
        raise Unavailable(f"data_loader {wanted!r} is not one of {', '.join(LOADERS)}")
    if wanted == "dali":
        if device.type != "cuda":
            raise Unavailable("data_loader dali: DALI's decoder runs on GPUs; this run is on "
                              "CPUs (use the DataLoader)")
        if not dali_importable():
            raise Unavailable("data_loader dali: nvidia.dali is not installed in this "
                              "environment")
    if wanted == "auto":
        return "dali" if device.type == "cuda" and dali_importable() else "dataloader"
    return wanted


def open_input(spec: Spec, data: RealData, size: int, batch: int, place: Place,
               config: LoaderConfig = LoaderConfig()) -> RealInput:
    """One rank's input: the DataLoader (or DALI on GPUs), started before the model is built
    so its worker processes fork from a small process."""
    if choose_loader(spec, place.device) == "dali":
        return dali_input(data, size, batch, place, config)
    config = replace(config, pin_memory=place.device.type == "cuda")
    loader = make_dataloader(data, size, batch, place.rank, place.world, config)
    return RealInput("dataloader", dataloader_description(data, config), epochs(loader),
                     place.device, config.memory_format, data, size,
                     len(loader.sampler))  # type: ignore[arg-type]


def dali_input(data: RealData, size: int, batch: int, place: Place, config: LoaderConfig
               ) -> RealInput:
    """DALI on this rank's GPU (untested here: written from DALI's documentation)."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali import math as dmath
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    rank, world, channels_first = place.rank, place.world, config.channels_first
    fd, list_file = tempfile.mkstemp(prefix="mgbench-dali-", suffix=".txt")
    with os.fdopen(fd, "w") as fh:  # fn.readers.file's file_list: "<path> <label>" lines
        fh.writelines(f"{os.path.relpath(p, data.path)} {label}\n" for p, label in data.files)
    crop_flip = data.augmentation == "crop-flip"

    @pipeline_def(batch_size=batch, num_threads=max(1, data.workers), device_id=place.device.index,
                  seed=1234 + rank)
    def pipeline() -> Any:
        jpegs, labels = fn.readers.file(file_root=str(data.path), file_list=list_file,
                                        shard_id=rank, num_shards=world, random_shuffle=True,
                                        name="Reader")
        shape = fn.peek_image_shape(jpegs, dtype=types.FLOAT)  # H, W, C, before decoding
        shorter = dmath.max(dmath.min(shape[0], shape[1]), float(size))  # only ever enlarge
        images = fn.decoders.image(jpegs, device="mixed", output_type=types.RGB)
        images = fn.resize(images, resize_shorter=shorter)
        images = fn.crop_mirror_normalize(
            images, crop=(size, size), dtype=types.FLOAT,
            crop_pos_x=fn.random.uniform(range=(0.0, 1.0)) if crop_flip else 0.5,
            crop_pos_y=fn.random.uniform(range=(0.0, 1.0)) if crop_flip else 0.5,
            mirror=fn.random.coin_flip(probability=0.5) if crop_flip else 0,
            mean=[127.5] * 3, std=[127.5] * 3, output_layout="CHW" if channels_first else "HWC")
        return images, labels.gpu()

    pipe = pipeline()
    pipe.build()
    iterator = DALIGenericIterator(pipe, ["x", "y"], reader_name="Reader", auto_reset=True,
                                   last_batch_policy=LastBatchPolicy.DROP)

    def batches() -> Iterator[Batch]:
        while True:
            for out in iterator:
                yield out[0]["x"], out[0]["y"].reshape(-1), None

    layout = "NCHW" if channels_first else "NHWC"
    description = (f"NVIDIA DALI on the GPU: fn.readers.file over the JPEG file list (shard "
                   f"{rank} of {world}), nvJPEG decode (mixed), shorter side up to {size}, "
                   f"crop_mirror_normalize ({data.augmentation}), float32 {layout}, "
                   f"{max(1, data.workers)} CPU threads")
    return RealInput("dali", description, batches(), place.device, config.memory_format, data,
                     size, len(data.files) // world)


def synthetic_slice(place: Place, shape: tuple[int, ...], classes: int, batch: int,
                    memory_format: torch.memory_format = torch.contiguous_format
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's random (images, labels) slice, generated on its device once, seeded by rank."""
    gen = torch.Generator(device=place.device).manual_seed(1234 + place.rank)
    x = torch.randn((batch, *shape), generator=gen, device=place.device)
    y = torch.randint(0, classes, (batch,), generator=gen, device=place.device)
    return x.contiguous(memory_format=memory_format), y


def synthetic_tokens(place: Place, seq_len: int, vocab: int, batch: int,
                     dtype: torch.dtype = torch.int64) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's random token slice, made on its device once, seeded by rank: ids in [0,
    vocab) of shape (batch, seq_len + 1), as (inputs ids[:, :-1], targets ids[:, 1:])."""
    gen = torch.Generator(device=place.device).manual_seed(1234 + place.rank)
    ids = torch.randint(0, vocab, (batch, seq_len + 1), generator=gen, device=place.device)
    ids = ids.to(dtype)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def rank_input(spec: Spec, place: Place, model_spec: ModelSpec, shape: tuple[int, ...],
               config: LoaderConfig = LoaderConfig(), token_dtype: torch.dtype = torch.int64
               ) -> SyntheticInput | RealInput:
    """This rank's B/N samples per step: an image model's (of `shape`) synthetic slice, or on
    real data its share through open_input; a token model's synthetic ids of `token_dtype`
    (real data is Unavailable)."""
    batch = spec.split_batch(place.world, "ranks")
    if model_spec.input_kind == "tokens":
        if spec.data == "real":
            raise Unavailable(TOKENS_REAL)
        return SyntheticInput(*synthetic_tokens(place, model_spec.input_shape[0],
                                                model_spec.num_classes, batch, token_dtype))
    if spec.data != "real":
        return SyntheticInput(*synthetic_slice(place, shape, model_spec.num_classes, batch,
                                               config.memory_format))
    data = open_for_model(spec, model_spec)
    return open_input(spec, data, model_spec.input_shape[0], batch, place, config)


def equivalence_input(x: np.ndarray, y: np.ndarray, place: Place,
                      config: LoaderConfig = LoaderConfig()) -> SyntheticInput:
    """This rank's slice of the equivalence batch (given NHWC) as the benchmark's synthetic
    input: resident on the rank's device, in the run's layout and memory format."""
    per = rows_per_device(len(x), place.world, "ranks", "equivalence batch")
    part = slice(place.rank * per, (place.rank + 1) * per)
    images = x[part].transpose(0, 3, 1, 2) if config.channels_first else x[part]
    xs = torch.from_numpy(np.ascontiguousarray(images)).to(place.device)
    ys = torch.from_numpy(y[part].astype(np.int64)).to(place.device)
    return SyntheticInput(xs.contiguous(memory_format=config.memory_format), ys)
