"""keras_tf_avolkov1's StagingArea input (argv[1]: equivalence inputs): a step primed with batch A
and fed B against one primed with A and fed A; the weights' largest differences. Prints one
line "RESULT <json>"."""

import json
import sys

import numpy as np

from models.keras2_common import get_canonical_weights, set_canonical_weights
from runners.tf import keras_avolkov1 as keras_tf_avolkov1
from runners.tf import towers as kt
from runners.tf.towers_input import arrays_source
from tests.specs import run_spec

spec = run_spec(num_devices=2, global_batch_size=16, model="probe", runner="keras_tf_avolkov1",
                options={"input": "staging"}, mode="equivalence",
                equivalence={"inputs": sys.argv[1], "learning_rate": 0.5})
names, _, _ = kt.setup(spec)
weights, x, y, lr = spec.equivalence_inputs()
other = x[::-1].copy() * 3

def step(primed, fed):
    built, _ = keras_tf_avolkov1.make(spec, names, "staging")  # lr: spec.equivalence
    set_canonical_weights(built.template, weights)
    kt.prime(built, *primed)
    built.model.fit(**arrays_source(*fed).fit_args(1, True), verbose=0)
    return get_canonical_weights(built.template)

a = step((x, y), (other, y[::-1].copy()))   # trains on the primed batch
b = step((x, y), (x, y))
print("RESULT " + json.dumps({k: float(np.abs(a[k] - b[k]).max()) for k in a}))
