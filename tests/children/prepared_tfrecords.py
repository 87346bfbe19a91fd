"""Reads back the TFRecord shards prepare-data wrote (argv[1]: its output folder) with TensorFlow:
the file count and each row's label and image digest. Prints one line "RESULT <json>"."""

import hashlib
import json
import sys

import tensorflow as tf

files = sorted(tf.io.gfile.glob(sys.argv[1] + "/tfrecord/train-*"))
spec = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
        "image/class/label": tf.io.FixedLenFeature([], tf.int64),
        "image/height": tf.io.FixedLenFeature([], tf.int64),
        "image/width": tf.io.FixedLenFeature([], tf.int64)}
rows = []
for raw in tf.data.TFRecordDataset(files):
    ex = tf.io.parse_single_example(raw, spec)
    img = tf.io.decode_jpeg(ex["image/encoded"])
    assert img.shape[0] == int(ex["image/height"]) and img.shape[1] == int(ex["image/width"])
    assert img.shape[2] == 3
    rows.append([int(ex["image/class/label"]), int(img.shape[0]), int(img.shape[1]),
                 hashlib.md5(ex["image/encoded"].numpy()).hexdigest()])
print("RESULT " + json.dumps({"files": len(files), "rows": rows}))
