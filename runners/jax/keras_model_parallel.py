"""Keras 3 on JAX with keras.distribution.ModelParallel: the model's weights sharded over the
devices by a LayoutMap, trained with model.fit (keras 3.15.1, jax 0.10.2), as Keras'
distribution guide and its ModelParallel docstring do it; keras_jax's machinery
(runners/jax/keras_jax.py: fit, the clock, the input modes, the placement probe) with a
ModelParallel in place of its DataParallel.

Processes: one process drives all N devices (N virtual CPU devices through XLA_FLAGS, or N
GPUs).
Mesh: keras.distribution.DeviceMesh of shape (1, N), axes ("batch", "model"): every weight the
LayoutMap names is sharded over all N devices along the "model" axis, so that each device holds
1/N of it, as jax_fsdp shards over N devices; the batch axis has one device, so every device
takes the whole global batch (B rows, not B/N). This is Keras' own recipe for the widest
sharding (its ModelParallel docstring: "update the device mesh shape to (1, 8) ... the
variables will be sharded across 8 devices"; KerasHub's Gemma guides use (1, 8)). A
(N/M, M) mesh would shard each weight over M devices only and replicate it N/M times: the
split the issue compares (each device 1/N of the state) needs M = N. So it is tensor (model)
parallelism, not sharded data parallelism: a device computes its slice of each layer for every
row; what moves between devices are activations (the partial sums of a row-sharded layer, the
slices of a column-sharded one), where jax_fsdp moves weights.
Split (the LayoutMap: regexes over the variable paths, Keras' fullmatch; the paths are those
models/transformer_keras.py and models/keras_common.py give):
  transformer (Megatron-style): attention query/key/value kernels (d, heads, head_dim) split
  by heads (None, "model", None) with their biases ("model", None); the attention output kernel
  (heads, head_dim, d) by heads ("model", None, None); the MLP's first Dense (d, 4d) by its
  output (None, "model") with its bias, its second (4d, d) by its input ("model", None); the
  token embedding (vocab, d), tied to the LM head, by vocabulary ("model", None); a ViT's patch
  embedding Conv2D and classifier head by their outputs.
  CNNs: every Conv2D kernel (kh, kw, in, out) by its output channels (None, None, None,
  "model") with its bias; the classifier Dense (fc, dense) by its classes (None, "model").
  A variable the LayoutMap names but whose sharded dimension N does not divide (10 classes on
  4 devices) gets an exact-path entry that replicates it (Keras looks exact paths up first);
  the record lists them (`layout_map.replicated_not_divisible`). LayerNorm and BatchNorm
  parameters and statistics, the other biases and the position embeddings are not in the map:
  Keras replicates them (small; they count whole on every device in the state record).
  The paths and shapes come from one build of the model before the distribution is set (the
  ModelParallel docstring's "first list out all the model variable paths"); the model is then
  built again under the distribution, which creates each variable in its layout. The optimizer
  creates each momentum with its variable's layout (Keras' add_variable_from_reference), so the
  optimizer state is split as the params are.
Reduce: Keras jits its train step over the global batch with the variables' shardings as
out_shardings; XLA's SPMD partitioner inserts the collectives (all-reduces of a row-sharded
layer's partial outputs, all-gathers of sharded activations); a sharded weight's gradient is
computed where the weight lies, from the whole batch, so no gradient all-reduce is needed for
it; a replicated one's is the same on every device.
Synchronise: one program updates every shard (synchronous SGD).
BatchNorm: Keras' own BatchNormalization, replicated: with one device on the batch axis every
device normalises over the whole global batch (global statistics by construction; keras_jax's
per-device subclass has no meaning here), so there is no `batchnorm` option.
Input, timing, placement, count: keras_jax's (option `input`, numpy or preplaced, and `loader`
for real data); the placement is the rows of the first timed batch per device, here the whole
batch on each.
State (`state_bytes_per_device`): each variable's jax Array addressable_shards after fit;
gradients from one untimed jitted gradient call after fit (runners/jax/state.py).
Precision: bf16 is Keras' mixed_bfloat16 policy (float32 variables, bfloat16 compute).
Equivalence: keras_jax's path (one plain-SGD step of fit on the probe model) under this
distribution; the probe's conv kernel (3, 3, 3, 4) and dense kernel (256, 10) are sharded by
output.
Models: the built-in CNNs and transformers; a user's Keras model is not taken (its layer paths
are unknown to the LayoutMap's regexes, which would leave it replicated: a DataParallel run).
What differs: not across nodes (the (1, N) mesh feeds every process the whole batch, which
keras_jax's per-process feeding does not do); no 2-D mesh option.
"""

from __future__ import annotations

from typing import Any

from models import get_spec, load_builder
from runners.common import Spec, main
from runners.jax.common import setup_devices, sharding_record
from runners.jax.keras_jax import STATE_SOURCE, build_model, import_keras
from runners.jax.keras_jax import benchmark as keras_benchmark
from runners.jax.keras_jax import equivalence as keras_equivalence

