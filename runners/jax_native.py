"""Native JAX: one jax.jit train step over a 1-D device mesh, data parallel by sharding alone
(no pmap, no explicit collectives); Flax (linen) model, optax SGD with momentum.

Split: the N devices form a Mesh with one axis, "data". The global batch is one jax.Array
sharded along axis 0 (NamedSharding(mesh, P("data"))): each device holds B/N rows. The
synthetic batch is generated once, under jit, straight into that sharding, so a step copies
nothing from the host. Params, BatchNorm statistics, the momentum and the step counter are
replicated (NamedSharding(mesh, P())), and the jitted step's in/out shardings pin them there.
Reduce: the step is written for the global batch (value_and_grad of the mean softmax
cross-entropy over all B rows); XLA's SPMD partitioner splits it per device and, because the
loss and the parameter gradients reduce over the sharded batch axis while their outputs are
replicated, inserts the all-reduces itself (NCCL between GPUs, an in-process reduction between
virtual CPU devices). The compiled step's all-reduce count is recorded. Synchronise: every
device applies the same all-reduced update inside the same program (synchronous SGD); the
state buffers are donated, so an update happens in place.
BatchNorm: under this global-view jit the batch mean and variance are reductions over the
sharded axis too, so XLA all-reduces them: statistics are over the whole global batch (sync
BatchNorm, one all-reduce per layer per pass), unlike per-device BatchNorm in
MirroredStrategy, DDP or MXNet. Observed: the running variance of a BatchNorm applied to a
2-device sharded batch equals the variance of the whole batch, not the mean of the per-device
variances (tests/test_jax_runners.py checks it).
Real data (data: real): the global batch comes from the Grain pipeline of runners/jax_data.py
(Pillow decode and crop/flip in `workers` processes), each batch jax.device_put into the batch
sharding one batch ahead; the step is compiled for its shapes before the first batch is read,
so the input pipeline's start-up falls in the warm-up and its steady state in the timed window.
Timing: the loss is replicated, so loss.block_until_ready() waits for its copy on every device
(float(loss) would wait only for device 0's copy); every output of one execution on a device
becomes ready together, so the whole step has finished everywhere at each clock reading.
Samples are counted from the train state's step counter (Flax TrainState.step, incremented
inside the jitted step; optax's sgd keeps no counter of its own), read back after the window.
Precision: bf16 builds the Flax model with dtype=bfloat16 (bfloat16 compute, float32 params,
float32 BatchNorm statistics and reductions), the logits cast to float32 for the loss; the
optimizer updates the float32 params.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from models import get_spec, load_builder
from runners.common import (
    Invalid,
    Spec,
    StepTimer,
    finite,
    load_equivalence_inputs,
    main,
    save_equivalence_output,
)
from runners.jax_common import (
    framework_versions,
    host_labels,
    real_dataset,
    setup_devices,
    sharding_record,
    synthetic_batch,
)
from runners.real_data import RealData, describe

if TYPE_CHECKING:
    import flax.linen as nn
    import jax
    import optax
    from flax.training import train_state

VERSIONS = ("flax", "optax")
DROPOUT_SEED = 1


def make_shardings(devices: list[jax.Device]) -> tuple[Any, Any]:
    """(replicated, batch-sharded) NamedShardings over a 1-D mesh of the devices, axis "data"."""
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(devices), ("data",))
    return NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))


def state_class() -> type[train_state.TrainState]:
    """Flax's TrainState (params, optax state, step counter) plus the BatchNorm statistics."""
    from flax.training import train_state

    class TrainState(train_state.TrainState):
        batch_stats: Any

    return TrainState


def create_state(model: nn.Module, variables: Any, tx: optax.GradientTransformation,
                 replicated: Any) -> train_state.TrainState:
    """The train state built under jit directly into the replicated sharding."""
    import jax

    cls = state_class()

    def make(variables: Any) -> train_state.TrainState:
        return cls.create(apply_fn=model.apply, params=variables["params"], tx=tx,
                          batch_stats=variables.get("batch_stats", {}))

    return jax.jit(make, out_shardings=replicated)(variables)


def init_variables(model: nn.Module, shape_hwc: tuple[int, int, int]) -> Any:
    """The model's initial variables (fixed seed) on the default device."""
    import jax
    import jax.numpy as jnp

    x = jnp.zeros((1, *shape_hwc), jnp.float32)
    return jax.jit(lambda: model.init(jax.random.key(0), x, train=False))()


