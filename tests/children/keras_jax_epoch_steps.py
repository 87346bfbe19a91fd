"""keras_jax on numpy input holding 4 batches (epochs of 4 steps): the timed window must not hold
the second epoch's recompile. argv: a spec (JSON). Prints one line "RESULT <json>"."""

import json
import sys

import runners.jax.keras_input as ki
from contract.spec import Spec
from runners.jax.keras_jax import benchmark

ki.HOST_DATA_CAP = 4 * 8 * 32 * 32 * 3 * 4
r = benchmark(Spec.from_dict(json.loads(sys.argv[1])))
print("RESULT " + json.dumps({k: r.get(k) for k in (
    "step_times_s", "warmup_steps_run", "warmup_extended", "host_dataset", "samples",
    "window_evidence", "window_recompiled")}))
