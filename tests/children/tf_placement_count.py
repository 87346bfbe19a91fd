"""eager_placement of a tf.function of three matmuls: each op counted once. Prints one line
"RESULT <json>"."""

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
