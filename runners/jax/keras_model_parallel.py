"""keras_model_parallel: Keras 3 on JAX with keras.distribution.ModelParallel as Keras' guide does
it: a (1, N) DeviceMesh and a LayoutMap (RULES) sharding each named weight over all N devices
(tensor parallelism; every device takes the whole batch). Fit, clock, input and records are
keras_run.py's. Differs: not across nodes, no 2-D mesh, no user's model.
docs/runners/keras_model_parallel.md."""

from __future__ import annotations

from functools import partial
from typing import Any

from contract.reasons import code
from runners import memory
from runners.common import Spec, main
from runners.jax import keras_run
from runners.jax.common import setup_devices, sharding_record
from runners.jax.keras_fit import import_keras
from runners.jax.keras_run import Strategy, build_model

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
    """{path: shape} of the model's variables, from one build (build_model's: the run's model,
    or the model `name`; the probe's data_format is channels_last) without a distribution."""
    keras = import_keras()
    model, _, _ = build_model(keras, spec, name, data_format="channels_last")
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
    memory.baseline(code("memory.baseline_keras_jax"))
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


MODEL_PARALLEL = Strategy(model_parallel, describe,
                          code("jax.keras_model_parallel_state_source"))

benchmark = partial(keras_run.benchmark, strategy=MODEL_PARALLEL)
equivalence = partial(keras_run.equivalence, strategy=MODEL_PARALLEL)


if __name__ == "__main__":
    main(benchmark, equivalence)
