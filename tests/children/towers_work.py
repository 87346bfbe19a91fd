"""Each tower strategy at 2 devices, one traced fit step of the model named by the first
argument (a CNN with BatchNorm: small_cnn in the test) through the runner's own path (make,
compile_model, placement_step): what each device executed by op kind, what the parent's
check_work makes of it, and whether BatchNorm's moving mean moved. Prints one line
"RESULT <json>"."""

import json
import sys

import numpy as np

from bench.records.placement_check import check_work
from models import get_spec
from runners.tf import keras_avolkov1, keras_kuza55, keras_multi_gpu_model
from runners.tf import towers as kt
from runners.tf.placement import partition_graphs
from runners.tf.towers_input import arrays_source, synthetic_arrays
from runners.tf.towers_run import placement_step
from tests.specs import run_spec

cases = {"keras_tf_kuza55": (keras_kuza55, {}),
         "keras_tf_multi_gpu_model": (keras_multi_gpu_model, {}),
         "keras_tf_avolkov1": (keras_avolkov1, {}),
         "keras_tf_avolkov1-average": (keras_avolkov1, {"average_gradients": True})}
model = sys.argv[1]
out = {}
for name, (module, options) in cases.items():
    spec = run_spec(num_devices=2, global_batch_size=8, model=model,
                    runner=name.split("-")[0], options=options)
    kt.K.clear_session()  # each case in a graph of its own, as each run is
    names, _, _ = kt.setup(spec)
    built, fields = module.make(spec, names, "feed_dict")
    bn = next(layer for layer in built.template.layers
              if "BatchNorm" in type(layer).__name__)
    before = kt.K.get_value(bn.moving_mean)
    x, y = synthetic_arrays(get_spec(model), 8)
    work = placement_step(built, arrays_source(x, y).fit_args(1, False), names,
                             fields.get("gradient_copies", 1))
    shown, problems = check_work(work)
    ops = sorted({n.op for g in partition_graphs(built.run_metadata) for n in g.node})
    out[name] = {**{k: work[k] for k in ("forward_convs_per_device",
                                         "backward_convs_per_device", "convs_per_tower",
                                         "conv_backprop_filter_ops_built")},
                 "problems": problems, "checked": sorted(shown),
                 "bn_moved": float(np.abs(kt.K.get_value(bn.moving_mean) - before).max()),
                 "onednn_ops": any(op.startswith("_Mkl") for op in ops)}
print("RESULT " + json.dumps(out))
