"""The Keras-idiomatic real-data path: a Sequence (Keras 2) / PyDataset (Keras 3) that reads
the prepared JPEG file list with Pillow (runners.real_data's preprocessing), as a Keras user
writes it, fed to fit with workers (seed 000's "Keras' generator"). Imports whichever `keras`
the runner's environment has: only runner children import it.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from runners.real_data import RealData, batch_at, load_batch

KERAS3 = int(keras.__version__.split(".")[0]) >= 3
_Base: Any = keras.utils.PyDataset if KERAS3 else keras.utils.Sequence


class JpegSequence(_Base):
    """Batch i of the shuffled, repeating stream, computed on demand (workers may run any i).

    `steps` is the length fit sees; the stream itself never runs out."""

    def __init__(self, files: list[tuple[str, int]], size: int, augmentation: str, batch: int,
                 steps: int, channels_first: bool = False, workers: int = 0,
                 seed: int = 0) -> None:
        if KERAS3:  # Keras 3 takes the worker settings here; Keras 2 takes them in fit
            super().__init__(workers=max(1, workers), use_multiprocessing=workers > 0,
                             max_queue_size=max(10, 2 * workers))
        self.files, self.size, self.augmentation = files, size, augmentation
        self.batch, self.steps, self.channels_first, self.seed = batch, steps, channels_first, seed

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([self.seed, i])  # the same batch whichever worker runs it
        idx = batch_at(len(self.files), self.batch, i, self.seed)
        return load_batch(self.files, idx, self.size, self.augmentation, rng,
                          self.channels_first)


def jpeg_sequence(data: RealData, size: int, batch: int, steps: int,
                  channels_first: bool = False) -> JpegSequence:
    """The Sequence over the whole dataset with the run's loader workers."""
    return JpegSequence(data.files, size, data.augmentation, batch, steps, channels_first,
                        data.workers)


def fit_worker_kwargs(data: RealData) -> dict[str, Any]:
    """The worker arguments Keras 2's fit/fit_generator take (Keras 3 reads them from the
    PyDataset instead)."""
    if KERAS3:
        return {}
    # workers=0: the main thread (no enqueuer), as Keras 3 with workers=1
    return {"workers": data.workers, "use_multiprocessing": data.workers > 0,
            "max_queue_size": max(10, 2 * data.workers)}


def describe_keras(data: RealData) -> str:
    return (f"Keras {'PyDataset' if KERAS3 else 'Sequence'} over the JPEG file list: Pillow "
            f"decode and numpy crop/flip in {data.workers} worker process(es), batches queued "
            "for fit")
