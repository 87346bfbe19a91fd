"""tf_native's FusedBatchNormalization against Keras 3's BatchNormalization: outputs, gradients
and moving statistics in both layouts, and the swapped ResNet-50's parameters and canonical
names. Prints one line "RESULT <json>"."""

import json

import keras
import numpy as np
import tensorflow as tf

from models import get_spec
from models.keras_common import get_canonical_weights
from runners.tf.native import FusedBatchNormalization, build_model

diffs = {}
for fmt, axis, shape in (("channels_last", -1, (4, 5, 6, 3)), ("channels_first", 1, (4, 3, 5, 6))):
    x = tf.constant(np.random.default_rng(0).standard_normal(shape).astype("float32") * 2 + 1)
    outs = []
    for layer in (keras.layers.BatchNormalization(axis=axis, epsilon=1e-5, momentum=0.9),
                  FusedBatchNormalization(axis=axis, epsilon=1e-5, momentum=0.9)):
        layer.build(shape)
        layer.gamma.assign([1.5, 0.5, 2.0])
        layer.beta.assign([0.1, -0.2, 0.3])

        @tf.function
        def step(x, layer=layer):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = layer(x, training=True)
                loss = tf.reduce_sum(tf.sin(y))
            return [y, *tape.gradient(loss, [x, layer.gamma.value, layer.beta.value])]

        got = step(x)
        got += [layer.moving_mean.value, layer.moving_variance.value, layer(x, training=False)]
        outs.append([np.asarray(v) for v in got])
    diffs[fmt] = [float(np.abs(a - b).max() / max(1.0, np.abs(a).max()))
                  for a, b in zip(*outs, strict=False)]
fused, swapped = build_model("resnet50", get_spec("resnet50"), "channels_last", True)
plain, _ = build_model("resnet50", get_spec("resnet50"), "channels_last", False)
print("RESULT " + json.dumps({
    "diffs": diffs, "swapped": swapped, "params": fused.count_params(),
    "fused_layers": sum(isinstance(layer, FusedBatchNormalization) for layer in fused.layers),
    "same_names": sorted(get_canonical_weights(fused)) == sorted(get_canonical_weights(plain)),
}))
