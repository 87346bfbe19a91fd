"""Keras 3 on JAX, data parallel with keras.distribution.DataParallel, trained with model.fit.

Split: DataParallel puts the N devices on a 1-D mesh (axis "batch"); set before the model is
built, it creates every variable replicated on all N devices, and the jax trainer lays each
input batch out sharded along axis 0 (B/N rows per device) before the jitted train step.
Reduce: Keras jits its train step over the global batch with the variables' shardings as
out_shardings; the loss is the mean over all B rows, and XLA's SPMD partitioner inserts the
all-reduces of the gradients (and of the loss) itself, as in jax_native. Synchronise: each
device applies the same all-reduced update inside that one program (synchronous SGD).
BatchNorm: as in jax_native, the layer's batch moments are reductions over the sharded axis,
so XLA all-reduces them and the statistics are over the whole global batch (sync BatchNorm),
not per device as under tf.distribute.MirroredStrategy.

Input: fit takes a Python generator that yields one synthetic global batch, made once on the
devices in the layout DataParallel gives a batch (DataParallel.get_data_layout). Keras' jax
epoch iterator hands every batch to jax.make_array_from_process_local_data with that layout,
which in one process is a jax.device_put: a no-op for an array already laid out so, a
host-to-device copy on every step (and, under a distribution, with no look-ahead) for numpy
arrays. The resident batch is what tf_mirrored's prefetched tf.data batch and jax_native's
batch are, so the runners compare the training step, not the host copy.
Real data (data: real), option `loader`: "framework" (default) feeds fit, through the same kind
of generator, the Grain pipeline jax_native uses (runners/jax_data.py: Pillow decode in
`workers` processes, each global batch device_put into DataParallel's layout one batch ahead),
so Keras' own device_put is again a no-op; "keras" feeds fit the Keras-idiomatic PyDataset
(runners/keras_data.py, Pillow decode in `workers` processes of Keras' OrderedEnqueuer), whose
numpy batches Keras copies to the devices itself on every step.

Timing: a callback reads the clock at the end of each measured batch after waiting for the
step on every device. Keras hands callbacks the loss already converted to a float, and that
conversion of a replicated jax.Array reads device 0's copy only; so the callback also blocks
on the step's new optimizer step counter (replicated) in the trainer's live state. Samples are
counted from model.optimizer.iterations: its live value when the window opens, its value after
fit. Reading the model's variables in the middle of fit would make Keras write its whole
state back to them (jax_state_sync), so the callback reads the trainer's state directly.
Precision: bf16 is Keras' mixed_bfloat16 policy (float32 variables, bfloat16 compute).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from models import get_spec, load_builder
from runners.common import (
    Invalid,
    Spec,
    StepTimer,
    Unavailable,
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
    import keras

POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16"}


def import_keras() -> Any:
    """Keras with the jax backend (Keras reads its backend once, at import)."""
    os.environ["KERAS_BACKEND"] = "jax"
    import keras

    if keras.backend.backend() != "jax":
        raise Unavailable(f"keras {keras.__version__} loaded the {keras.backend.backend()} "
                          "backend, not jax (was keras imported before the runner?)")
    return keras


def make_distribution(spec: Spec) -> tuple[Any, Any, list[dict[str, Any]]]:
    """(keras, DataParallel over the run's devices, device descriptions); the distribution is
    set globally, so variables created from here on are replicated over the devices."""
    devices, described = setup_devices(spec)
    keras = import_keras()
    distribution = keras.distribution.DataParallel(devices=devices)
    keras.distribution.set_distribution(distribution)
    return keras, distribution, described


def batch_sharding(distribution: Any, shape: tuple[int, ...]) -> Any:
    """The jax sharding DataParallel gives an input batch of this shape."""
    return distribution.get_data_layout(shape).backend_layout


def make_clock(warmup: int) -> keras.callbacks.Callback:
    """A callback marking the timed window of fit, synchronised on every device per step."""
    import jax

    keras = import_keras()

    class JaxFitClock(keras.callbacks.Callback):
        """Clock readings after each measured step has finished on every device."""

        def __init__(self) -> None:
            super().__init__()
            self.timer, self.losses = StepTimer(), []
            self.start_iteration: int | None = None
            self._counter = 0

        def on_train_begin(self, logs: dict | None = None) -> None:
            # self._model, not self.model: the property syncs the jax state into the variables
            optimizer = self._model.optimizer
            self._counter = next(i for i, v in enumerate(optimizer.variables)
                                 if v is optimizer.iterations)

        def _live_iterations(self) -> jax.Array:
            """The step counter in the state the last step returned (not yet in the variables)."""
            state = getattr(self._model, "_jax_state", None)
            if not state:
                raise RuntimeError(f"keras {keras.__version__}'s jax trainer exposes no "
                                   "_jax_state to wait on")
            return state["optimizer_variables"][self._counter]

        def _start(self, iteration: int) -> None:
            self.start_iteration = iteration
            self.timer.start()

        def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
            if warmup == 0 and batch == 0:  # before the first step the variables hold the state
                self._start(int(self._model.optimizer.iterations.numpy()))

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            counter = self._live_iterations().block_until_ready()  # every device's copy
            loss = float((logs or {})["loss"])
            done = batch + 1
            if done == warmup:
                self._start(int(counter))
            elif done > warmup:
                self.timer.tick()
                self.losses.append(loss)

    return JaxFitClock()


def resident_batches(x: Any, y: Any) -> Any:
    """The same (images, labels) global batch for ever."""
    while True:
        yield x, y


def noting_labels(batches: Iterator[Any], index: int, noted: list[Any]) -> Iterator[Any]:
    """The batches unchanged; batch `index`'s labels (the first timed step's) go to `noted`."""
    for i, (x, y) in enumerate(batches):
        if i == index:
            noted.append(y)
        yield x, y


def timed_fit(spec: Spec, model: keras.Model, data: Any) -> dict[str, Any]:
    """model.fit for warmup + measure steps: the timing summary, samples counted from the
    optimizer's step counter, and the losses."""
    warmup, measure = spec["warmup_steps"], spec["measure_steps"]
    clock = make_clock(warmup)
    model.fit(data, epochs=1, steps_per_epoch=warmup + measure, callbacks=[clock], verbose=0,
              shuffle=False)
    if not clock.losses or clock.start_iteration is None:
        raise Invalid("no measured step reported a loss")
    steps = int(model.optimizer.iterations.numpy()) - clock.start_iteration
    global_batch = spec["global_batch_size"]
    return {
        **clock.timer.summary(global_batch, steps * global_batch),
        "first_loss": finite(clock.losses[0]),
        "last_loss": finite(clock.losses[-1]),
        "loss_kind": "Keras running mean over the epoch (warm-up steps included)",
    }


