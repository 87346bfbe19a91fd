"""keras_tf_avolkov1 with average_gradients and nccl on 3 devices: the step's NcclAllReduce ops
and SGD updates, and how many the step fetches. Built, not run (NCCL has no CPU kernel).
Prints one line "RESULT <json>"."""

import json

from runners.tf import keras_avolkov1
from runners.tf import towers as kt
from tests.specs import run_spec

spec = run_spec(num_devices=3, global_batch_size=9, model="probe", runner="keras_tf_avolkov1",
                options={"average_gradients": True, "nccl": True})
names, _, _ = kt.setup(spec)
template = kt.build_template("probe", None)
recipe = kt.Recipe(names, merge_device="/cpu:0", slice_device="/cpu:0", remainder="last")
opt = kt.optimizer(spec, keras_avolkov1.SGDMultiGPU, devices=names, nccl=True)
model = kt.compile_model(template, recipe, names[0], "feed_dict", opt).model
model._make_train_function()  # builds the step; no session runs (NCCL has no CPU kernel)
fn = model.train_function
seen, stack = set(), [t.op for t in fn.outputs] + [fn.updates_op]
while stack:  # every op the step's fetches reach
    op = stack.pop()
    if op.name not in seen:
        seen.add(op.name)
        stack.extend(t.op for t in op.inputs)
        stack.extend(op.control_inputs)
ops = fn.updates_op.graph.get_operations()
nccl = [op for op in ops if op.type == "NcclAllReduce"]
print("RESULT " + json.dumps({"params": len(model.trainable_weights), "nccl": len(nccl),
                  "fetched": sum(op.name in seen for op in nccl),
                  "devices": sorted({op.device for op in nccl}),
                  "updates": sum(op.type.startswith("ResourceApply") and op.name in seen
                                 for op in ops)}))
