"""Grain's batches of the dataset in argv[1] on 2 virtual devices (2 worker processes), for
augmentation none and crop-flip, against the reference batches of the same files, and one batch
through device_batches. A main guard: Grain's spawned workers import this main module."""

import json
import sys

import numpy as np

from contract.spec import spec_for
from runners.jax.common import setup_devices
from runners.real_data import load_batch, open_dataset


def dataset(augmentation):
    return open_dataset(spec_for(**{"data": "real", "dataset": {
        "path": sys.argv[1], "augmentation": augmentation, "workers": 2}}))


def take(augmentation, count):
    from runners.jax.data import host_batches

    it = iter(host_batches(dataset(augmentation), 32, 8))
    out = [(np.array(x), np.array(y)) for x, y in (next(it) for _ in range(count))]
    it.close()
    return out


def main():
    devices, _ = setup_devices(spec_for(num_devices=2))
    from runners.jax.data import batch_file_indices, device_batches
    from runners.jax.flax_step import make_shardings

    none, flip = take("none", 3), take("crop-flip", 3)
    data = dataset("none")
    diffs, labels_equal = [], []
    for i, (x, y) in enumerate(none):
        idx = np.array(batch_file_indices(len(data.files), 8, i))
        rx, ry = load_batch(data.files, idx, 32, "none", np.random.default_rng(0))
        diffs.append(float(np.abs(x - rx).mean()))
        labels_equal.append(bool((y == ry).all()) and y.dtype == np.int32)
    _, sharding = make_shardings(devices)
    batches, line = device_batches(data, 32, 16, sharding)
    x, y = next(batches)
    rows = sorted(s.data.shape[0] for s in x.addressable_shards)
    label_rows = sorted(s.data.shape[0] for s in y.addressable_shards)
    batches.close()
    fx = np.stack([x for x, _ in flip])
    print("RESULT " + json.dumps({
        "mean_abs_diff": diffs, "labels_equal": labels_equal,
        "none_shape": list(none[0][0].shape), "none_dtype": str(none[0][0].dtype),
        "flip_shape": list(flip[0][0].shape), "flip_dtype": str(flip[0][0].dtype),
        "flip_min": float(fx.min()), "flip_max": float(fx.max()),
        "flip_vs_none": float(np.abs(fx - np.stack([x for x, _ in none])).mean()),
        "flip_labels_equal": all(bool((a[1] == b[1]).all())
                                 for a, b in zip(none, flip, strict=False)),
        "device_rows": rows, "device_label_rows": label_rows, "device_line": line}))


if __name__ == "__main__":
    main()
