"""One tensorpack MiniGoogLeNet step at 8 towers with allreduce mode argv[1] (auto: packed
hierarchical; gpu: no packer) from fixed weights, saved to argv[2]. Prints one line
"RESULT <json>"."""

import json
import sys

import numpy as np
import tensorflow as tf

from models import get_spec, load_builder
from runners.tf import tensorpack as tp

mode, out = sys.argv[1], sys.argv[2]
model = get_spec("minigooglenet")
with tf.Graph().as_default():  # the model's variables, for initial values both runs share
    images = tf.compat.v1.placeholder(tf.float32, [1, *model.input_shape])
    load_builder("minigooglenet", "tfv1")(model, images, training=True, data_format="channels_last")
    shapes = {v.op.name: v.shape.as_list() for v in tf.compat.v1.global_variables()}
    trainable = sorted(v.op.name for v in tf.compat.v1.trainable_variables())
rng = np.random.default_rng(7)
initial = {k: (rng.standard_normal(s) * 0.05).astype(np.float32) for k, s in shapes.items()}
for k in initial:
    if k.endswith("moving_variance"):
        initial[k] = np.abs(initial[k]) + 1.0
# the same batch for every tower: which tower dequeues which batch is a race, and each tower's
# dropout mask is its own (fixed by the graph seed)
feed = [[rng.standard_normal((2, *model.input_shape)).astype(np.float32),
         rng.integers(0, model.num_classes, 2).astype(np.int32)]]
tf.compat.v1.disable_eager_execution()
tf.compat.v1.set_random_seed(1)
from tests.specs import run_spec  # noqa: E402

spec = run_spec(num_devices=8, batch_size_per_device=2, global_batch_size=16,
                runner="tensorpack",
                options={"trainer": "replicated", "input": "queue", "allreduce": mode})
run = tp.train(spec, "minigooglenet", feed, tf.compat.v1.train.GradientDescentOptimizer(0.1),
               (0, 1), initial=initial, read_vars=trainable)
np.savez(out, **run["clock"].values)
print("RESULT " + json.dumps({k: run[k] for k in ("allreduce", "gradient_packer", "placement")}))
