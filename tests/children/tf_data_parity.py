"""tf.data's batches of the dataset in argv[1] against real_data.load_batch on the same files,
for augmentation none and crop-flip. Prints one line "RESULT <json>"."""

import json
import sys

import numpy as np

from contract.spec import spec_for
from runners.real_data import load_batch, open_dataset
from runners.tf import data as tf_data

path = sys.argv[1]
def data(aug):
    return open_dataset(spec_for(**{"data": "real",
                         "dataset": {"path": path, "augmentation": aug, "workers": 2}}))
none, flip = data("none"), data("crop-flip")
out = {}
for size in (32, 64):  # 40 x 40 images: crop only, and resize (40 -> 64) then crop
    it = iter(tf_data.make_dataset(none, size, 8, shuffle=False))
    diffs, labels_equal = [], True
    for b in range(7):  # 6 batches make an epoch of 48; the 7th is the next epoch's first
        x, y = (v.numpy() for v in next(it))
        idx = np.arange(b * 8, b * 8 + 8) % 48
        rx, ry = load_batch(none.files, idx, size, "none", np.random.default_rng(0))
        assert x.shape == rx.shape and x.dtype == np.float32, (x.shape, x.dtype)
        diffs.append(float(np.abs(x - rx).mean()))
        labels_equal &= bool((y == ry).all())
    out[size] = {"mean_abs": max(diffs), "labels_equal": labels_equal}
xn = next(iter(tf_data.make_dataset(none, 32, 8, shuffle=False)))[0].numpy()
xf, yf = (v.numpy() for v in next(iter(tf_data.make_dataset(flip, 32, 8, shuffle=False))))
xc = next(iter(tf_data.make_dataset(none, 32, 8, shuffle=False, channels_first=True)))[0]
out["flip"] = {"shape": list(xf.shape), "min": float(xf.min()), "max": float(xf.max()),
               "diff_from_none": float(np.abs(xf - xn).mean()), "dtype": str(xf.dtype),
               "labels": yf.tolist()}
out["nchw"] = {"shape": list(xc.shape),
               "equal": bool(np.array_equal(xc.numpy(), xn.transpose(0, 3, 1, 2)))}
print("RESULT " + json.dumps(out))
