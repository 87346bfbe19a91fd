"""runners.tf.placement against TensorFlow on 2 CPU devices: a MirroredStrategy step, a function
asked onto /cpu:1 and a TF1 session, each read from TF's partition graphs. Prints one line
"RESULT <json>"."""

import json

import tensorflow as tf

from contract.spec import spec_for
from runners.tf.devices import setup_devices
from runners.tf.placement import eager_placement, graph_placement, graph_run_options

setup_devices(spec_for(num_devices=2))
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
with strategy.scope():
    v = tf.Variable(tf.ones((4, 4)))

@tf.function
def mirrored_step(x):
    def replica(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.matmul(x, v))
        g = tf.distribute.get_replica_context().all_reduce("sum", tape.gradient(loss, v))
        v.assign_sub(0.1 * g)
        return loss
    return strategy.run(replica, args=(x,))

batches = iter(strategy.experimental_distribute_dataset(
    tf.data.Dataset.from_tensors(tf.ones((8, 4))).repeat()))
with eager_placement() as mirrored:
    mirrored_step(next(batches))

@tf.function
def asked_for_cpu1_soft(x):
    # an op with no kernel on the asked device would move; a matmul on /cpu:1 stays there
    with tf.device("/cpu:1"):
        return tf.matmul(x, x)

with eager_placement() as one:
    asked_for_cpu1_soft(tf.ones((4, 4)))

g = tf.Graph()
with g.as_default():
    a = tf.compat.v1.placeholder(tf.float32, (4, 4))
    with tf.device("/cpu:1"):
        b = tf.matmul(a, a)
    with tf.compat.v1.Session(graph=g) as sess:
        options, metadata = graph_run_options(full_trace=False)
        sess.run(b, {a: [[1.0] * 4] * 4}, options=options, run_metadata=metadata)
print("RESULT " + json.dumps({"mirrored": mirrored.result()["placement"],
                               "one": one.result()["placement"],
                               "graph": graph_placement(metadata)["placement"]}))
