"""ImageRecordIter (shuffle off) against real_data.load_batch on two prepared datasets (argv: the
40 x 40 one, then one at 24 x 24): images and labels for augmentation none, crop-flip windows.
Prints one line "RESULT <json>"."""

import json
import sys

import numpy as np

from contract.spec import spec_for
from runners import real_data
from runners.mxnet.data import numpy_batches, record_iter, stream


def read(path, augmentation, batch, batches):
    spec = {"data": "real", "dataset": {"path": path, "augmentation": augmentation,
                                        "workers": 2}}
    data = real_data.open_dataset(spec_for(**spec))
    feed = numpy_batches(stream(record_iter(data, 32, batch, shuffle=False)))
    got = [next(feed) for _ in range(batches)]
    return data, np.concatenate([x for x, _ in got]), np.concatenate([y for _, y in got])

def window(x, full):
    # the (top, left, flipped) window of the full image closest to x, and its distance
    best = None
    for t in range(full.shape[1] - 31):
        for left in range(full.shape[2] - 31):
            for f in (0, 1):
                c = full[:, t:t + 32, left:left + 32]
                d = float(np.abs((c[:, :, ::-1] if f else c) - x).mean())
                if best is None or d < best[0]:
                    best = (d, t, left, f)
    return best

out = {}
for name, path in (("kept", sys.argv[1]), ("upscaled", sys.argv[2])):
    data, x, y = read(path, "none", 16, 3)
    rx, ry = real_data.load_batch(data.files, np.arange(48), 32, "none",
                                  np.random.default_rng(0), channels_first=True)
    out[name] = {"shape": list(x.shape), "dtype": str(x.dtype),
                 "labels_equal": bool((y == ry).all()),
                 "mean_abs": float(np.abs(x - rx).mean()),
                 "max_abs": float(np.abs(x - rx).max())}
data, x, y = read(sys.argv[1], "crop-flip", 16, 3)
_, none, _ = read(sys.argv[1], "none", 16, 3)
full = [real_data.normalise(real_data.load_image(f)).transpose(2, 0, 1)
        for f, _ in data.files]
windows = [window(x[i], full[i]) for i in range(48)]
out["crop_flip"] = {
    "shape": list(x.shape), "min": float(x.min()), "max": float(x.max()),
    "labels_equal": bool((y == np.array([label for _, label in data.files])).all()),
    "differs_from_none": float(np.abs(x - none).mean()),
    "worst_window": max(w[0] for w in windows),
    "positions": len({w[1:3] for w in windows}), "flipped": sum(w[3] for w in windows),
    "slots_repeat": [w[1:] for w in windows[:16]] == [w[1:] for w in windows[16:32]]}
print("RESULT " + json.dumps(out))