def make_train_step(replicated: Any, batch: Any) -> Callable[..., Any]:
    """The jitted step (state, x, y) -> (state, loss): SGD on the global mean cross-entropy,
    BatchNorm statistics updated; the state donated, its shardings pinned."""
    import jax
    import jax.numpy as jnp
    import optax

    def step(state: train_state.TrainState, x: jax.Array, y: jax.Array
             ) -> tuple[train_state.TrainState, jax.Array]:
        dropout = jax.random.fold_in(jax.random.key(DROPOUT_SEED), state.step)

        def loss_fn(params: Any) -> tuple[jax.Array, Any]:
            logits, updates = state.apply_fn(
                {"params": params, "batch_stats": state.batch_stats}, x, train=True,
                mutable=["batch_stats"], rngs={"dropout": dropout})
            loss = optax.softmax_cross_entropy_with_integer_labels(
                logits.astype(jnp.float32), y).mean()
            return loss, updates

        (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        state = state.apply_gradients(
            grads=grads, batch_stats=updates.get("batch_stats", state.batch_stats))
        return state, loss

    return jax.jit(step, in_shardings=(replicated, batch, batch),
                   out_shardings=(replicated, replicated), donate_argnums=0)


def compile_step(step: Any, state: Any, x: Any, y: Any) -> tuple[Any, dict[str, int]]:
    """The step compiled ahead of time for these arguments, and the collectives XLA put in it."""
    compiled = step.lower(state, x, y).compile()
    hlo = compiled.as_text()
    ops = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
    return compiled, {op: hlo.count(f" {op}(") + hlo.count(f" {op}-start(") for op in ops}


def input_batches(data: RealData | None, model_spec: Any, global_batch: int, batch: Any
                  ) -> tuple[Iterator[Any], Any, Any, dict[str, Any]]:
    """(batches, x and y to compile the step for, what the record says about the input):
    one resident synthetic batch for ever, or the Grain pipeline's batches."""
    import jax
    import jax.numpy as jnp

    if data is None:
        x, y = synthetic_batch(model_spec.input_shape, model_spec.num_classes, global_batch,
                               batch)
        return itertools.repeat((x, y)), x, y, {
            "data_placement": "one synthetic global batch generated under jit into the batch "
                              "sharding; no host copy per step"}
    from runners.jax_data import device_batches

    size = model_spec.input_shape[0]
    batches, line = device_batches(data, size, global_batch, batch)
    x = jax.ShapeDtypeStruct((global_batch, *model_spec.input_shape), jnp.float32,
                             sharding=batch)
    y = jax.ShapeDtypeStruct((global_batch,), jnp.int32, sharding=batch)
    return batches, x, y, {**describe(data, size), "input_pipeline": line,
                           "data_placement": "a host batch per step from the Grain workers, "
                                             "device_put into the batch sharding"}


def benchmark(spec: Spec) -> dict[str, Any]:
    devices, described = setup_devices(spec)
    import jax.numpy as jnp
    import optax

    from models.flax_common import count_flops_flax, count_params_flax

    n, global_batch = len(devices), spec["global_batch_size"]
    if global_batch % n:
        raise Invalid(f"global batch {global_batch} does not divide by {n} devices")
    dtype = {"fp32": None, "bf16": jnp.bfloat16}[spec["precision"]]
    model_spec = get_spec(spec["model"])
    data = real_dataset(spec, model_spec)
    model = load_builder(spec["model"], "flax")(model_spec, dtype=dtype)
    replicated, batch = make_shardings(devices)
    variables = init_variables(model, model_spec.input_shape)
    params = count_params_flax(variables)
    state = create_state(model, variables, optax.sgd(0.01, momentum=0.9), replicated)
    del variables
    batches, x, y, input_record = input_batches(data, model_spec, global_batch, batch)
    try:
        step, collectives = compile_step(make_train_step(replicated, batch), state, x, y)
        for _ in range(spec["warmup_steps"]):
            state, loss = step(state, *next(batches))
            finite(loss.block_until_ready())
        start = int(state.step)
        timer, losses, first_labels = StepTimer(), [], None
        timer.start()
        for _ in range(spec["measure_steps"]):
            x, y = next(batches)
            state, loss = step(state, x, y)
            loss.block_until_ready()  # every device's copy: the step has finished everywhere
            timer.tick()
            losses.append(finite(loss))
            if first_labels is None:
                first_labels = y
    finally:
        if data is not None:
            batches.close()  # the Grain workers
    if not losses:
        raise Invalid("measure_steps is 0: nothing was timed")
    steps = int(state.step) - start
    framework, extra = framework_versions(*VERSIONS), {}
    if data is not None:
        from runners.jax_data import grain_version

        framework.update(grain_version())
        extra = {"first_timed_labels": host_labels(first_labels)}
    return {
        **timer.summary(global_batch, steps * global_batch),
        "first_loss": losses[0],
        "last_loss": losses[-1],
        "loss_kind": "global mean cross-entropy of each step's batch",
        "replicas": n,
        "framework": framework,
        "devices": described,
        "layout": "channels_last",
        "dtype": "float32" if dtype is None else "bfloat16 compute, float32 params",
        "shardings": {"params": sharding_record(replicated), "batch": sharding_record(batch),
                      "per_device_batch": global_batch // n},
        "collectives": collectives,
        "batchnorm": "global-batch statistics (XLA all-reduces the mean and variance)",
        **input_record,
        **extra,
        "params": params,
        "flops_per_sample": count_flops_flax(model, model_spec.input_shape),
    }


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step on the probe model, the batch sharded over the devices; weights saved."""
    devices, described = setup_devices(spec)
    import jax
    import optax

    from models.flax_common import get_canonical_weights, set_canonical_weights

    weights, x, y, lr = load_equivalence_inputs(spec)
    n = len(devices)
    if len(x) % n:
        raise Invalid(f"equivalence batch {len(x)} does not divide by {n} devices")
    model_spec = get_spec("probe")
    model = load_builder("probe", "flax")(model_spec)
    variables = set_canonical_weights(init_variables(model, model_spec.input_shape), weights)
    replicated, batch = make_shardings(devices)
    state = create_state(model, variables, optax.sgd(lr), replicated)
    xs, ys = jax.device_put(x, batch), jax.device_put(y, batch)  # inputs come NHWC
    shard_rows = sorted(s.data.shape[0] for s in xs.addressable_shards)
    if shard_rows != [len(x) // n] * n:
        raise Invalid(f"batch of {len(x)} was not split evenly over {n} devices: {shard_rows}")
    state, loss = make_train_step(replicated, batch)(state, xs, ys)
    finite(loss.block_until_ready())
    save_equivalence_output(spec, get_canonical_weights({"params": state.params}))
    return {"replicas": n, "framework": framework_versions(*VERSIONS), "devices": described,
            "loss": float(loss), "batch_sharding": sharding_record(xs.sharding),
            "rows_per_device": shard_rows}


if __name__ == "__main__":
    main(benchmark, equivalence)
