"""The torch DataLoader's first batch of the dataset in argv[1] against real_data.load_batch on
the same files, for augmentation none and crop-flip, and rerun with another worker count.
Prints one line "RESULT <json>"."""

import json
import sys

import numpy as np

from runners.real_data import load_batch
from runners.torch.data import epochs, make_dataloader
from tests.children.torch_loader_data import data

path = sys.argv[1]
out = {}
for aug in ("none", "crop-flip"):
    x, y, idx = next(epochs(make_dataloader(data(path, aug, 2), 32, 8, 0, 1)))
    again = next(epochs(make_dataloader(data(path, aug, 0), 32, 8, 0, 1)))
    ref_x, ref_y = load_batch(data(path, aug, 0).files, idx.numpy(), 32, "none",
                              np.random.default_rng(0), channels_first=True)
    out[aug] = {"shape": list(x.shape), "dtype": str(x.dtype), "min": float(x.min()),
                "max": float(x.max()), "mad_vs_centre": float(np.abs(x.numpy() - ref_x).mean()),
                "labels_equal": bool((y.numpy() == ref_y).all()),
                "rerun_equal": bool((again[0] == x).all() and (again[2] == idx).all())}
print("RESULT " + json.dumps(out))