BATCH, MODEL = "batch", "model"
# (regex fullmatched against a variable's path, the layout of its dimensions)
RULES: tuple[tuple[str, tuple[str | None, ...]], ...] = (
    (r".*_attn/(query|key|value)/kernel", (None, MODEL, None)),
    (r".*_attn/(query|key|value)/bias", (MODEL, None)),
    (r".*_attn/attention_output/kernel", (MODEL, None, None)),
    (r".*_fc1/kernel", (None, MODEL)),
    (r".*_fc1/bias", (MODEL,)),
    (r".*_fc2/kernel", (MODEL, None)),
    (r"wte/embeddings", (MODEL, None)),
    (r"(.*_)?conv/kernel|patch_embed/kernel", (None, None, None, MODEL)),
    (r"(.*_)?conv/bias|patch_embed/bias", (MODEL,)),
    (r"(fc|dense|head)/kernel", (None, MODEL)),
    (r"(fc|dense|head)/bias", (MODEL,)),
)


def variable_shapes(spec: Spec, name: str | None) -> dict[str, tuple[int, ...]]:
    """{path: shape} of the model's variables, from one build without a distribution."""
    keras = import_keras()
    if name is None:
        model, _, _ = build_model(keras, spec, None, data_format="channels_last")
    else:
        model = load_builder(name, "keras")(get_spec(name))
    shapes = {v.path: tuple(int(d) for d in v.shape) for v in model.variables}
    del model
    keras.utils.clear_session()
    return shapes


def layout_map(keras: Any, mesh: Any, shapes: dict[str, tuple[int, ...]]
               ) -> tuple[Any, list[str]]:
    """(the LayoutMap of RULES over `mesh`, the paths it names that the model axis does not
    divide, given exact-path replicated entries)."""
    layouts = keras.distribution.LayoutMap(mesh)
    for pattern, axes in RULES:
        layouts[pattern] = axes
    m = mesh.shape[list(mesh.axis_names).index(MODEL)]
    whole = []
    for path, shape in shapes.items():
        layout = layouts[path]  # Keras' own lookup: exact path, then the fullmatching regex
        if layout is None:
            continue
        axes = tuple(layout.axes)
        if len(axes) != len(shape) or any(a is not None and d % m for a, d in zip(
                axes, shape, strict=False)):
            layouts[path] = (None,) * len(shape)
            whole.append(path)
    return layouts, whole


def model_parallel(spec: Spec, name: str | None = None) -> tuple[Any, Any, list[dict[str, Any]]]:
    """The run's devices, Keras with ModelParallel over a (1, N) (batch, model) mesh set
    globally, the device descriptions (keras_jax's Distribute)."""
    devices, described = setup_devices(spec)
    keras = import_keras()
    shapes = variable_shapes(spec, name)
    mesh = keras.distribution.DeviceMesh((1, len(devices)), (BATCH, MODEL), devices=devices)
    layouts, whole = layout_map(keras, mesh, shapes)
    distribution = keras.distribution.ModelParallel(layout_map=layouts, batch_dim_name=BATCH)
    distribution.replicated_not_divisible = whole  # for the record
    keras.distribution.set_distribution(distribution)
    return keras, distribution, described


def describe(distribution: Any, model: Any) -> dict[str, Any]:
    """The LayoutMap and what jax says of the variables it made: each sharded variable's
    sharding (read from its jax Array), the replicated ones counted."""
    sharded, replicated = {}, []
    for v in model.variables:
        sharding = v.value.sharding
        if sharding.is_fully_replicated:
            replicated.append(v.path)
        else:
            sharded[v.path] = str(sharding.spec)
    mesh = distribution.device_mesh
    return {"layout_map": {
        "rules": {pattern: list(axes) for pattern, axes in RULES},
        "replicated_not_divisible": distribution.replicated_not_divisible,
        "mesh": dict(zip(mesh.axis_names, (int(d) for d in mesh.shape), strict=True)),
        "sharded_variables": sharded,
        "replicated_variables": len(replicated),
        "example": sharding_record(model.trainable_variables[0].value.sharding),
        "source": "each variable's jax Array .sharding after fit"}}


MP_STATE_SOURCE = STATE_SOURCE.replace("after fit: params", "after fit (ModelParallel: a "
                                       "variable the LayoutMap shards holds its 1/N slice on "
                                       "each device, the others a full copy): params")


def benchmark(spec: Spec) -> dict[str, Any]:
    return keras_benchmark(spec, model_parallel, describe, MP_STATE_SOURCE)


def equivalence(spec: Spec) -> dict[str, Any]:
    return keras_equivalence(spec, model_parallel, describe)


if __name__ == "__main__":
    main(benchmark, equivalence)
