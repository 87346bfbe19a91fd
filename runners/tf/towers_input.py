"""What the Keras 2 tower runners' fit trains on, by the `input` option: arrays or feed_dict
batches, StagingAreas one step ahead, or a tf.data dataset (docs/runners/keras2_towers.md)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import tensorflow as tf

from models import ModelSpec
from runners.common import Invalid, Spec
from runners.real_data import describe
from runners.tf import data as tf_data
from runners.tf.towers import K, tfv1


def synthetic_arrays(model_spec: ModelSpec, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """One random global batch (images NHWC float32, int32 labels), the same in every run."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((batch, *model_spec.input_shape), dtype=np.float32)
    y = rng.integers(0, model_spec.num_classes, batch).astype(np.int32)
    return x, y


@dataclass
class Source:
    """What fit trains on: fit's data arguments for `steps` steps, the first batch."""

    fit_args: Callable[[int, bool], dict[str, Any]]  # (steps, staged) -> fit kwargs
    first: Callable[[], tuple[np.ndarray, np.ndarray]] | None
    info: dict[str, Any]


def arrays_source(x: np.ndarray, y: np.ndarray) -> Source:
    """Numpy arrays of one global batch: fit(x, y, batch_size=B) runs one step per epoch,
    slicing and feeding the arrays each step as Keras 2's array loop does."""
    def fit_args(steps: int, staged: bool) -> dict[str, Any]:
        data = {"x": [x, y], "y": None} if staged else {"x": x, "y": y}
        return {**data, "batch_size": len(x), "epochs": steps, "shuffle": False}
    return Source(fit_args, lambda: (x, y), {})


def batches_source(make: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]],
                   info: dict[str, Any]) -> Source:
    """A generator of numpy batches for fit (Keras 2's fit_generator path: feed_dict), read in
    fit's own thread (workers 0)."""
    def fit_args(steps: int, staged: bool) -> dict[str, Any]:
        it = make()
        gen = (([bx, by],) for bx, by in it) if staged else it
        return {"x": gen, "steps_per_epoch": steps, "epochs": 1, "workers": 0}
    return Source(fit_args, lambda: next(make()), info)


def dataset_source(make: Callable[[], Any], info: dict[str, Any]) -> Source:
    """A tf.data dataset given to fit (its iterator's get_next feeds the model in the graph)."""
    def fit_args(steps: int, staged: bool) -> dict[str, Any]:
        return {"x": make(), "steps_per_epoch": steps, "epochs": 1}
    return Source(fit_args, None, info)


def make_source(spec: Spec, model_spec: ModelSpec, input_mode: str, steps: int) -> Source:
    """The run's data in the form its input option hands it to fit."""
    batch = spec.global_batch_size
    if spec.data == "synthetic":
        x, y = synthetic_arrays(model_spec, batch)
        if input_mode != "tf_data":
            return arrays_source(x, y)
        return dataset_source(lambda: tf.data.Dataset.from_tensors((x, y)).repeat(), {})
    data = tf_data.open_real(spec, model_spec)
    size = model_spec.input_shape[0]
    loader = spec.options["loader"]
    base = {**describe(data, size), "loader": loader}
    if input_mode == "tf_data":
        if loader != "framework":
            raise Invalid("input tf_data reads the TFRecord shards (loader: framework)")
        first = tfv1.data.make_one_shot_iterator(tf_data.make_dataset(data, size, batch))
        return dataset_source(lambda: tf_data.make_dataset(data, size, batch), {
            **base, "input_pipeline": tf_data.describe_pipeline(data, batch)
            + ", passed to fit (iterator get_next in the graph)",
            "labels_first_batch": [int(v) for v in K.get_session().run(first.get_next())[1]]})
    if loader == "keras":
        return _keras_source(data, size, batch, steps, base)

    def numpy_batches() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        # tf.data's batches pulled to numpy by session.run, then fed by fit's feed_dict
        nxt = tfv1.data.make_one_shot_iterator(tf_data.make_dataset(data, size, batch)
                                               ).get_next()
        sess = K.get_session()
        while True:
            bx, by = sess.run(nxt)
            yield bx, by

    first = next(numpy_batches())
    return batches_source(numpy_batches, {
        **base, "input_pipeline": tf_data.describe_pipeline(data, batch)
        + ", pulled to numpy by session.run and fed to fit by feed_dict",
        "labels_first_batch": [int(v) for v in first[1]]})


def _keras_source(data: Any, size: int, batch: int, steps: int, base: dict[str, Any]
                  ) -> Source:
    """The Keras Sequence over the JPEG files (runners/keras_data.py): given to fit as it is,
    or cycled as numpy batches for the staged model's two inputs."""
    from runners.keras_data import describe_keras, fit_worker_kwargs, jpeg_sequence

    seq = jpeg_sequence(data, size, batch, steps)
    return Source(lambda n, staged: ({"x": seq, "steps_per_epoch": n, "epochs": 1,
                                      **fit_worker_kwargs(data)} if not staged else
                                     {"x": (([bx, by],) for bx, by in _cycle(seq)),
                                      "steps_per_epoch": n, "epochs": 1}),
                  lambda: seq[0],
                  {**base, "input_pipeline": describe_keras(data),
                   "labels_first_batch": [int(v) for v in seq[0][1]]})


def _cycle(seq: Any) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """seq's batches in order, endlessly, each loaded again (seq[i] at every turn)."""
    return (seq[i % len(seq)] for i in itertools.count())
