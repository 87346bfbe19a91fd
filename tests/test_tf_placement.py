"""runners/tf/placement.py against TensorFlow itself: the placement it reads is where TF put
the ops, not where anybody asked for them."""

from __future__ import annotations

import pytest

from tests.helpers.cli import run_check_script

pytestmark = [pytest.mark.slow, pytest.mark.framework("tf")]

SCRIPT = """
import json
import tensorflow as tf
from runners.tf.devices import setup_devices
from runners.tf.placement import eager_placement, graph_placement, graph_run_options
from contract.spec import spec_for
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
"""


def test_placement_is_read_from_tensorflows_partition_graphs(tf_python: str) -> None:
    out = run_check_script(tf_python, SCRIPT)
    cpu = "/job:localhost/replica:0/task:0/device:CPU:"
    # MirroredStrategy runs the step's compute on both replicas
    assert set(out["mirrored"]) == {cpu + "0", cpu + "1"}
    assert all(n > 3 for n in out["mirrored"].values()), out["mirrored"]
    # a function whose only compute is on /cpu:1 shows that device alone
    assert set(out["one"]) == {cpu + "1"}
    assert out["graph"] == {cpu + "1": 1}


COUNT_SCRIPT = """
import json
import tensorflow as tf
from runners.tf.placement import eager_placement

@tf.function
def three_matmuls(x):
    return tf.matmul(tf.matmul(tf.matmul(x, x), x), x)

x = tf.ones((4, 4))
with eager_placement() as p:
    three_matmuls(x)
print("RESULT " + json.dumps(p.result()["placement"]))
"""


def test_each_op_is_counted_once(tf_python: str) -> None:
    """Eager run metadata lists a function's partition graphs twice (alone and under the
    function): three matmuls are three compute ops, not six."""
    out = run_check_script(tf_python, COUNT_SCRIPT)
    assert out == {"/job:localhost/replica:0/task:0/device:CPU:0": 3}