def distribution_record(distribution: Any, sharding: Any, shape: tuple[int, ...]
                        ) -> dict[str, Any]:
    """The mesh, and where the variables and the batch (of this shape) live."""
    mesh = distribution.device_mesh
    return {
        "distribution": type(distribution).__name__,
        "mesh": dict(zip(mesh.axis_names, mesh.shape, strict=True)),
        "batch": sharding_record(sharding),
        "per_device_batch": sharding.shard_shape(shape)[0],
    }


SYNTHETIC_PLACEMENT = ("one synthetic global batch generated on the devices in DataParallel's "
                       "batch layout, yielded by a generator; Keras' device_put of it is a "
                       "no-op, no host copy per step")
GRAIN_PLACEMENT = ("Grain's batches device_put into DataParallel's batch layout one batch "
                   "ahead, yielded by a generator; Keras' device_put of them is a no-op")
PYDATASET_PLACEMENT = ("numpy batches from the PyDataset's workers; Keras' jax trainer "
                       "device_puts each into DataParallel's batch layout (no look-ahead under "
                       "a distribution)")


def fit_input(spec: Spec, data: RealData | None, model_spec: Any, shardings: tuple[Any, Any],
              noted: list[Any]) -> tuple[Any, dict[str, Any], Any]:
    """(what fit is given, what the record says about the input, the iterator to close or
    None) for synthetic data, the Grain pipeline or the Keras PyDataset."""
    global_batch = spec["global_batch_size"]
    if data is None:
        x, y = synthetic_batch(model_spec.input_shape, model_spec.num_classes, global_batch,
                               *shardings)
        return resident_batches(x, y), {"data_placement": SYNTHETIC_PLACEMENT}, None
    size = model_spec.input_shape[0]
    loader = spec["options"].get("loader", "framework")
    record = {**describe(data, size), "loader": loader}
    if loader == "keras":
        from runners.keras_data import describe_keras, jpeg_sequence

        steps = spec["warmup_steps"] + spec["measure_steps"]
        return jpeg_sequence(data, size, global_batch, steps), {
            **record, "input_pipeline": describe_keras(data),
            "data_placement": PYDATASET_PLACEMENT}, None
    from runners.jax_data import device_batches

    batches, line = device_batches(data, size, global_batch, *shardings)
    return noting_labels(batches, spec["warmup_steps"], noted), {
        **record, "input_pipeline": line, "data_placement": GRAIN_PLACEMENT}, batches


