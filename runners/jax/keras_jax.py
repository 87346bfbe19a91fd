"""Keras 3 on JAX, data parallel with keras.distribution.DataParallel, trained with model.fit
(keras 3.15.1, jax 0.10.2), as Keras' distribution guide does it.

Split: DataParallel puts the N devices on a 1-D mesh (axis "batch"); set before the model is
built, it creates every variable replicated on all N devices, and the jax trainer lays each
input batch out sharded along axis 0 (B/N rows per device) before the jitted train step.
Reduce: Keras jits its train step over the global batch with the variables' shardings as
out_shardings; the loss is the mean over all B rows, and XLA's SPMD partitioner inserts the
all-reduces of the gradients (and of the loss) itself. Synchronise: each device applies the
same all-reduced update inside that one program (synchronous SGD).

Input, option `input`:
  numpy (default, what a Keras user hands fit): synthetic data is a numpy dataset in host memory
  (random images and labels, K global batches, K = warmup + measure steps or as many as fit in
  min(2 GiB, a quarter of the free memory), the epochs repeating it) given to
  fit(x, y, batch_size=B, shuffle=True); real data is the loader's numpy batches (`loader`
  framework: the Grain pipeline's host batches through a generator; keras: the PyDataset).
  Keras' jax epoch iterator hands every batch to jax.make_array_from_process_local_data with
  DataParallel's layout: a host-to-device copy on every step, with no look-ahead under a
  distribution (Keras 3.15's _get_distributed_iterator), as a Keras user gets.
  preplaced (the pre-2026 path): fit takes a generator of batches already in DataParallel's
  layout (DataParallel.get_data_layout): one synthetic global batch made once on the devices,
  or the Grain pipeline's batches device_put there one batch ahead (runners/jax/data.py);
  Keras' device_put of them is a no-op, so the runner measures the training step alone, as
  jax_native and tf_mirrored's prefetched batches do. Not available with loader: keras.
Placement (`placement`): the rows on each device of the batch Keras' trainer passed to its
jitted train step at the first timed step, read from that jax.Array's addressable_shards (the
runner wraps model.train_function to look at what Keras distributed; nothing is derived from
the mesh it configured).

BatchNorm, option `batchnorm`:
  global: Keras' own BatchNormalization. Under DataParallel's global-view jit its batch moments
  are reductions over the sharded axis, so XLA all-reduces them: statistics over the whole
  global batch (sync BatchNorm). Keras 3 has no per-replica BatchNorm on JAX
  (BatchNormalization(synchronized=...) acts on the TensorFlow backend only).
  per_device (default, as MirroredStrategy, DDP and the other runners normalise): what a Keras
  user on JAX must write to get it, since Keras offers none: the model is cloned
  (keras.models.clone_model, weights copied) with every BatchNormalization replaced by a
  subclass whose training call computes the moments and normalises under jax.shard_map over
  DataParallel's mesh, so each device uses its own B/N rows; inference and the variables are
  Keras' own. Its moving mean and variance are updated with the mean over devices of the
  per-device moments: the update being linear, this equals the mean of N per-device running
  statistics, which is what MirroredStrategy users read from Keras' SyncOnRead (MEAN)
  BatchNormalization variables (DDP instead keeps rank 0's buffers).

Timing: a callback reads the clock at the end of each measured batch after waiting for the
step on every device. Keras hands callbacks the loss already converted to a float, and that
conversion of a replicated jax.Array reads device 0's copy only; so the callback also blocks
on the step's new optimizer step counter (replicated) in the trainer's live state, and stops
fit after warmup + measure steps. Samples are counted from model.optimizer.iterations: its live
value when the window opens, its value after fit. Reading the model's variables in the middle
of fit would make Keras write its whole state back to them (jax_state_sync), so the callback
reads the trainer's state directly. With numpy input the window may span epochs (when K is
smaller than the steps): Keras' end-of-epoch work (its state sync) is then timed, as a user
pays it, but not the first step of the second epoch: Keras' jax trainer compiles its train
step again there (once; seen on an H100 as a 9.4 s step in a 100-step ResNet-50 window, halving
images/sec, and as a 17 s step on CPU), a start-up cost like the first compile. The warm-up then
runs to that step (`warmup_steps_run`, `warmup_extended` in the result).
Precision: bf16 is Keras' mixed_bfloat16 policy (float32 variables, bfloat16 compute).
State (`state_bytes_per_device`, issue 27; runners/jax/state.py): after fit, each trainable and
optimizer variable's jax Array addressable_shards per device (DataParallel: a full replica on
each), and the gradients from one untimed jitted jax.value_and_grad of the model's
compute_loss_and_updates (what Keras' train_step differentiates); `precision_policy` from the
dtype policy, the variables' dtype and that gradient function's all-reduce dtypes. benchmark
and equivalence take another distribution (keras_model_parallel's ModelParallel).

Models (issue 26): the run's model is models.build_for(spec, "keras"): a built-in CNN (a float32
softmax: Keras' sparse cross-entropy on its probabilities, as before), a built-in transformer
(gpt2, vit_b16 and their tiny versions: models/transformer_keras.py, float32 logits) or a
user's Keras model (logits; checked to be a keras.Model with the entry's output shape, Invalid
otherwise, and described by models.keras_common.describe). Transformers and users' models
train on SparseCategoricalCrossentropy(from_logits=True). A token model (int32 ids (B, T) in,
next-token logits (B, T, V) out) takes random ids (B, T + 1) in [0, V): with input numpy a host
array of K global batches as the images are, with preplaced one global batch made by a jitted
function in DataParallel's layout; inputs ids[:, :-1], targets ids[:, 1:], the loss the mean
over all B x T positions; real data is unavailable (the prepared datasets are images). A model
without BatchNormalization is trained as built (per_device has nothing to swap; the record
says so); a user's model with BatchNormalization that clone_model cannot clone (subclassed)
is Invalid under per_device. The result adds flops_source, tokens_per_sample and workload:
params counted by Keras, flops_per_sample a transformer's standard count (its spec), a user's
model's XLA cost analysis (describe), a CNN's Conv2D and Dense count.
Equivalence mode runs the same path: the same `input` and `batchnorm`, one step of fit with
plain SGD on the probe model, placement read the same way.

Across nodes (spec.num_nodes > 1, issue 16; keras 3.15.1 on jax 0.10.2), as Keras' distribution
guide trains on several hosts: keras.distribution.initialize() with no arguments, which on the
jax backend calls jax.distributed.initialize() the same way, so JAX's SlurmCluster
auto-detection reads SLURM's variables (runners/jax/common.py: what it reads, the gloo CPU
collectives and the coordinator port the runner sets), then agrees on one random seed over the
processes; then DataParallel over jax.devices(), the devices of every process, with
auto_shard_dataset=False (Keras auto-shards tf.data only). With input numpy each process hands
fit its own rows: its share of every global batch (B/P rows, batch_size B/P, a seed of its own;
the host batches K are the smallest over the processes, so that every process runs the same
steps), and Keras' jax trainer makes each global batch from the processes' rows with
jax.make_array_from_process_local_data; the equivalence batch is split the same way, process p
feeding rows p x B/P onwards. input: preplaced and real data cannot run across nodes here
(MULTI_NODE_PREPLACED, MULTI_NODE_REAL_DATA). The placement probe's rows per device are
gathered from every process through JAX (keys "cpu:2048 (process 1)"); the result adds `nodes`
and `multi_node` (common.close_multihost, plus what DataParallel says of the processes) and
only process 0 writes it. What differs from a real cluster: tools/local_slurm.sh's two nodes are
one 2-core machine (gloo over loopback, shared cores: its images/sec say nothing of a
cluster's); the GPU path (NCCL between nodes) is untested.
Mode converge (`converge`, runners/converge.py's recipe and loop), as a Keras user trains: the
benchmark's model (build_model: the same builder, dtype policy and `batchnorm` swap; weights
seeded by keras.utils.set_random_seed(recipe.seed) before it is built) under the same
DataParallel, compiled with keras.optimizers.SGD(momentum) and the benchmark's loss, and trained
by one model.fit call per epoch (epochs=epoch + 1, initial_epoch=epoch, shuffle=False) on that
epoch's batches in the recipe's order: with input numpy (default) the batches concatenated into
host arrays with batch_size = the global batch (Keras slices exactly the recipe's batches, a kept
short one last, and lays each out over the devices itself); with input preplaced a generator of
the batches device_put into DataParallel's layout. The learning rate is set per step by a
callback assigning model.optimizer.learning_rate = lr_at(step) in on_train_batch_begin; on the
jax backend the callback's `self.model` writes Keras' live jax state back into the variables
first (jax_state_sync) and the trainer reads the state back from them before the step, so the
new rate is in the step's state (a Keras 3 user's per-step schedule costs that sync every step).
The epoch's train loss is fit's history "loss": Keras' mean over the epoch's batches weighted by
their rows (a kept short batch weighs less than in the other runners' plain mean of steps).
evaluate is model.predict (training=False: BatchNorm's moving statistics, no dropout) on the
held-out split padded to equal chunks whose rows divide over the devices, the padding's rows
dropped, top-1 from the argmax; moving_stats reads every BatchNormalization layer's
moving_mean and moving_variance variables after fit. The placement is the rows per device of
every batch Keras' trainer passed its jitted step in the first epoch (its train function
wrapped, as in the benchmark), which add up to the epoch's training rows. What differs: SGD's
weight_decay is Keras' own (the variable shrunk by lr x decay x value after each update, not
added to the gradient before the momentum as in torch.optim.SGD; the recipe's default 0 makes
them equal); a kept short batch whose rows do not divide over the devices, and runs across
nodes, are unavailable.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from models import get_spec, load_builder, spec_of
from models.custom import CustomModelError
from runners.common import Invalid, Spec, TimedWindow, Unavailable, finite, main, one_line
from runners.jax.common import (
    MECHANISM,
    agreed_min,
    all_placement,
    close_multihost,
    framework_versions,
    host_labels,
    placement,
    real_dataset,
    setup_devices,
    sharding_record,
    synthetic_batch,
)
from runners.jax.state import keras_state
from runners.memory import model_state_keras
from runners.real_data import RealData, describe

if TYPE_CHECKING:
    import keras

POLICIES = {"fp32": "float32", "tf32": "float32", "bf16": "mixed_bfloat16"}


def import_keras() -> Any:
    """Keras with the jax backend (Keras reads its backend once, at import)."""
    os.environ["KERAS_BACKEND"] = "jax"
    import keras

    if keras.backend.backend() != "jax":
        raise Unavailable(f"keras {keras.__version__} loaded the {keras.backend.backend()} "
                          "backend, not jax (was keras imported before the runner?)")
    return keras


KERAS_MECHANISM = f"keras.distribution.initialize -> {MECHANISM}"


def keras_initialize() -> None:
    """Keras' own multi-host start, keras.distribution.initialize() with no arguments: on the
    jax backend it calls jax.distributed.initialize() likewise (SLURM auto-detection), then
    agrees on one random seed over the processes."""
    import_keras().distribution.initialize()


def make_distribution(spec: Spec) -> tuple[Any, Any, list[dict[str, Any]]]:
    """(keras, DataParallel over the run's devices, device descriptions); the distribution is
    set globally, so variables created from here on are replicated over the devices. Across
    nodes the processes join through keras_initialize first, the devices are those of every
    process, and each process feeds its own rows (auto_shard_dataset=False: Keras' auto-sharding
    takes tf.data only)."""
    devices, described = setup_devices(spec, keras_initialize if spec.num_nodes > 1 else None)
    keras = import_keras()
    if spec.num_nodes > 1:
        distribution = keras.distribution.DataParallel(devices=devices,
                                                       auto_shard_dataset=False)
    else:
        distribution = keras.distribution.DataParallel(devices=devices)
    keras.distribution.set_distribution(distribution)
    return keras, distribution, described


def batch_sharding(distribution: Any, shape: tuple[int, ...]) -> Any:
    """The jax sharding DataParallel gives an input batch of this shape."""
    return distribution.get_data_layout(shape).backend_layout


def make_clock(warmup: int, measure: int, on_begin: Callable[[Any], None]
               ) -> keras.callbacks.Callback:
    """A callback marking the timed window of fit, synchronised on every device per step; it
    stops fit after warmup + measure steps (counted over epochs), and hands the model to
    `on_begin` when training begins (fit has made its train function by then)."""
    import jax

    keras = import_keras()

    class JaxFitClock(keras.callbacks.Callback):
        """Clock readings (its TimedWindow, `window`) after each measured step has finished on
        every device; `start_iteration`: the optimizer's step counter when the clock started."""

        def __init__(self) -> None:
            super().__init__()
            self.window = TimedWindow(warmup, measure, on_start=self._read_iteration)
            self.start_iteration: int | None = None
            self._counter = 0
            self._live: jax.Array | None = None  # the counter after the last step, ready

        def on_train_begin(self, logs: dict | None = None) -> None:
            # self._model, not self.model: the property syncs the jax state into the variables
            optimizer = self._model.optimizer
            self._counter = next(i for i, v in enumerate(optimizer.variables)
                                 if v is optimizer.iterations)
            on_begin(self._model)

        def _live_iterations(self) -> jax.Array:
            """The step counter in the state the last step returned (not yet in the variables)."""
            state = getattr(self._model, "_jax_state", None)
            if not state:
                raise RuntimeError(f"keras {keras.__version__}'s jax trainer exposes no "
                                   "_jax_state to wait on")
            return state["optimizer_variables"][self._counter]

        def _read_iteration(self) -> None:
            # before the first step the variables hold the counter; after one, the live state
            self.start_iteration = int(self._model.optimizer.iterations.numpy()
                                       if self._live is None else self._live)

        def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
            if warmup == 0 and not self.window.started:
                self.window.start()

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            self._live = self._live_iterations().block_until_ready()  # every device's copy
            self.window.step_done((logs or {})["loss"])
            if self.window.done:
                self._model.stop_training = True

    return JaxFitClock()


class BatchPlacement:
    """Wraps model.train_function (Keras' step over its epoch iterator; fit looks it up at every
    step) to read where the batch Keras passes its jitted step at call `index` lies:
    {device: rows} from the jax.Array. install(model) once fit has made the function."""

    def __init__(self, index: int) -> None:
        self.index, self.placement, self.sharding, self._calls = index, None, None, 0

    def install(self, model: keras.Model) -> None:
        inner, index = model.train_function, self.index

        def observed(state: Any, iterator: Iterator[Any]) -> Any:
            if self._calls == index:
                data = next(iterator)
                x = data[0]  # (x, y[, sample_weight]) as Keras' trainer distributed it
                self.placement, self.sharding = placement(x), sharding_record(x.sharding)
                iterator = iter((data,))
            self._calls += 1
            return inner(state, iterator)

        model.train_function = observed


PLACEMENT_SOURCE = ("rows per device of the batch Keras' trainer passed its jitted train step "
                    "at the first timed step, from that jax.Array's addressable_shards")


def resident_batches(x: Any, y: Any) -> Any:
    """The same (images, labels) global batch for ever."""
    while True:
        yield x, y


def preplaced(x: Any, y: Any, steps: int) -> dict[str, Any]:
    """fit's data arguments for one global batch already on the devices in DataParallel's
    layout, yielded for ever, `steps` per epoch."""
    return {"x": resident_batches(x, y), "steps_per_epoch": steps}


def noting_labels(batches: Iterator[Any], index: int, noted: list[Any]) -> Iterator[Any]:
    """The batches unchanged; batch `index`'s labels (the first timed step's) go to `noted`."""
    for i, (x, y) in enumerate(batches):
        if i == index:
            noted.append(y)
        yield x, y


def fit_steps(spec: Spec, model: keras.Model, feed: dict[str, Any], warmup: int | None = None
              ) -> tuple[Any, Any]:
    """model.fit(**feed) for warmup + measure steps with the clock and the placement probe."""
    warmup = spec.warmup_steps if warmup is None else warmup
    measure = spec.measure_steps
    probe = BatchPlacement(warmup)
    clock = make_clock(warmup, measure, probe.install)
    model.fit(**feed, callbacks=[clock], verbose=0)
    return clock, probe


def fit_one_step(spec: Spec, model: keras.Model, feed: dict[str, Any]
                 ) -> tuple[float, BatchPlacement]:
    """model.fit(**feed) for exactly one step (the equivalence step), checked by the
    optimizer's step counter: its loss and the placement probe of its batch."""
    clock, probe = fit_steps(replace(spec, warmup_steps=0, measure_steps=1), model, feed)
    if int(model.optimizer.iterations.numpy()) != 1 or probe.placement is None:
        raise Invalid("fit did not run exactly one step")
    return finite(clock.window.losses[0]), probe


def timed_fit(spec: Spec, model: keras.Model, feed: dict[str, Any], warmup: int | None = None
              ) -> dict[str, Any]:
    """model.fit for warmup + measure steps: the timing summary, samples counted from the
    optimizer's step counter, the losses and the placement of the first timed batch."""
    clock, probe = fit_steps(spec, model, feed, warmup)
    if not clock.window.losses or clock.start_iteration is None or probe.placement is None:
        raise Invalid("no measured step reported a loss")
    steps = int(model.optimizer.iterations.numpy()) - clock.start_iteration
    global_batch = spec.global_batch_size
    return {
        **clock.window.summary(global_batch, steps * global_batch),
        "loss_kind": "Keras running mean over the epoch (warm-up steps included)",
        "placement": probe.placement,
        "placement_source": PLACEMENT_SOURCE,
        "fed_batch_sharding": probe.sharding,
    }


def distribution_record(distribution: Any, sharding: Any, shape: tuple[int, ...]
                        ) -> dict[str, Any]:
    """The mesh, and where DataParallel lays out the batch (of this shape)."""
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
ARRAYS_PLACEMENT = ("numpy arrays in host memory given to fit with batch_size; Keras slices "
                    "each batch and lays it out over the devices itself (a host-to-device copy "
                    "per step, no look-ahead under a distribution)")
ARRAYS_PLACEMENT_PROCESSES = (
    "each process's own numpy arrays in its host memory (its share of every global batch) "
    "given to fit with batch_size = its rows; Keras' jax trainer makes each global batch with "
    "jax.make_array_from_process_local_data over DataParallel's layout (a host-to-device copy "
    "per step, no look-ahead under a distribution)")
MULTI_NODE_PREPLACED = (
    "input: preplaced across nodes: Keras 3.15's jax trainer hands every batch to "
    "jax.make_array_from_process_local_data as this process's rows, so a global batch already "
    "on every process's devices cannot pass through fit unchanged; use input: numpy")
MULTI_NODE_REAL_DATA = (
    "data: real across nodes: the Grain pipeline and the PyDataset make whole global batches "
    "(runners/jax/data.py, runners/keras_data.py), so every process would decode all of each "
    "batch; a per-process shard of the file stream is not built yet")
GRAIN_PLACEMENT = ("Grain's batches device_put into DataParallel's batch layout one batch "
                   "ahead, yielded by a generator; Keras' device_put of them is a no-op")
GRAIN_HOST_PLACEMENT = ("Grain's numpy batches yielded by a generator to fit; Keras lays each "
                        "out over the devices itself (no look-ahead under a distribution)")
GRAIN_HOST_LINE = "numpy batches to Keras fit, which lays each out over the devices itself"
PYDATASET_PLACEMENT = ("numpy batches from the PyDataset's workers; Keras' jax trainer "
                       "device_puts each into DataParallel's batch layout (no look-ahead under "
                       "a distribution)")
INPUTS = ("numpy", "preplaced")
TOKENS_REAL = ("data real: the prepared datasets are images; a token model trains on synthetic "
               "tokens")
HOST_DATA_CAP = 2 << 30  # bytes of synthetic numpy data at most


def warmup_past_recompile(warmup: int, measure: int, epoch_batches: int) -> int:
    """The warm-up steps that keep the first step of the second epoch (where Keras' jax trainer
    compiles its step again) out of the timed window: `warmup`, unless the window would hold
    that step; then up to and including it."""
    if epoch_batches >= warmup + measure or warmup > epoch_batches:
        return warmup
    return epoch_batches + 1


def host_dataset(model_spec: Any, global_batch: int, steps: int, processes: int = 1
                 ) -> dict[str, Any]:
    """The synthetic numpy dataset a Keras user would hand fit: K global batches of random
    images and labels (K = steps, or as many as fit the memory cap), and fit's batch_size and
    shuffle (fit_input sets the epochs, from the warm-up it settles on). Across `processes`
    (a multi-node run) each holds its own rows of every batch (its share, a seed of its own)
    and K is the smallest over the processes, so that every process runs the same steps."""
    import numpy as np

    batch = global_batch // processes
    tokens = model_spec.input_kind == "tokens"
    sample = model_spec.input_shape[0] + 1 if tokens else int(np.prod(model_spec.input_shape))
    batch_bytes = batch * sample * 4
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    k = max(1, min(steps, min(HOST_DATA_CAP, free // 4) // batch_bytes))
    seed = 0
    if processes > 1:
        import jax

        k, seed = agreed_min(k), jax.process_index()
    rng = np.random.default_rng(seed)
    if tokens:  # ids (rows, T + 1): inputs ids[:, :-1], next-token targets ids[:, 1:]
        ids = rng.integers(0, model_spec.num_classes, (k * batch, sample), dtype=np.int32)
        return {"x": ids[:, :-1], "y": ids[:, 1:], "batch_size": batch, "shuffle": True}
    x = rng.standard_normal((k * batch, *model_spec.input_shape), dtype=np.float32)
    y = rng.integers(0, model_spec.num_classes, k * batch, dtype=np.int32)
    return {"x": x, "y": y, "batch_size": batch, "shuffle": True}


def synthetic_tokens(seq_len: int, vocab: int, batch: int, sharding: Any) -> tuple[Any, Any]:
    """One random global batch of token ids, generated by a jitted function straight into
    DataParallel's layout (as common.synthetic_batch makes images): ids (batch, seq_len + 1) in
    [0, vocab), inputs ids[:, :-1] and next-token targets ids[:, 1:], int32, each (batch,
    seq_len) sharded along the batch."""
    import jax
    import jax.numpy as jnp

    def make() -> tuple[jax.Array, jax.Array]:
        ids = jax.random.randint(jax.random.key(0), (batch, seq_len + 1), 0, vocab, jnp.int32)
        return ids[:, :-1], ids[:, 1:]

    return jax.block_until_ready(jax.jit(make, out_shardings=(sharding, sharding))())


def device_batch(model_spec: Any, global_batch: int, shardings: tuple[Any, Any]
                 ) -> tuple[Any, Any]:
    """One synthetic global batch made on the devices in the distribution's layout (`shardings`:
    the inputs', the labels'): token ids and their next tokens, or images and labels."""
    if model_spec.input_kind == "tokens":
        return synthetic_tokens(model_spec.input_shape[0], model_spec.num_classes, global_batch,
                                shardings[1])
    return synthetic_batch(model_spec.input_shape, model_spec.num_classes, global_batch,
                           *shardings)


def fit_input(spec: Spec, data: RealData | None, model_spec: Any, shardings: tuple[Any, Any],
              noted: list[Any]) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """(fit's data arguments, what the record says about the input, the iterator to close or
    None) for the option `input` over synthetic data, the Grain pipeline or the PyDataset."""
    global_batch = spec.global_batch_size
    mode = spec.options["input"]
    if mode not in INPUTS:
        raise Invalid(f"input must be one of {INPUTS}, not {mode!r}")
    steps = spec.warmup_steps + spec.measure_steps
    if data is None:
        if mode == "numpy":
            feed = host_dataset(model_spec, global_batch, steps, spec.num_nodes)
            k = len(feed["x"]) // feed["batch_size"]
            warmup = warmup_past_recompile(spec.warmup_steps, spec.measure_steps, k)
            feed["epochs"] = -(-(warmup + spec.measure_steps) // k)
            record = {"input": mode, "data_placement": ARRAYS_PLACEMENT, "host_dataset": {
                "batches": k, "epochs": feed["epochs"], "shuffle": True},
                "warmup_steps_run": warmup}
            if spec.num_nodes > 1:
                record["data_placement"] = ARRAYS_PLACEMENT_PROCESSES
                record["host_dataset"]["rows_per_process"] = feed["batch_size"]
            if warmup != spec.warmup_steps:
                record["warmup_extended"] = (
                    f"{spec.warmup_steps} -> {warmup}: the host data holds {k} batches, so "
                    f"step {k + 1} opens the second epoch, where Keras' jax trainer compiles "
                    "its train step again; that step is warm-up, not timed")
            return feed, record, None
        x, y = device_batch(model_spec, global_batch, shardings)
        return preplaced(x, y, steps), {"input": mode, "data_placement": SYNTHETIC_PLACEMENT}, None
    size = model_spec.input_shape[0]
    loader = spec.options["loader"]
    record = {**describe(data, size), "loader": loader, "input": mode}
    if loader == "keras":
        if mode == "preplaced":
            raise Invalid("input: preplaced needs synthetic data or loader: framework (the "
                          "PyDataset yields numpy batches)")
        from runners.keras_data import describe_keras, jpeg_sequence

        return {"x": jpeg_sequence(data, size, global_batch, steps)}, {
            **record, "input_pipeline": describe_keras(data),
            "data_placement": PYDATASET_PLACEMENT}, None
    from runners.jax.data import device_batches, host_iterator

    if mode == "numpy":
        batches, line = host_iterator(data, size, global_batch, GRAIN_HOST_LINE)
        where = GRAIN_HOST_PLACEMENT
    else:
        batches, line = device_batches(data, size, global_batch, *shardings)
        where = GRAIN_PLACEMENT
    return {"x": noting_labels(batches, spec.warmup_steps, noted), "steps_per_epoch": steps}, {
        **record, "input_pipeline": line, "data_placement": where}, batches


def per_device_batchnorm(keras: Any, model: keras.Model) -> keras.Model:
    """The model cloned with every BatchNormalization replaced by PerDeviceBatchNormalization
    (same config, same weights); a model without BatchNorm comes back as a clone too."""
    cls = per_device_batchnorm_class(keras)

    def clone(layer: Any) -> Any:
        if type(layer) is keras.layers.BatchNormalization:
            return cls.from_config(layer.get_config())
        return layer.__class__.from_config(layer.get_config())

    clone_model = keras.models.clone_model(model, clone_function=clone)
    clone_model.set_weights(model.get_weights())
    return clone_model


def per_device_batchnorm_class(keras: Any) -> type:
    """keras.layers.BatchNormalization whose training call normalises each device's rows with
    their own moments (jax.shard_map over DataParallel's mesh, split along its batch axis) and
    updates the moving statistics with the mean over devices of those moments."""
    import jax
    from jax.sharding import PartitionSpec as P

    ops = keras.ops

    class PerDeviceBatchNormalization(keras.layers.BatchNormalization):
        def call(self, inputs: Any, training: bool | None = None, mask: Any = None) -> Any:
            distribution = keras.distribution.distribution()
            if not (training and self.trainable) or distribution is None or mask is not None \
                    or self.renorm:
                return super().call(inputs, training=training, mask=mask)
            dtype = keras.backend.result_type(inputs.dtype, "float32")  # as Keras upcasts
            x = ops.cast(inputs, dtype)
            channels = x.shape[self.axis]
            gamma = ops.cast(self.gamma, dtype) if self.scale else ops.ones((channels,), dtype)
            beta = ops.cast(self.beta, dtype) if self.center else ops.zeros((channels,), dtype)
            axes, axis, epsilon = self._reduction_axes, self.axis, self.epsilon

            def local(x: Any, gamma: Any, beta: Any) -> tuple[Any, Any, Any]:
                mean, variance = ops.moments(x, axes=axes)
                y = ops.batch_normalization(x, mean, variance, axis=axis, offset=beta,
                                            scale=gamma, epsilon=epsilon)
                return y, mean[None], variance[None]

            name = distribution.batch_dim_name
            y, means, variances = jax.shard_map(
                local, mesh=distribution.device_mesh.backend_mesh,
                in_specs=(P(name), P(), P()), out_specs=(P(name), P(name), P(name)))(
                    x, gamma, beta)
            momentum = self.momentum
            self.moving_mean.assign(ops.cast(self.moving_mean, dtype) * momentum
                                    + ops.mean(means, axis=0) * (1.0 - momentum))
            self.moving_variance.assign(ops.cast(self.moving_variance, dtype) * momentum
                                        + ops.mean(variances, axis=0) * (1.0 - momentum))
            return ops.cast(y, self.compute_dtype)

    return PerDeviceBatchNormalization


BATCHNORM_MODES = ("per_device", "global")
BATCHNORM_RECORD = {
    "per_device": "per-device statistics (BatchNormalization subclass: moments and "
                  "normalisation under shard_map over each device's B/N rows); moving "
                  "statistics updated with the mean over devices",
    "global": "global-batch statistics (Keras' BatchNormalization under DataParallel's jit: "
              "XLA all-reduces the moments)",
}


NO_BATCHNORM = "the model has no BatchNormalization layer"


def build_model(keras: Any, spec: Spec, name: str | None, **kwargs: Any
                ) -> tuple[Any, str, dict[str, Any] | None]:
    """(the Keras model, the batchnorm mode, a user's model's description or None): the model
    `name` from models/, or with name None the run's (models.build_for: a built-in, or a
    user's model checked and described, Invalid when it is wrong); per_device swaps its
    BatchNorm layers (a model without any is used as built)."""
    from models.keras_common import build_run_model, has_batchnorm

    batchnorm = spec.options.get("batchnorm", "global")  # keras_model_parallel: Keras' own
    if batchnorm not in BATCHNORM_MODES:
        raise Invalid(f"batchnorm must be one of {BATCHNORM_MODES}, not {batchnorm!r}")
    described = None
    if name is None:
        try:
            model, described = build_run_model(spec, spec_of(spec), **kwargs)
        except CustomModelError as exc:
            raise Invalid(str(exc)) from None
    else:
        model = load_builder(name, "keras")(get_spec(name), **kwargs)
    if batchnorm == "per_device" and has_batchnorm(model):
        try:
            model = per_device_batchnorm(keras, model)
        except ValueError as exc:  # clone_model takes functional and Sequential models only
            raise Invalid(f"batchnorm per_device: the model's BatchNormalization layers cannot "
                          f"be swapped ({one_line(str(exc), 160)}); batchnorm global runs "
                          "it") from None
    return model, batchnorm, described


def check_multi_node(spec: Spec) -> None:
    """Unavailable: what keras_jax cannot run across nodes (before the processes join)."""
    if spec.num_nodes == 1:
        return
    if spec.data != "synthetic":
        raise Unavailable(MULTI_NODE_REAL_DATA)
    if spec.options["input"] == "preplaced":
        raise Unavailable(MULTI_NODE_PREPLACED)


# (spec, the model's name: None for the run's, "probe") -> (keras, the distribution, set
# globally, the device descriptions)
Distribute = Callable[[Spec, "str | None"], tuple[Any, Any, list[dict[str, Any]]]]
# (the distribution, the trained model) -> record fields of the strategy's own
Describe = Callable[[Any, Any], dict[str, Any]]
STATE_SOURCE = (
    "keras on jax: each variable's jax Array (.value) addressable_shards (shard.data.nbytes per "
    "device) after fit: params the trainable variables (non-trainable ones, BatchNorm's moving "
    "statistics, not counted), optimizer state the optimizer's variables (momentum, iteration, "
    "learning rate); the gradients from one extra untimed call, after fit, of a jitted "
    "jax.value_and_grad of the model's compute_loss_and_updates (what Keras' train_step "
    "differentiates) on a synthetic batch in the distribution's layout, laid out as XLA "
    "returns them")


def data_parallel(spec: Spec, name: str | None = None) -> tuple[Any, Any, list[dict[str, Any]]]:
    """keras_jax's Distribute: make_distribution (DataParallel), whatever the model."""
    return make_distribution(spec)


def no_record(distribution: Any, model: Any) -> dict[str, Any]:
    return {}


def benchmark(spec: Spec, distribute: Distribute = data_parallel,
              describe_strategy: Describe = no_record, state_source: str = STATE_SOURCE
              ) -> dict[str, Any]:
    """The timed run under keras_jax's DataParallel, or another distribution (`distribute`:
    keras_model_parallel's ModelParallel), whose own record fields `describe_strategy` gives."""
    check_multi_node(spec)
    keras, distribution, described = distribute(spec, None)
    from models.keras_common import has_batchnorm, loss_for, model_record

    n, global_batch = distribution.device_mesh.devices.size, spec.global_batch_size
    spec.split_batch(n)
    policy = POLICIES[spec.precision]
    keras.mixed_precision.set_global_policy(policy)
    model_spec = spec_of(spec)
    tokens = model_spec.input_kind == "tokens"
    if tokens and spec.data == "real":
        raise Unavailable(TOKENS_REAL)
    data = real_dataset(spec, model_spec)
    model, batchnorm, counted = build_model(keras, spec, None, data_format="channels_last")
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.01, momentum=0.9),
                  loss=loss_for(model_spec))
    shape = (global_batch, *model_spec.input_shape)
    shardings = (batch_sharding(distribution, shape),
                 batch_sharding(distribution, shape[:2] if tokens else (global_batch,)))
    noted: list[Any] = []
    feed, input_record, owner = fit_input(spec, data, model_spec, shardings, noted)
    try:
        timing = timed_fit(spec, model, feed, input_record.get("warmup_steps_run"))
    finally:
        if owner is not None:
            owner.close()  # the Grain workers
    timing["placement"] = all_placement(timing["placement"])
    # after fit, untimed: the model state where the distribution holds it, and the precision
    state = keras_state(model, device_batch(model_spec, global_batch, shardings),
                        distribution.device_mesh.devices.flatten().tolist(), state_source,
                        spec.precision, f"keras.mixed_precision.set_global_policy({policy!r})")
    kernel = next((v for v in model.trainable_variables if v.path.endswith("kernel")),
                  model.trainable_variables[0])  # a user's model may have no kernel
    framework = framework_versions("keras")
    if owner is not None:
        from runners.jax.data import grain_version

        framework.update(grain_version())
        input_record["first_timed_labels"] = host_labels(noted[0])
    return {
        **timing,
        "replicas": n,
        "framework": framework,
        "devices": described,
        "layout": "tokens (batch, sequence)" if tokens else "channels_last",
        "dtype_policy": policy,
        "xla": True,  # the jax trainer always jits its step
        "shardings": {**distribution_record(distribution, shardings[0], shape),
                      "variables": sharding_record(kernel.value.sharding)},
        # the summary's BN column: "none" for a model without BatchNorm (the option is moot)
        "batchnorm": batchnorm if has_batchnorm(model) else "none",
        "batchnorm_statistics": (BATCHNORM_RECORD[batchnorm] if has_batchnorm(model)
                                 else NO_BATCHNORM),
        **input_record,
        **model_record(model, model_spec, counted),
        **model_state_keras(model),
        **state,
        **describe_strategy(distribution, model),
        **multi_node_record(spec, distribution),
    }


def multi_node_record(spec: Spec, distribution: Any) -> dict[str, Any]:
    """close_multihost's record ({} on one node) with what Keras' DataParallel says of the
    processes (Keras reads them from jax once keras.distribution.initialize has run)."""
    record = close_multihost(spec, KERAS_MECHANISM)
    if record:
        record["multi_node"]["keras_distribution"] = {
            "num_processes": distribution.num_processes,
            "auto_shard_dataset": distribution.auto_shard_dataset,
            "source": "keras.distribution.DataParallel.num_processes, .auto_shard_dataset"}
    return record


def keras_counts(model: keras.Model) -> tuple[int, int]:
    """(parameters, forward FLOPs per sample) as models.keras_common counts a CNN's (the
    template's runner)."""
    from models.keras_common import count_flops_keras, count_params_keras

    return count_params_keras(model), count_flops_keras(model)


def equivalence(spec: Spec, distribute: Distribute = data_parallel,
                describe_strategy: Describe = no_record) -> dict[str, Any]:
    """One plain SGD step of fit on the probe model through the benchmark's path (the same
    `input` and `batchnorm`, the batch distributed by DataParallel); weights saved after (by
    process 0 across nodes, where each process feeds fit its share of the rows)."""
    check_multi_node(spec)
    keras, distribution, described = distribute(spec, "probe")
    from models.keras_common import get_canonical_weights, set_canonical_weights

    weights, x, y, lr = spec.equivalence_inputs()
    n = distribution.device_mesh.devices.size
    spec.split_batch(n, rows=len(x))
    model, batchnorm, _ = build_model(keras, spec, "probe")
    set_canonical_weights(model, weights)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=lr),
                  loss="sparse_categorical_crossentropy")
    mode = spec.options["input"]
    if mode == "numpy":
        rows = len(x) // spec.num_nodes  # this process's share, in process order
        mine = slice(process_index() * rows, (process_index() + 1) * rows)
        feed = {"x": x[mine], "y": y[mine], "batch_size": rows, "epochs": 1, "shuffle": True}
    elif mode == "preplaced":
        layouts = (batch_sharding(distribution, x.shape), batch_sharding(distribution, y.shape))
        import jax

        feed = preplaced(*jax.device_put((x, y), layouts), 1)
    else:
        raise Invalid(f"input must be one of {INPUTS}, not {mode!r}")
    loss, probe = fit_one_step(spec, model, feed)
    canonical = get_canonical_weights(model)
    if process_index() == 0:
        spec.save_equivalence_output(canonical)
    return {"replicas": n, "framework": framework_versions("keras"), "devices": described,
            "loss": loss, "input": mode, "batchnorm": batchnorm,
            "batch_sharding": probe.sharding, "placement": all_placement(probe.placement),
            "placement_source": PLACEMENT_SOURCE, **describe_strategy(distribution, model),
            **multi_node_record(spec, distribution)}


def process_index() -> int:
    """This process's index among the run's (0 on one node), as jax says."""
    import jax

    return jax.process_index()


MULTI_NODE_CONVERGE = ("mode converge across nodes: the recipe's batches are made whole on one "
                       "process (runners/converge.py); a per-process share of them is not fed "
                       "yet")
CONVERGE_PLACEMENT_SOURCE = ("rows per device of every batch Keras' trainer passed its jitted "
                             "train step in the first epoch, from those jax.Arrays' "
                             "addressable_shards (summed)")
EVAL_CHUNK = 1024  # held-out rows per predict batch at most (padded to a multiple of N)


class EpochRows:
    """Wraps model.train_function (as BatchPlacement does) to add up, while `active`, the rows
    per device of every batch Keras passes its jitted step; fit keeps its train function from
    one call to the next, so install() wraps it once."""

    def __init__(self) -> None:
        self.rows: dict[str, int] = {}
        self.active = True
        self._wrapped: Any = None

    def install(self, model: keras.Model) -> None:
        if self._wrapped is not None and model.train_function is self._wrapped:
            return
        inner = model.train_function

        def observed(state: Any, iterator: Iterator[Any]) -> Any:
            if self.active:
                data = next(iterator)
                for device, rows in placement(data[0]).items():
                    self.rows[device] = self.rows.get(device, 0) + rows
                iterator = iter((data,))
            return inner(state, iterator)

        model.train_function = self._wrapped = observed


def converge_callbacks(keras: Any, lr_at: Callable[[int], float], rows: EpochRows) -> list[Any]:
    """fit's callbacks for one epoch: the learning rate set before every step, the rows probe
    installed once fit has made its train function."""

    class StepLearningRate(keras.callbacks.Callback):
        """model.optimizer.learning_rate = lr_at(step) before each step (self.model syncs
        Keras' jax state into the variables first; the trainer then reads it back)."""

        def on_train_begin(self, logs: dict | None = None) -> None:
            rows.install(self._model)

        def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
            self.model.optimizer.learning_rate = lr_at(batch)

    return [StepLearningRate()]


def keras_moving_stats(keras: Any, model: keras.Model) -> tuple[bool, str]:
    """(whether every BatchNormalization layer's moving mean and variance is finite, the first
    that is not / how many were read), from the model's variables."""
    import numpy as np

    count = 0
    for layer in model._flatten_layers(include_self=False):
        if not isinstance(layer, keras.layers.BatchNormalization):
            continue
        for variable in (layer.moving_mean, layer.moving_variance):
            value = np.asarray(variable.numpy())
            bad = int(value.size - np.isfinite(value).sum())
            if bad:
                return False, f"{variable.path}: {bad} of {value.size} not finite"
            count += 1
    return True, f"{count} BatchNorm moving statistics finite"


def logits_model(keras: Any, model: keras.Model, loss: Any) -> tuple[Any, Any, str]:
    """(the model fit trains, its loss, what the record says of it): a model whose last layer
    is a softmax Activation (the built-in CNNs) as a functional model of the same layers up to
    its input, the logits, with Keras' sparse cross-entropy from logits; any other model (its
    own logits already) as it is, with `loss`. Keras on TensorFlow computes the softmax
    model's loss from those logits by itself (the softmax output's _keras_logits); on JAX its
    sparse cross-entropy takes the probabilities clipped to [1e-7, 1 - 1e-7], whose gradient
    is 0 for a row predicted confidently wrong (seen on digits: held-out accuracy 0.89 after 10
    epochs instead of 0.95 after 2)."""
    last = model.layers[-1]
    if isinstance(last, keras.layers.Activation) and \
            getattr(last.activation, "__name__", "") == "softmax":
        logits = keras.Model(model.inputs, last.input, name=f"{model.name}_logits")
        return (logits, keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                "global mean sparse cross-entropy from the logits (the model's softmax input, "
                "as Keras on TensorFlow takes it)")
    return model, loss, "global mean sparse cross-entropy (the model's own logits)"


def converge(spec: Spec) -> dict[str, Any]:
    """Mode converge (module docstring): train_to_accuracy with the benchmark's model under
    DataParallel, one fit per epoch, the learning rate set per step by a callback."""
    from runners.converge import Recipe, fitting_splits, train_to_accuracy

    if spec.num_nodes > 1:
        raise Unavailable(MULTI_NODE_CONVERGE)
    recipe = Recipe.of(spec)
    if recipe.optimizer != "sgd":
        raise Unavailable(f"optimizer {recipe.optimizer!r}: keras_jax converges with sgd only")
    mode = spec.options["input"]
    if mode not in INPUTS:
        raise Invalid(f"input must be one of {INPUTS}, not {mode!r}")
    model_spec = spec_of(spec)
    splits = fitting_splits(spec, model_spec)
    keras, distribution, described = make_distribution(spec)
    import numpy as np

    from models.keras_common import has_batchnorm, loss_for, model_record

    n, global_batch = distribution.device_mesh.devices.size, spec.global_batch_size
    spec.split_batch(n)
    rest = len(splits.y_train) % global_batch
    if recipe.last_batch == "keep" and rest % n:
        raise Unavailable(f"last_batch keep: the short last batch of {rest} rows does not "
                          f"divide over {n} devices (DataParallel lays out even shares only); "
                          "use drop or pad")
    policy = POLICIES[spec.precision]
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(recipe.seed)
    model, batchnorm, counted = build_model(keras, spec, None, data_format="channels_last")
    trained, loss, loss_kind = logits_model(keras, model, loss_for(model_spec))
    decay = {"weight_decay": recipe.weight_decay} if recipe.weight_decay else {}
    trained.compile(optimizer=keras.optimizers.SGD(learning_rate=recipe.base_lr,
                                                   momentum=recipe.momentum, **decay),
                    loss=loss)
    shape = (global_batch, *model_spec.input_shape)
    shardings = (batch_sharding(distribution, shape),
                 batch_sharding(distribution, (global_batch,)))
    rows = EpochRows()
    rows_fed: list[int] = []
    lrs: list[float] = []  # the optimizer's learning rate after each epoch's fit

    def train_epoch(epoch: int, batches: list[Any], lr_at: Callable[[int], float]) -> float:
        rows.active = epoch == 0
        if epoch == 0:
            rows_fed.extend(b.global_rows for b in batches)
        if mode == "numpy":
            feed = {"x": np.concatenate([b.x for b in batches]),
                    "y": np.concatenate([b.y for b in batches]),
                    "batch_size": global_batch, "shuffle": False}
        else:
            import jax

            feed = {"x": (jax.device_put((b.x, b.y), shardings) for b in batches),
                    "steps_per_epoch": len(batches)}
        history = trained.fit(**feed, epochs=epoch + 1, initial_epoch=epoch, verbose=0,
                              callbacks=converge_callbacks(keras, lr_at, rows))
        lrs.append(float(np.asarray(trained.optimizer.learning_rate)))
        return float(history.history["loss"][-1])

    chunk = min(EVAL_CHUNK, len(splits.y_heldout))
    chunk += -chunk % n  # a multiple of N: every device gets the same rows

    def evaluate(x: np.ndarray, y: np.ndarray) -> float:
        padded = np.concatenate([x, np.zeros((-len(x) % chunk, *x.shape[1:]), x.dtype)])
        out = trained.predict(padded, batch_size=chunk, verbose=0)
        return float((np.argmax(out[:len(y)], axis=-1) == y).mean())

    read: list[str] = []  # what the last moving_stats() read

    def moving_stats() -> tuple[bool, str]:
        finite, detail = keras_moving_stats(keras, trained)
        read[:] = [detail]
        return finite, detail

    result = train_to_accuracy(spec, train_epoch, evaluate, moving_stats, splits=splits)
    if sum(rows.rows.values()) != sum(rows_fed):
        raise Invalid(f"the first epoch fed {sum(rows.rows.values())} rows to the devices, "
                      f"not its {sum(rows_fed)}")
    kernel = next((v for v in model.trainable_variables if v.path.endswith("kernel")),
                  model.trainable_variables[0])
    extra = {
        "replicas": n,
        "framework": framework_versions("keras"),
        "devices": described,
        "layout": "channels_last",
        "dtype_policy": policy,
        "xla": True,
        "input": mode,
        "loss_kind": f"{loss_kind}; per epoch Keras' mean of its batches' losses weighted by "
                     "rows (fit's history)",
        "optimizer": ("keras.optimizers.SGD(momentum); learning_rate assigned per step by a "
                      "callback (on_train_batch_begin)"),
        "shardings": {**distribution_record(distribution, shardings[0], shape),
                      "variables": sharding_record(kernel.value.sharding)},
        "batchnorm": batchnorm if has_batchnorm(model) else "none",
        "batchnorm_statistics": (BATCHNORM_RECORD[batchnorm] if has_batchnorm(model)
                                 else NO_BATCHNORM),
        # per epoch, the rate of its last step, read back from the optimizer's variable
        "lr_read_back": lrs,
        "moving_stats_read": read[0] if read else None,
        "placement": rows.rows,
        "placement_source": CONVERGE_PLACEMENT_SOURCE,
        "data_placement": ARRAYS_PLACEMENT if mode == "numpy" else (
            "the recipe's batches device_put into DataParallel's batch layout by a generator, "
            "one per step; Keras' device_put of them is a no-op"),
        **model_record(model, model_spec, counted),
        **model_state_keras(trained),
    }
    clash = sorted(set(extra) & set(result))
    if clash:
        raise RuntimeError(f"converge fields {clash} are also runner fields")
    return {**result, **extra}


if __name__ == "__main__":
    main(benchmark, equivalence, converge)
