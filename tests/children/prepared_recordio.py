"""Reads back the RecordIO file prepare-data wrote (argv[1]: its output folder) with MXNet: each
row's label and image digest, in .rec id order. Prints one line "RESULT <json>"."""

import hashlib
import json
import sys

import mxnet as mx

out = sys.argv[1]
reader = mx.recordio.MXIndexedRecordIO(out + "/train.idx", out + "/train.rec", "r")
try:
    import cv2  # noqa: F401  (unpack_img decodes with it)
    have_cv2 = True
except ImportError:
    have_cv2 = False
rows = []
for key in sorted(reader.keys):
    s = reader.read_idx(key)
    header, jpeg = mx.recordio.unpack(s)
    if have_cv2:
        header2, img = mx.recordio.unpack_img(s)  # BGR numpy array
        assert header2.label == header.label
        shape = img.shape
    else:
        shape = mx.image.imdecode(jpeg).shape
    assert header.id == key and header.flag == 0, header
    rows.append([int(header.label), int(shape[0]), int(shape[1]),
                 hashlib.md5(jpeg).hexdigest()])
print("RESULT " + json.dumps({"rows": rows, "cv2": have_cv2}))
