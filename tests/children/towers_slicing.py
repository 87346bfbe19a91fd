"""Where each tower strategy cuts a batch of 10 over 3 virtual CPU devices: the rows each tower
gets and the devices of the slice ops, read from TF's partition graphs, and the merged output
against the template's. Prints one line "RESULT <json>"."""

import json

import numpy as np

from runners.tf import keras_avolkov1 as keras_tf_avolkov1
from runners.tf import keras_kuza55 as keras_tf_kuza55
from runners.tf import keras_multi_gpu_model as keras_tf_multi_gpu_model
from runners.tf import towers as kt
from runners.tf.placement import graph_run_options, partition_graphs
from tests.specs import run_spec

spec = run_spec(num_devices=3, global_batch_size=10, model="probe", runner="keras_tf_kuza55")
names, _, _ = kt.setup(spec)
cases = {"kuza55": (keras_tf_kuza55, {}),
         "mgm21": (keras_tf_multi_gpu_model, {"keras_version": "2.1"}),
         "mgm22": (keras_tf_multi_gpu_model, {"keras_version": "2.2"}),
         "avolkov1": (keras_tf_avolkov1, {})}
runner_of = {keras_tf_kuza55: "keras_tf_kuza55", keras_tf_avolkov1: "keras_tf_avolkov1",
             keras_tf_multi_gpu_model: "keras_tf_multi_gpu_model"}
x = np.random.default_rng(0).standard_normal((10, 8, 8, 3)).astype(np.float32)
out = {}
for name, (module, options) in cases.items():
    built, fields = module.make(run_spec(**{**spec.to_dict(), "runner": runner_of[module],
                                            "options": options}), names, "feed_dict")
    sess = kt.K.get_session()  # initialises the new model's variables
    model = built.model
    opts, md = graph_run_options()
    tower = sess.run([layer.output for layer in model.layers if layer.name.startswith("slice_")],
                     feed_dict={model.inputs[0]: x}, options=opts, run_metadata=md)
    merged = sess.run(model.outputs[0], feed_dict={model.inputs[0]: x}, options=opts,
                      run_metadata=md)
    plain = sess.run(built.template.outputs[0], feed_dict={built.template.inputs[0]: x})
    cut = {}
    for g in partition_graphs(md):
        for node in g.node:
            if node.op == "StridedSlice" and "/slice_" in "/" + node.name:
                cut[node.name.split("/")[-2] if "/" in node.name else node.name] = node.device
    out[name] = {"rows": [int(t.shape[0]) for t in tower], "merged": int(merged.shape[0]),
                 "max_diff": float(np.abs(merged[:len(merged)] - plain[:len(merged)]).max()),
                 "slice_devices": sorted(set(cut.values())), "split": fields["split"]}
print("RESULT " + json.dumps(out))