def benchmark(spec: Spec) -> dict[str, Any]:
    keras, distribution, described = make_distribution(spec)
    n, global_batch = distribution.device_mesh.devices.size, spec["global_batch_size"]
    if global_batch % n:
        raise Invalid(f"global batch {global_batch} does not divide by {n} devices")
    policy = POLICIES[spec["precision"]]
    keras.mixed_precision.set_global_policy(policy)
    model_spec = get_spec(spec["model"])
    data = real_dataset(spec, model_spec)
    model = load_builder(spec["model"], "keras")(model_spec, data_format="channels_last")
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.01, momentum=0.9),
                  loss="sparse_categorical_crossentropy")
    shape = (global_batch, *model_spec.input_shape)
    shardings = (batch_sharding(distribution, shape),
                 batch_sharding(distribution, (global_batch,)))
    noted: list[Any] = []
    feed, input_record, owner = fit_input(spec, data, model_spec, shardings, noted)
    try:
        timing = timed_fit(spec, model, feed)
    finally:
        if owner is not None:
            owner.close()  # the Grain workers
    kernel = next(v for v in model.trainable_variables if v.path.endswith("kernel"))
    params, flops = keras_counts(model)
    framework = framework_versions("keras")
    if owner is not None:
        from runners.jax_data import grain_version

        framework.update(grain_version())
        input_record["first_timed_labels"] = host_labels(noted[0])
    return {
        **timing,
        "replicas": n,
        "framework": framework,
        "devices": described,
        "layout": "channels_last",
        "dtype_policy": policy,
        "xla": True,  # the jax trainer always jits its step
        "shardings": {**distribution_record(distribution, shardings[0], shape),
                      "variables": sharding_record(kernel.value.sharding)},
        "batchnorm": "global-batch statistics (XLA all-reduces the moments)",
        **input_record,
        "params": params,
        "flops_per_sample": flops,
    }


def keras_counts(model: keras.Model) -> tuple[int, int]:
    """(parameters, forward FLOPs per sample) as models.keras_common counts them."""
    from models.keras_common import count_flops_keras, count_params_keras

    return count_params_keras(model), count_flops_keras(model)


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step (train_on_batch) on the probe model, the batch distributed by
    DataParallel over the devices; weights saved after."""
    keras, distribution, described = make_distribution(spec)
    from models.keras_common import get_canonical_weights, set_canonical_weights

    weights, x, y, lr = load_equivalence_inputs(spec)
    n = distribution.device_mesh.devices.size
    if len(x) % n:
        raise Invalid(f"equivalence batch {len(x)} does not divide by {n} devices")
    model = load_builder("probe", "keras")(get_spec("probe"))
    set_canonical_weights(model, weights)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=lr),
                  loss="sparse_categorical_crossentropy")
    loss = model.train_on_batch(x, y)  # numpy in: Keras lays it out over the devices
    finite(loss)
    save_equivalence_output(spec, get_canonical_weights(model))
    layout = batch_sharding(distribution, x.shape)
    return {"replicas": n, "framework": framework_versions("keras"), "devices": described,
            "loss": float(loss), "batch_sharding": sharding_record(layout),
            "rows_per_device": layout.shard_shape(x.shape)[0]}


if __name__ == "__main__":
    main(benchmark, equivalence)
