"""The JAX family's real-data pipeline: Grain over the prepared JPEG file list (shuffled, repeated,
the reference preprocessing, batched, mp_prefetch workers), each global batch device_put into the
runner's sharding one batch ahead. Imports neither grain nor jax at module level (after
setup_devices); worker processes unpickle `Decode` from here."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from runners.real_data import RealData, preprocess

if TYPE_CHECKING:
    import grain
    import jax

SEED = 0
INPUT_PIPELINE = ("Grain over the JPEG file list: shuffle, repeat, random_map(Pillow decode, "
                  "crop/flip, scale), batch({batch}, drop_remainder) {where}; {placement}")
WORKERS = "in {workers} worker process(es) (mp_prefetch)"
MAIN = "in the main process (workers 0: no mp_prefetch)"


@dataclass(frozen=True)
class Decode:
    """Grain random_map transform: a file index to (image float32 HWC, label int32) through
    the reference preprocessing (picklable, so spawned workers can run it)."""

    files: tuple[tuple[str, int], ...]
    size: int
    augmentation: str

    def __call__(self, index: int, rng: np.random.Generator) -> tuple[np.ndarray, np.int32]:
        path, label = self.files[int(index)]
        return preprocess(path, self.size, self.augmentation, rng), np.int32(label)


def shuffled_indices(n: int, seed: int = SEED) -> grain.MapDataset:
    """The endless shuffled stream of file indices (a new order every epoch)."""
    import grain

    return grain.MapDataset.range(n).seed(seed).shuffle().repeat()


def grain_batches(files: list[tuple[str, int]], size: int, augmentation: str, batch: int,
                  seed: int = SEED) -> grain.MapDataset:
    """Batches of (images NHWC float32, labels int32), random access (no workers yet)."""
    return (shuffled_indices(len(files), seed)
            .random_map(Decode(tuple(files), size, augmentation))
            .batch(batch, drop_remainder=True))


def batch_file_indices(n: int, batch: int, i: int, seed: int = SEED) -> list[int]:
    """The file indices of batch i of grain_batches (tests check labels with it)."""
    return [int(k) for k in shuffled_indices(n, seed).batch(batch, drop_remainder=True)[i]]


def host_batches(data: RealData, size: int, batch: int, seed: int = SEED) -> grain.IterDataset:
    """The pipeline up to host memory: numpy batches, `data.workers` decode processes."""
    import grain
    from absl import flags

    if not flags.FLAGS.is_parsed():
        # grain 0.2.18 reads an absl flag (docs/runners/jax_native.md): keep the defaults
        flags.FLAGS.mark_as_parsed()
    ds = grain_batches(data.files, size, data.augmentation, batch, seed)
    # No read threads: each process (the main one for workers 0) decodes one batch at a time,
    # so `workers` is the whole decode parallelism, as in the other families' loaders.
    it = ds.to_iter_dataset(grain.ReadOptions(num_threads=0, prefetch_buffer_size=0))
    if data.workers > 0:
        it = it.mp_prefetch(grain.MultiprocessingOptions(num_workers=data.workers,
                                                         per_worker_buffer_size=2))
    return it


def device_batches(data: RealData, size: int, batch: int, sharding: jax.sharding.Sharding,
                   label_sharding: jax.sharding.Sharding | None = None, seed: int = SEED
                   ) -> tuple[DeviceBatches, str]:
    """(iterator of global batches, images in `sharding` and labels in `label_sharding`
    (default the same), the input_pipeline line). Close the iterator when done."""
    import grain
    import jax

    from runners.jax.common import sharding_record

    ds = host_batches(data, size, batch, seed)
    shardings = (sharding, label_sharding or sharding)
    if data.workers > 0:
        ds = grain.experimental.device_put(ds, shardings, cpu_buffer_size=1,
                                           device_buffer_size=1)
        when = ", one batch ahead"
    else:
        ds = ds.map(lambda b: jax.device_put(b, shardings))
        when = " in the loop"
    placement = f"jax.device_put of each global batch into {sharding_record(sharding)}{when}"
    where = WORKERS.format(workers=data.workers) if data.workers > 0 else MAIN
    line = INPUT_PIPELINE.format(batch=batch, where=where, placement=placement)
    return DeviceBatches(iter(ds)), line


def host_iterator(data: RealData, size: int, batch: int, placement: str, seed: int = SEED
                  ) -> tuple[DeviceBatches, str]:
    """(iterator of numpy global batches (images, labels) in host memory, the input_pipeline
    line ending with `placement`: what the consumer does with them). Close it when done."""
    where = WORKERS.format(workers=data.workers) if data.workers > 0 else MAIN
    line = INPUT_PIPELINE.format(batch=batch, where=where, placement=placement)
    return DeviceBatches(iter(host_batches(data, size, batch, seed))), line


class DeviceBatches:
    """The iterator device_batches (and host_iterator) returns: it owns Grain's iterator, its
    worker processes and the shared-memory batches in flight until close()."""

    def __init__(self, iterator: Iterator[tuple[jax.Array, jax.Array]]) -> None:
        self._iterator: Any = iterator

    def __iter__(self) -> DeviceBatches:
        return self

    def __next__(self) -> tuple[jax.Array, jax.Array]:
        return next(self._iterator)

    def close(self) -> None:
        """Stop the workers and prefetch threads and free the buffered batches."""
        if self._iterator is not None:
            self._iterator.close()
            self._iterator = None
            # Batches still buffered live in shared memory freed by their finalisers; the
            # runners end with os._exit, so collect now (else the resource tracker warns).
            gc.collect()


def grain_version() -> dict[str, str]:
    """{"grain": version} for a result's framework versions."""
    from importlib.metadata import version

    return {"grain": version("grain")}


def grain_fields(framework: dict[str, str], labels: jax.Array) -> dict[str, Any]:
    """A run fed by this pipeline: Grain's version added to `framework`, and the record's
    first_timed_labels (the first timed batch's labels as the model got them, on the host)."""
    framework.update(grain_version())
    return {"first_timed_labels": [int(v) for v in np.asarray(labels)]}
