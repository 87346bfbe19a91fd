"""runners.mxnet.data.resize_for on JPEGs of mixed sizes (argv[1]) and a manifest's size, and
record_iter refusing a dataset smaller than the batch (argv[2]). Prints one line "RESULT <json>"."""

import json
import sys
from pathlib import Path

from contract.spec import spec_for
from runners.common import Unavailable
from runners.mxnet.data import record_iter, resize_for
from runners.real_data import RealData, open_dataset

root = Path(sys.argv[1])
files = [(str(p), 0) for p in sorted(root.glob("*.jpg"))]
kept = RealData(root, "none", 1, files, 1, {"options": {"resize": 0}})
small = RealData(root, "none", 1, files, 1, {"options": {"resize": 24}})
out = {"mixed_32": resize_for(kept, 32), "mixed_16": resize_for(kept, 16),
       "mixed_64": resize_for(kept, 64), "manifest_24": resize_for(small, 32)}
data = open_dataset(spec_for(**{"data": "real", "dataset": {"path": sys.argv[2], "workers": 1,
                                                            "augmentation": "crop-flip"}}))
try:
    record_iter(data, 32, 64)
except Unavailable as exc:
    out["too_small"] = str(exc)
print("RESULT " + json.dumps(out))
