"""The TensorFlow family's real-data pipeline: tf.data over the prepared TFRecord shards with
runners/real_data.py's preprocessing in TF ops; each element one whole (global) batch, not
auto-sharded by file. Imports TensorFlow only (no Keras). docs/runners/tf_family.md."""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from runners.common import Spec, Unavailable  # noqa: E402
from runners.real_data import RealData, open_for_model  # noqa: E402

SHUFFLE_BUFFER = 10_000  # images; ImageNet input pipelines commonly use 10k
# libjpeg's accurate IDCT, as Pillow (the reference) decodes; TF's fast default differs
DCT_METHOD = "INTEGER_ACCURATE"


def open_real(spec: Spec, model_spec: Any) -> RealData:
    """The run's prepared dataset checked against the model; Unavailable for other data."""
    if spec.data != "real":
        raise Unavailable(f"data {spec.data!r} is neither synthetic nor real")
    return open_for_model(spec, model_spec)


def _window(h: tf.Tensor, w: tf.Tensor, size: int, augmentation: str) -> tuple[tf.Tensor,
                                                                              tf.Tensor]:
    """Top-left corner of the S x S crop: uniform for crop-flip, centred for none."""
    if augmentation == "crop-flip":
        top = tf.random.uniform((), 0, h - size + 1, dtype=tf.int32)
        left = tf.random.uniform((), 0, w - size + 1, dtype=tf.int32)
        return top, left
    return (h - size) // 2, (w - size) // 2


def preprocess(encoded: tf.Tensor, size: int, augmentation: str) -> tf.Tensor:
    """Steps 1-5 of runners/real_data.py on one JPEG string: float32 (S, S, 3) in [-1, 1]."""
    shape = tf.image.extract_jpeg_shape(encoded)
    h, w = shape[0], shape[1]

    def crop_while_decoding() -> tf.Tensor:
        top, left = _window(h, w, size, augmentation)
        return tf.image.decode_and_crop_jpeg(encoded, tf.stack([top, left, size, size]),
                                             channels=3, dct_method=DCT_METHOD)

    def resize_then_crop() -> tf.Tensor:
        image = tf.io.decode_jpeg(encoded, channels=3, dct_method=DCT_METHOD)
        # the reference's sizes: max(S, round(side * S / shorter)), round half to even
        scale = size / tf.cast(tf.minimum(h, w), tf.float64)
        nh = tf.maximum(size, tf.cast(tf.round(tf.cast(h, tf.float64) * scale), tf.int32))
        nw = tf.maximum(size, tf.cast(tf.round(tf.cast(w, tf.float64) * scale), tf.int32))
        resized = tf.image.resize(image, tf.stack([nh, nw]), method="bilinear")
        image = tf.cast(tf.clip_by_value(tf.round(resized), 0.0, 255.0), tf.uint8)
        top, left = _window(nh, nw, size, augmentation)
        return image[top:top + size, left:left + size]

    image = tf.cond(tf.minimum(h, w) >= size, crop_while_decoding, resize_then_crop)
    if augmentation == "crop-flip":
        image = tf.image.random_flip_left_right(image)
    image = tf.ensure_shape(image, (size, size, 3))
    return tf.cast(image, tf.float32) / 127.5 - 1.0


FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
}


def parse(record: tf.Tensor, size: int, augmentation: str) -> tuple[tf.Tensor, tf.Tensor]:
    """One serialized tf.train.Example to (image, int32 label)."""
    features = tf.io.parse_single_example(record, FEATURES)
    return (preprocess(features["image/encoded"], size, augmentation),
            tf.cast(features["image/class/label"], tf.int32))


def make_dataset(data: RealData, size: int, batch: int, *, channels_first: bool = False,
                 shuffle: bool = True, seed: int | None = None,
                 dataset_cls: Any = None) -> tf.data.Dataset:
    """Endless whole batches (x float32 NHWC or NCHW, y int32) from the TFRecord shards;
    shuffle=False reads them in files.csv's order; dataset_cls picks a V1 dataset."""
    cls = dataset_cls or tf.data.Dataset
    shards = [str(p) for p in data.tfrecords]
    workers = max(1, data.workers)
    files = cls.from_tensor_slices(shards)
    if shuffle:
        files = files.shuffle(len(shards), seed=seed, reshuffle_each_iteration=True)
        cycle = min(len(shards), workers)
    else:
        cycle = len(shards)
    ds = files.interleave(tf.data.TFRecordDataset, cycle_length=cycle, block_length=1,
                          num_parallel_calls=cycle, deterministic=not shuffle)
    if shuffle:
        ds = ds.shuffle(min(data.images, SHUFFLE_BUFFER), seed=seed,
                        reshuffle_each_iteration=True)
    if data.images >= batch:  # as real_data.batch_at: each epoch's remainder is dropped
        ds = ds.map(lambda r: parse(r, size, data.augmentation), num_parallel_calls=workers,
                    deterministic=not shuffle)
        ds = ds.batch(batch, drop_remainder=True).repeat()
    else:  # fewer images than one batch: batches run across epoch boundaries
        ds = ds.repeat().map(lambda r: parse(r, size, data.augmentation),
                             num_parallel_calls=workers, deterministic=not shuffle)
        ds = ds.batch(batch, drop_remainder=True)
    if channels_first:
        ds = ds.map(lambda x, y: (tf.transpose(x, (0, 3, 1, 2)), y))
    return auto_shard(ds.prefetch(tf.data.AUTOTUNE))


def auto_shard(ds: tf.data.Dataset, policy: Any = tf.data.experimental.AutoShardPolicy.OFF
               ) -> tf.data.Dataset:
    """`ds` with a strategy's auto-shard policy; OFF: each element is one global batch, which
    the strategy splits over its replicas instead of sharding the files."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = policy
    return ds.with_options(options)


def describe_pipeline(data: RealData, batch: int, channels_first: bool = False) -> str:
    """One line saying exactly what the pipeline does."""
    crop = ("decode_and_crop_jpeg of a random S x S window (resize first when the shorter side "
            "is below S), random flip" if data.augmentation == "crop-flip"
            else "decode_and_crop_jpeg of the centre S x S window (resize first when the "
                 "shorter side is below S)")
    return (f"tf.data over {len(data.tfrecords)} TFRecord shard(s): interleaved reads, shuffle "
            f"buffer {min(data.images, SHUFFLE_BUFFER)}, parse_single_example, {crop}, "
            f"/127.5-1 in {max(1, data.workers)} parallel map call(s), batch {batch} "
            f"(whole), repeat, prefetch AUTOTUNE"
            + (", NCHW" if channels_first else ", NHWC"))


def first_labels(ds: Any) -> list[int]:
    """The labels of the first batch of a fresh iterator over ds."""
    return [int(v) for v in np.asarray(next(iter(ds))[1])]
