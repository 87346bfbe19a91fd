"""The 2017 Keras tower strategies on the Keras 2 API they were written for: tf_keras 2.21 in a
TF1 graph (eager execution off), trained by Keras 2's `fit`.

Stack. `tf_keras` is Keras 2 (the `keras` of 2017, kept alive for TF 2); this module makes it
the `keras` that the models' Keras builders (models/<name>/keras_builder.py) and the Keras
Sequence of runners/keras_data.py import, so the same builder code builds a Keras 2 model
here, as it builds keras-mxnet's. Eager execution is disabled before anything is built: every
layer call adds ops to one tf.compat.v1 graph, `tf.device` scopes around those calls are the
placement (as in 2017), and `fit` runs one `session.run` per step through a Keras backend
Function (a session callable). XLA is off: the session's global JIT level is OFF and no
`jit_compile` exists in this API.

Input (option `input`), as a 2017 user fed fit:
  feed_dict: numpy arrays (synthetic: one global batch, fit over it once per step; real data:
    a generator of numpy batches) fed through the session's feed every step: Keras 2's
    `fit(x, y)` / `fit_generator` path, synchronous host-to-device copies.
  staging: the same feed, but each tower's input is put into a `StagingArea` on the tower's
    device and the tower reads the one put the step before (put in step k, get in step k+1;
    the area is primed with the first batch before training), so the copy of batch k+1
    overlaps the compute of batch k (seed 001). The labels are staged with the images (on the
    device where the loss runs) and reach the loss through compile(target_tensors=), so the
    loss of step k sees batch k's labels.
  tf_data: a tf.data dataset passed to fit: its iterator's get_next feeds the model inside the
    graph, no feed_dict.

Gradients: Keras 2.0-2.2's optimizers took `K.gradients`, i.e. tf.gradients with
colocate_gradients_with_ops=True: each tower's backward ops run on the tower's device. tf_keras'
legacy optimizer does not colocate; `Keras2SGD` restores Keras 2.2's call (avolkov1's
SGD_MGPU builds on it). The update is the legacy SGD's (momentum 0.9, lr 0.01).

Updates: the parallel model is a Keras2Network, whose training function fetches the updates
Keras 2.0-2.2 fetched (those of the layer calls the model owns: each tower's BatchNorm updates
from its slice), not tf_keras' "every update reachable from the inputs", which also ran the
template's own call on the whole batch every step (issue 24).

Placement and work: one step before the warm-up runs with RunOptions(FULL_TRACE,
output_partition_graphs=True) (compile(options=, run_metadata=)); its partition graphs give
the compute ops TF placed on each device, its step stats the nodes each device executed,
counted by kind (runners/tf/op_kinds.py): `forward_convs_per_device` and
`backward_convs_per_device` beside `expected_work` (one tower's convolutions per tower device,
none elsewhere), which the parent checks (bench/records/placement_check.py). The callable is then
rebuilt without the options, so no timed step is traced.

Mode converge (`converge`, runners/converge.py's recipe and batches): trains as seed 004 did,
Keras 2 `fit` on the tower model, one fit call per epoch over the epoch's global batches as
numpy arrays (input feed_dict only: staging and tf_data are unavailable), the whole global
batch given to the tower model, which slices it as the original does (a short kept last
batch included: an empty tower is seed 002's trap), the learning rate set before every step by
a callback (K.set_value on the optimizer's lr), Keras 2's SGD with the recipe's momentum (and
its weight_decay added to the gradients, g + wd x w, which Keras 2's SGD lacked). The traced
step is the run's first training step (no extra step). Differs: evaluation runs the template's
predict on the held-out split (the towers' shared weights and moving statistics, inference
mode), not fit's validation on the tower model (kuza55's would lose the rows of a batch that
does not divide); the loss leaves out the labels of rows a tower model dropped
(converge_loss), where Keras 2's would fail on the shapes. Keras 2's loss clips the softmax
output to [1e-7, 1 - 1e-7], whose gradient is zero below: a row the model gets confidently
wrong early stays wrong (at the linear-scaled rate of batch 64 on digits, about a tenth of the
training rows), which these runners reproduce.

Imports TensorFlow and tf_keras: runner child processes only.
"""

from __future__ import annotations

import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras is tf_keras here, never Keras 3
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

sys.modules["keras"] = tf_keras  # the models' builders and keras_data import `keras`: Keras 2
tf.compat.v1.disable_eager_execution()

from collections.abc import Callable, Iterator  # noqa: E402
from dataclasses import dataclass, field, replace  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from tensorflow.python.ops import data_flow_ops  # noqa: E402

from models import ModelSpec, get_spec, load_builder  # noqa: E402
from models.keras2_common import (  # noqa: E402
    count_flops_keras2,
    count_params_keras2,
    get_canonical_weights,
    set_canonical_weights,
)
from runners.common import Invalid, Spec, TimedWindow, Unavailable  # noqa: E402
from runners.real_data import RealData, check_classes, describe, open_dataset  # noqa: E402
from runners.tf import data as tf_data  # noqa: E402
from runners.tf import devices as tf_devices  # noqa: E402
from runners.tf import op_kinds  # noqa: E402
from runners.tf.placement import (  # noqa: E402
    compute_ops_by_device,
    device_key,
    executed_kinds_by_device,
    graph_run_options,
    partition_graphs,
)

tfv1 = tf.compat.v1
K = tfv1.keras.backend  # tf_keras' v1 backend (TF_USE_LEGACY_KERAS): get_session, set_session
DATA_FORMAT = "channels_last"


def sparse_categorical_crossentropy(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
    """Keras 2.0-2.2's sparse_categorical_crossentropy (tensorflow_backend): the softmax
    output clipped to [1e-7, 1 - 1e-7], its log taken as logits. tf_keras 2.21 instead reads
    the logits behind a Softmax op, which a tower model's concatenated output no longer is,
    so its built-in loss would differ between the plain model and the towers; the 2017 loss
    is the same for both."""
    eps = tf.constant(1e-7, y_pred.dtype)
    log_p = tf.math.log(tf.clip_by_value(y_pred, eps, 1 - eps))
    labels = tf.cast(tf.reshape(y_true, [-1]), tf.int64)
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=log_p)


LOSS = sparse_categorical_crossentropy
INPUTS = ("feed_dict", "staging", "tf_data")


# -- session and devices ----------------------------------------------------------------------


def setup(spec: Spec) -> tuple[list[str], list[dict[str, Any]], dict[str, Any]]:
    """The run's device names and descriptions; a Keras session that has them, XLA off.

    A tf.compat.v1 Session ignores tf.config's logical devices, so on CPU the session config
    asks for N CPU devices too (as runners/tf/tensorpack.py does)."""
    if spec.precision != "fp32":
        raise Invalid(f"{spec.runner} runs fp32 only, not {spec.precision}")
    names, devices = tf_devices.setup_devices(spec)
    config = tfv1.ConfigProto(allow_soft_placement=True)  # Keras 2's own session config
    config.gpu_options.allow_growth = True
    # a StagingArea put can hold an inter-op thread until its get runs: keep threads spare
    config.inter_op_parallelism_threads = max(os.cpu_count() or 1, 2 * len(names) + 2)
    config.graph_options.optimizer_options.global_jit_level = tfv1.OptimizerOptions.OFF
    if spec.device == "cpu":
        config.device_count["CPU"] = len(names)
    K.set_session(tfv1.Session(config=config))
    xla_flags = os.environ.get("TF_XLA_FLAGS", "")
    if "auto_jit" in xla_flags or "xla_auto" in xla_flags:
        raise Invalid(f"TF_XLA_FLAGS={xla_flags!r} turns XLA auto-clustering on")
    return names, devices, {"xla": False, "xla_setting": "session global_jit_level OFF, "
                            "no jit_compile (Keras 2 graph mode)"}


def framework_versions() -> dict[str, str]:
    return {"tensorflow": tf.__version__, "tf_keras": tf_keras.__version__,
            "numpy": np.__version__}


# -- model pieces -----------------------------------------------------------------------------


def build_template(model: str, device: str | None) -> Any:
    """The model from models/ built by Keras 2, its variables (and input placeholder) created
    under `device` (None: no device scope, TF's default placement)."""
    build = load_builder(model, "keras")
    if device is None:
        return build(get_spec(model), data_format=DATA_FORMAT)
    with tf.device(device):
        return build(get_spec(model), data_format=DATA_FORMAT)


def slice_rows(x: tf.Tensor, index: int, parts: int, remainder: str) -> tf.Tensor:
    """Tower `index`'s rows of the batch, sized from the batch's runtime shape: B // parts rows,
    the last tower also taking the remainder when remainder == "last"."""
    batch = tf.shape(x)[0]
    step = batch // parts
    start = step * index
    if remainder == "last" and index == parts - 1:
        return x[start:]
    if remainder not in ("drop", "last"):
        raise ValueError(f"remainder must be 'drop' or 'last': {remainder!r}")
    return x[start:start + step]


def require_even_split(global_batch: int, parts: int, runner: str) -> None:
    """Invalid unless the global batch divides by the tower count: `runner` gives every tower
    batch // parts rows and would silently drop the remainder."""
    if global_batch % parts:
        raise Invalid(
            f"{runner} gives each of {parts} towers {global_batch // parts} rows and would "
            f"silently drop the remaining {global_batch % parts} of the global batch of "
            f"{global_batch}; use a global batch divisible by {parts}")


@dataclass
class Stager:
    """StagingAreas one step ahead: `stage(t, device)` returns what the step reads (the put of
    the step before) and records the put, which every step also runs (compile(fetches=))."""

    puts: list[Any] = field(default_factory=list)

    def stage(self, t: tf.Tensor, device: str, name: str) -> tf.Tensor:
        with tf.device(device), tf.name_scope(name):
            area = data_flow_ops.StagingArea(dtypes=[t.dtype], shapes=[t.shape])
            put = area.put([t])
            with tf.control_dependencies([put]):  # Keras' fetches must be tensors
                self.puts.append(tf.zeros([], name="put_done"))
            out = area.get()
        out = out[0] if isinstance(out, (list, tuple)) else out
        out.set_shape(t.shape)
        return out


@dataclass
class Recipe:
    """How a strategy builds its parallel model from the template.

    devices: tower devices. slice_device: where each tower's rows are cut from the batch
    (None: inside the tower's own device scope, the whole batch travels to every tower;
    "input": on the device of the template's input placeholder, Keras 2.2's multi_gpu_model).
    merge_device: where tower outputs are concatenated. remainder: "drop" or "last"."""

    devices: list[str]
    merge_device: str
    slice_device: str | None = None
    remainder: str = "drop"
    scope: str = "tower"  # the towers' name scope prefix (multi_gpu_model: "replica")


def parallel_model(template: Any, recipe: Recipe | None, device: str, stager: Stager | None
                   ) -> tuple[Any, Any]:
    """(the model fit trains, the staged labels or None).

    recipe None: the plain template on `device` (a 1-device baseline), staged there when a
    stager is given. Otherwise the template called once per tower device on its slice, under
    tf.device and a tower name scope, outputs concatenated on the merge device, all by Keras 2
    layers (Lambda, Concatenate) as the originals built them. With a stager the model also
    takes the labels as a second input, staged on the merge device."""
    layers = tf_keras.layers
    x = template.inputs[0]
    inputs, labels = [x], None
    if stager is not None:
        with tf.device(recipe.merge_device if recipe else device):
            y_in = layers.Input((), dtype="int32", name="label")
            labels = stager.stage(y_in, recipe.merge_device if recipe else device, "stage_y")
        inputs.append(y_in)
    if recipe is None:
        if stager is None:
            return template, None
        with tf.device(device):
            xs = layers.Lambda(lambda t: stager.stage(t, device, "stage_x"),
                               name="stage_x")(x)
            out = template(xs)
        return Keras2Network(inputs, out, name=f"{template.name}_staged"), labels
    n = len(recipe.devices)
    outputs = []
    for i, dev in enumerate(recipe.devices):
        cut = recipe.slice_device
        if cut == "input":  # Keras 2.2: `with tf.device(x.device)`; "" keeps the tower scope
            cut = x.device or dev
        with tf.device(cut or dev):
            xi = layers.Lambda(slice_rows, name=f"slice_{i}",
                               arguments={"index": i, "parts": n,
                                          "remainder": recipe.remainder})(x)
        if stager is not None:
            xi = layers.Lambda(lambda t, d=dev, i=i: stager.stage(t, d, f"stage_x{i}"),
                               name=f"stage_x{i}")(xi)
        with tf.device(dev), tf.name_scope(f"{recipe.scope}_{i}"):
            outputs.append(template(xi))
    with tf.device(recipe.merge_device):
        merged = layers.Concatenate(axis=0, name="merge")(outputs)
    return Keras2Network(inputs, merged, name=f"{template.name}_parallel"), labels


class Keras2Network(tf_keras.Model):
    """A functional model whose training function runs the updates Keras 2.0-2.2 ran: those
    of the layer calls (nodes) this model owns, and the unconditional ones.

    Keras 2's `Network.updates` (keras/engine/network.py, 2.2.4; `Container.updates` in
    topology.py before 2.1.3) walked the model's layers and, for each inbound node the model
    owns, took `layer.get_updates_for(node.input_tensors)`. tf_keras' v1 training loop
    (training_v1._make_train_function) instead fetches `get_updates_for(self.inputs)`: every
    update reachable from the model's inputs. A tower model reuses the template's input, so
    the template's own BatchNorm updates (from the call that built it, on the whole global
    batch) are reachable too, and fetching them runs a full-batch forward pass on the
    template's device every step; Keras 2 never fetched them. Here the owned-node rule comes
    back, so each tower updates the shared BatchNorm statistics from its own slice, as in
    Keras 2, and the template's own call is not run."""

    def get_updates_for(self, inputs: Any) -> list[Any]:
        if inputs is None or inputs is not self.inputs:
            return super().get_updates_for(inputs)
        from tf_keras.src.engine.functional import _make_node_key

        updates: list[Any] = []
        for layer in self.layers:
            for index, node in enumerate(layer._inbound_nodes):
                if _make_node_key(layer.name, index) in self._network_nodes:
                    updates += [u for u in layer.get_updates_for(node.input_tensors)
                                if u not in updates]
        return updates


def keras2_gradients(loss: tf.Tensor, params: list[Any]) -> list[tf.Tensor]:
    """Keras 2.0-2.2's K.gradients: each gradient op on its forward op's device."""
    return tfv1.gradients(loss, params, colocate_gradients_with_ops=True)


class Keras2SGD(tf_keras.optimizers.legacy.SGD):
    """tf_keras' legacy SGD, with the gradients Keras 2.2 took. `weight_decay` (mode
    converge's recipe; Keras 2's SGD had none, its users added L2 kernel regularisers): the L2
    penalty added to every trainable variable's gradient, g + wd x w, as torch's SGD does."""

    def __init__(self, *args: Any, weight_decay: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.l2_decay = float(weight_decay)

    def get_gradients(self, loss: tf.Tensor, params: list[Any]) -> list[tf.Tensor]:
        grads = keras2_gradients(loss, params)
        if any(g is None for g in grads):
            raise ValueError("a variable has no gradient")
        if self.l2_decay:
            grads = [g + self.l2_decay * p for g, p in zip(grads, params, strict=True)]
        return grads


# -- data -------------------------------------------------------------------------------------


def input_option(spec: Spec) -> str:
    value = spec.options["input"]
    if value not in INPUTS:
        raise Unavailable(f"input {value!r} is not one of {INPUTS}")
    return value


def synthetic_arrays(model_spec: ModelSpec, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """One random global batch (images NHWC float32, int32 labels), the same in every run."""
    rng = np.random.default_rng(12)
    x = rng.standard_normal((batch, *model_spec.input_shape), dtype=np.float32)
    y = rng.integers(0, model_spec.num_classes, batch).astype(np.int32)
    return x, y


@dataclass
class Source:
    """What fit trains on: fit's data arguments for `steps` steps, and the first batch (to
    prime a StagingArea)."""

    fit_args: Callable[[int, bool], dict[str, Any]]  # (steps, staged) -> fit kwargs
    first: Callable[[], tuple[np.ndarray, np.ndarray]] | None
    info: dict[str, Any]


def open_real(spec: Spec, model_spec: ModelSpec) -> RealData:
    if spec.data != "real":
        raise Unavailable(f"data {spec.data!r} is neither synthetic nor real")
    data = open_dataset(spec)
    check_classes(data, model_spec.num_classes, spec.model)
    return data


def arrays_source(x: np.ndarray, y: np.ndarray) -> Source:
    """Numpy arrays of one global batch: fit(x, y, batch_size=B) runs one step per epoch,
    slicing and feeding the arrays each step as Keras 2's array loop does."""
    def fit_args(steps: int, staged: bool) -> dict[str, Any]:
        data = {"x": [x, y], "y": None} if staged else {"x": x, "y": y}
        return {**data, "batch_size": len(x), "epochs": steps, "shuffle": False}
    return Source(fit_args, lambda: (x, y), {})


def batches_source(make: Callable[[], Iterator[tuple[np.ndarray, np.ndarray]]],
                   info: dict[str, Any], fit_kwargs: dict[str, Any]) -> Source:
    """A generator of numpy batches for fit (Keras 2's fit_generator path: feed_dict)."""
    def fit_args(steps: int, staged: bool) -> dict[str, Any]:
        it = make()
        gen = (([bx, by],) for bx, by in it) if staged else it
        return {"x": gen, "steps_per_epoch": steps, "epochs": 1, **fit_kwargs}
    return Source(fit_args, lambda: next(make()), info)


def make_source(spec: Spec, model_spec: ModelSpec, input_mode: str, steps: int) -> Source:
    """The run's data in the form its input option hands it to fit."""
    batch = spec.global_batch_size
    if spec.data == "synthetic":
        x, y = synthetic_arrays(model_spec, batch)
        if input_mode != "tf_data":
            return arrays_source(x, y)

        def ds_args(steps: int, staged: bool) -> dict[str, Any]:
            ds = tf.data.Dataset.from_tensors((x, y)).repeat()
            return {"x": ds, "steps_per_epoch": steps, "epochs": 1}
        return Source(ds_args, None, {})
    data = open_real(spec, model_spec)
    size = model_spec.input_shape[0]
    loader = spec.options["loader"]
    base = {**describe(data, size), "loader": loader}
    if input_mode == "tf_data":
        if loader != "framework":
            raise Invalid("input tf_data reads the TFRecord shards (loader: framework)")

        def real_ds_args(steps: int, staged: bool) -> dict[str, Any]:
            return {"x": tf_data.make_dataset(data, size, batch), "steps_per_epoch": steps,
                    "epochs": 1}
        first = tf_data.make_dataset(data, size, batch)
        return Source(real_ds_args, None, {
            **base, "input_pipeline": tf_data.describe_pipeline(data, batch)
            + ", passed to fit (iterator get_next in the graph)",
            "labels_first_batch": _first_labels_graph(first)})
    if loader == "keras":
        from runners.keras_data import describe_keras, fit_worker_kwargs, jpeg_sequence

        seq = jpeg_sequence(data, size, batch, steps)
        return Source(lambda n, staged: ({"x": seq, "steps_per_epoch": n, "epochs": 1,
                                          **fit_worker_kwargs(data)} if not staged else
                                         {"x": (([bx, by],) for bx, by in _cycle(seq)),
                                          "steps_per_epoch": n, "epochs": 1}),
                      lambda: seq[0],
                      {**base, "input_pipeline": describe_keras(data),
                       "labels_first_batch": [int(v) for v in seq[0][1]]})
    if loader != "framework":
        raise Unavailable(f"loader {loader!r} is neither framework nor keras")

    def numpy_batches() -> Iterator[tuple[np.ndarray, np.ndarray]]:
        # tf.data's batches pulled to numpy by session.run, then fed by fit's feed_dict
        nxt = tfv1.data.make_one_shot_iterator(tf_data.make_dataset(data, size, batch)
                                               ).get_next()
        sess = K.get_session()
        while True:
            bx, by = sess.run(nxt)
            yield bx, by

    first = next(numpy_batches())
    return batches_source(numpy_batches, {
        **base, "input_pipeline": tf_data.describe_pipeline(data, batch)
        + ", pulled to numpy by session.run and fed to fit by feed_dict",
        "labels_first_batch": [int(v) for v in first[1]]}, {"workers": 0})


def _cycle(seq: Any) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    i = 0
    while True:
        yield seq[i % len(seq)]
        i += 1


def _first_labels_graph(ds: Any) -> list[int]:
    nxt = tfv1.data.make_one_shot_iterator(ds).get_next()
    return [int(v) for v in K.get_session().run(nxt)[1]]


# -- training ---------------------------------------------------------------------------------


class Clock(tf_keras.callbacks.Callback):
    """Drives the timed window (runners.common.TimedWindow): fit's session.run returns the
    fetched loss, so each batch end follows a finished step. Counts train batches across fit's
    epochs."""

    def __init__(self, warmup: int, measure: int) -> None:
        super().__init__()
        self.window = TimedWindow(warmup, measure, on_start=self._start)
        self.start_iteration = 0

    def _start(self) -> None:
        self.start_iteration = int(K.get_value(self.model.optimizer.iterations))

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self.window.step_begin()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.window.step_done(float((logs or {})["loss"]))


@dataclass
class Built:
    """A compiled parallel (or plain) model ready for fit."""

    model: Any
    template: Any
    stager: Stager | None
    run_metadata: Any
    fields: dict[str, Any]
    slicing: Recipe | None = None  # how the towers cut a batch (None: the plain model)


def compile_model(template: Any, recipe: Recipe | None, device: str, input_mode: str,
                  optimizer: Any) -> Built:
    """The model fit trains, compiled with a traced first step (see placement_step)."""
    stager = Stager() if input_mode == "staging" else None
    model, labels = parallel_model(template, recipe, device, stager)
    options, run_metadata = graph_run_options(full_trace=True)
    kwargs: dict[str, Any] = {"options": options, "run_metadata": run_metadata}
    if stager is not None:
        kwargs["fetches"] = stager.puts  # every step puts the next batch
        kwargs["target_tensors"] = [labels]
    model.compile(optimizer=optimizer, loss=LOSS, **kwargs)
    return Built(model, template, stager, run_metadata, {}, recipe)


def prime(built: Built, x: np.ndarray, y: np.ndarray) -> None:
    """Put one batch into every StagingArea (the step after reads it)."""
    if built.stager is None:
        return
    feed = {built.model.inputs[0]: x, built.model.inputs[1]: y}
    K.get_session().run(built.stager.puts, feed_dict=feed)


def conv_layers(template: Any) -> int:
    """The template's convolution layers (nested models' included): the forward (and filter
    gradient) convolutions one tower runs per step."""
    from tf_keras.src.layers.convolutional.base_conv import Conv

    return sum(isinstance(layer, Conv) for layer in template._flatten_layers(include_self=False))


def per_device_work(run_metadata: Any, towers: list[str], convs: int, copies: int = 1
                    ) -> dict[str, Any]:
    """What each device executed in the traced step (runners/tf/op_kinds.py kinds), beside
    what the original runs: one forward and one filter-gradient convolution per conv layer on
    each tower's device, none elsewhere (the parent checks one against the other:
    bench/records/placement_check.py). `copies` > 1: the original's graph takes the gradients that
    many times (avolkov1's SGD_MGPU), each copy colocated with the towers' forward ops; TF's
    common-subexpression elimination merges identical copies where nothing stops it (the
    probe model) but not through v1 control flow (BatchNorm's learning-phase cond), so a
    device runs between one and `copies` filter gradients per conv layer."""
    kinds = executed_kinds_by_device(run_metadata)

    def of(kind: str) -> dict[str, int]:
        return {d: k[kind] for d, k in kinds.items() if k.get(kind)}

    expected = {device_key(_full(d)): convs for d in towers}
    backward = expected if copies == 1 else \
        {device_key(_full(d)): [convs, copies * convs] for d in towers}
    return {
        "forward_convs_per_device": of(op_kinds.CONV_FORWARD),
        "backward_convs_per_device": of(op_kinds.CONV_BACKPROP_FILTER),
        "input_grad_convs_per_device": of(op_kinds.CONV_BACKPROP_INPUT),
        "convs_per_tower": convs,
        "expected_work": {"forward_convs_per_device": expected,
                          "backward_convs_per_device": backward},
        "work_source": "nodes executed per device in the step stats of one FULL_TRACE fit "
                       "step before the warm-up (the timed steps run the same graph), by op "
                       "kind (runners/tf/op_kinds.py); convs_per_tower from the template's "
                       "convolution layers",
    }


def placement_step(built: Built, fit_args: dict[str, Any], devices: list[str],
                   gradient_copies: int = 1) -> dict[str, Any]:
    """Run one traced fit step (FULL_TRACE), read the placement from its partition graphs and
    each device's executed convolutions from its step stats, then rebuild the step's callable
    without tracing. Invalid if a tower device did no compute."""
    built.model.fit(**fit_args, verbose=0)
    return traced_placement(built, devices, gradient_copies)


def traced_placement(built: Built, devices: list[str], gradient_copies: int = 1
                     ) -> dict[str, Any]:
    """placement_step's reading of the traced step that just ran (the compiled FULL_TRACE
    options), the step's callable then rebuilt without tracing for the steps after."""
    placement = compute_ops_by_device(built.run_metadata)
    fn = built.model.train_function
    fn.run_options, fn.run_metadata = None, None
    fn._callable_fn = None  # rebuilt, untraced, on the next step (a warm-up step)
    missing = [d for d in devices if placement.get(device_key(_full(d)), 0) <= 0]
    if missing:
        raise Invalid(f"no compute ops ran on {missing}: TF placed the step on "
                      f"{sorted(placement)}")
    # the step's convolution weight gradients: as built in the graph, and as TF ran them
    # after its graph optimisations (common-subexpression elimination merges identical ones)
    backprop = sum(1 for g in partition_graphs(built.run_metadata) for node in g.node
                   if op_kinds.op_kind(node.op) == op_kinds.CONV_BACKPROP_FILTER)
    backprop_built = sum(1 for op in built.model.train_function.updates_op.graph
                         .get_operations()
                         if op_kinds.op_kind(op.type) == op_kinds.CONV_BACKPROP_FILTER)
    return {"placement": placement,
            "placement_source": "compute ops per device in the partition graphs of one "
                                "traced fit step before the warm-up (session.run "
                                "RunOptions.output_partition_graphs)",
            "conv_backprop_filter_ops": backprop,
            "conv_backprop_filter_ops_built": backprop_built,
            **per_device_work(built.run_metadata, devices, conv_layers(built.template),
                              gradient_copies)}


def _full(name: str) -> str:
    """"/cpu:1" as TF names it in partition graphs."""
    kind, index = name.strip("/").split(":")
    return f"/job:localhost/replica:0/task:0/device:{kind.upper()}:{index}"


def benchmark(spec: Spec, make: Callable[[Spec, list[str], str], tuple[Built, dict[str, Any]]]
              ) -> dict[str, Any]:
    """The benchmark every tower runner shares: make(spec, device names, input mode) ->
    (compiled model, record fields); one traced placement step, then warm-up and measured
    steps in one fit call, timed at batch ends."""
    names, devices, xla = setup(spec)
    input_mode = input_option(spec)
    model_spec = get_spec(spec.model)
    warmup, measure = spec.warmup_steps, spec.measure_steps
    source = make_source(spec, model_spec, input_mode, 1 + warmup + measure)
    built, fields = make(spec, names, input_mode)
    staged = built.stager is not None
    if staged:
        assert source.first is not None
        prime(built, *source.first())
    placement = placement_step(built, source.fit_args(1, staged), _tower_devices(fields, names),
                               fields.get("gradient_copies", 1))
    clock = Clock(warmup, measure)
    built.model.fit(**source.fit_args(warmup + measure, staged), callbacks=[clock], verbose=0)
    steps = int(K.get_value(built.model.optimizer.iterations)) - clock.start_iteration
    batch = spec.global_batch_size
    return {
        **clock.window.summary(batch, steps * batch),
        "loss_kind": "Keras 2 per-batch loss",
        **placement,
        "placement_step": "one extra traced step before the warm-up",
        # from the trace: the devices that executed a tower's forward convolutions
        "replicas": len(placement["forward_convs_per_device"]),
        "framework": framework_versions(),
        "api": "tf_keras (Keras 2) in TF1 graph mode, fit",
        "devices": devices,
        "input": input_mode,
        "layout": DATA_FORMAT,
        "dtype_policy": "float32",
        "params": count_params_keras2(built.template),
        "flops_per_sample": count_flops_keras2(built.template),
        "variables_device": built.template.weights[0].device,
        **xla,
        **fields,
        "departs_from_original": departures(spec),
        **source.info,
    }


def _tower_devices(fields: dict[str, Any], names: list[str]) -> list[str]:
    return list(fields.get("tower_devices") or names[:1])


def equivalence(spec: Spec, make: Callable[[Spec, list[str], str], tuple[Built, dict[str, Any]]]
                ) -> dict[str, Any]:
    """One plain-SGD step through fit on the probe, by the benchmark's input option (a primed
    StagingArea holds the test's batch, so the step trains on it); weights saved after."""
    names, devices, xla = setup(spec)
    input_mode = input_option(spec)
    weights, x, y, lr = spec.equivalence_inputs()
    built, fields = make(replace(spec, model="probe"), names, input_mode)
    set_canonical_weights(built.template, weights)
    staged = built.stager is not None
    if input_mode == "tf_data":
        args: dict[str, Any] = {"x": tf.data.Dataset.from_tensors((x, y)).repeat(),
                                "steps_per_epoch": 1, "epochs": 1}
    else:
        prime(built, x, y)
        args = arrays_source(x, y).fit_args(1, staged)
    placement = placement_step(built, args, _tower_devices(fields, names),
                               fields.get("gradient_copies", 1))
    spec.save_equivalence_output(get_canonical_weights(built.template))
    return {"replicas": len(placement["forward_convs_per_device"]),
            "framework": framework_versions(),
            "devices": devices, "input": input_mode, **placement, **xla, **fields}


# -- mode converge ----------------------------------------------------------------------------


def converge_loss(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
    """The 2017 loss (sparse_categorical_crossentropy) on the labels of the rows the towers
    trained on: a tower model that drops the remainder of a short batch (kuza55's get_slice)
    outputs fewer rows than it was fed, and Keras 2's loss would fail on the shapes; here the
    lost rows' labels are left out, as their images were. No-op when the rows match."""
    rows = tf.shape(y_pred)[0]
    return sparse_categorical_crossentropy(tf.reshape(y_true, [-1])[:rows], y_pred)


class StepLR(tf_keras.callbacks.Callback):
    """Seed 004's LearningRateScheduler made per step: before train batch `batch` of the
    epoch, K.set_value(optimizer.lr, lr_at(batch)); keeps each batch's loss (fit's batch
    logs) and runs `after_first` once, after the first batch (the traced step)."""

    def __init__(self, lr_at: Callable[[int], float],
                 after_first: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.lr_at, self.after_first = lr_at, after_first
        self.losses: list[float] = []

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        K.set_value(self.model.optimizer.lr, self.lr_at(batch))

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.losses.append(float((logs or {})["loss"]))
        if self.after_first is not None:
            hook, self.after_first = self.after_first, None
            hook()


def batchnorm_moving_stats(template: Any) -> tuple[bool, str]:
    """(all finite, the first that is not) of every BatchNorm moving mean and variance of the
    model, read from its variables (the towers share the template's)."""
    variables = [v for layer in template._flatten_layers(include_self=False)
                 for name in ("moving_mean", "moving_variance")
                 if (v := getattr(layer, name, None)) is not None]
    if not variables:
        return True, "no BatchNorm layers"
    for v, value in zip(variables, K.batch_get_value(variables), strict=True):
        bad = int(np.size(value) - np.isfinite(value).sum())
        if bad:
            return False, f"{v.name}: {bad} of {np.size(value)} values not finite"
    return True, f"{len(variables)} BatchNorm moving statistics finite"


def tower_rows(slicing: Recipe | None, rows: int) -> list[int]:
    """The rows of a batch of `rows` each tower trains on (slice_rows' rule)."""
    if slicing is None:
        return [rows]
    n = len(slicing.devices)
    step = rows // n
    return [step] * (n - 1) + [rows - (n - 1) * step if slicing.remainder == "last" else step]


def converge(spec: Spec, make: Callable[[Spec, list[str], str], tuple[Built, dict[str, Any]]]
             ) -> dict[str, Any]:
    """Mode converge (runners/converge.py) as seed 004 trained: Keras 2 `fit` on the tower
    model, one fit call per epoch (epochs=epoch + 1, initial_epoch=epoch) over the epoch's
    global batches as numpy arrays (fit(x, y, batch_size=B, shuffle=False) cuts exactly the
    recipe's batches, a short kept one included), the whole global batch fed to the tower
    model, which slices it over its towers; the learning rate set before every step by a
    callback (StepLR), SGD with the recipe's momentum. The first step of the run is the traced
    one (placement, per-device work), no extra step. Evaluation: the template's predict
    (inference mode, the towers' shared weights and moving statistics) on the held-out split.
    Initial weights seeded by tf_keras.utils.set_random_seed(recipe.seed) before the model is
    built."""
    from runners.converge import Recipe, load_splits, train_to_accuracy

    names, devices, xla = setup(spec)
    input_mode = input_option(spec)
    if input_mode != "feed_dict":
        raise Unavailable(f"mode converge feeds the recipe's numpy batches to fit (input "
                          f"feed_dict), not input {input_mode}")
    recipe = Recipe.of(spec)
    # tf_keras' initialisers draw their seeds from Python's and tf_keras' seed generators
    # (stateless ops), TF's graph seed for the rest: set_random_seed sets all of them
    tf_keras.utils.set_random_seed(recipe.seed)
    built, fields = make(spec, names, input_mode)
    options, _ = graph_run_options(full_trace=True)
    built.model.compile(optimizer=built.model.optimizer, loss=converge_loss, options=options,
                        run_metadata=built.run_metadata)
    towers = _tower_devices(fields, names)
    placement: dict[str, Any] = {}
    batch = spec.global_batch_size

    def trace() -> None:
        placement.update(traced_placement(built, towers, fields.get("gradient_copies", 1)))

    def train_epoch(epoch: int, batches: list[Any], lr_at: Callable[[int], float]) -> float:
        x = np.concatenate([b.x for b in batches])
        y = np.concatenate([b.y for b in batches])
        steps = StepLR(lr_at, None if placement else trace)
        try:
            built.model.fit(x, y, batch_size=batch, epochs=epoch + 1, initial_epoch=epoch,
                            shuffle=False, callbacks=[steps], verbose=0)
        except tf.errors.InvalidArgumentError as exc:
            rows = len(batches[-1].y)
            if len(steps.losses) != len(batches) - 1 or rows // len(towers) > 0 \
                    or not fields.get("wrapped"):
                raise
            # oneDNN's CPU Conv2D returns an empty batch with the input's channels, which the
            # next layer refuses: seed 002's empty tower, failing where a GPU puts NaN in the
            # BatchNorm statistics (TF_ENABLE_ONEDNN_OPTS=0 shows the NaN on CPU too)
            lines = [line.strip() for line in str(exc).splitlines()]
            detail = next((line for line in lines if "INVALID_ARGUMENT" in line), lines[0])
            raise Invalid(f"the short last batch of epoch {epoch + 1} ({rows} rows over "
                          f"{len(towers)} towers) left a tower no rows, and TF failed on the "
                          f"empty batch: {detail}") from exc
        if len(steps.losses) != len(batches):
            raise Invalid(f"fit ran {len(steps.losses)} steps of epoch {epoch + 1}, not the "
                          f"recipe's {len(batches)} batches")
        return float(np.mean(steps.losses))

    def evaluate(x: np.ndarray, y: np.ndarray) -> float:
        probs = built.template.predict(x, batch_size=batch, verbose=0)
        return float(np.mean(np.argmax(probs, axis=-1) == y))

    splits = load_splits(spec)
    result = train_to_accuracy(spec, train_epoch, evaluate,
                               lambda: batchnorm_moving_stats(built.template), splits=splits)
    short = len(splits.y_train) % batch if recipe.last_batch == "keep" else 0
    return {
        **result,
        # rows of a short kept last batch each tower trains on (seed 002's trap: 0 rows)
        "short_batch_rows_per_tower": tower_rows(built.slicing, short) if short else None,
        **placement,
        "placement_step": "the run's first training step, traced",
        "replicas": len(placement.get("forward_convs_per_device", {})),
        "loss_kind": "Keras 2 per-batch loss, mean over the epoch's steps",
        "framework": framework_versions(),
        "api": "tf_keras (Keras 2) in TF1 graph mode, fit per epoch, LR per step by callback",
        "devices": devices,
        "input": input_mode,
        "layout": DATA_FORMAT,
        "dtype_policy": "float32",
        "params": count_params_keras2(built.template),
        "flops_per_sample": count_flops_keras2(built.template),
        "variables_device": built.template.weights[0].device,
        "evaluation": "the template's predict on the held-out split (inference mode)",
        **xla,
        **fields,
        "departs_from_original": departures(spec),
    }


def optimizer(spec: Spec, cls: type[Keras2SGD] = Keras2SGD, **kwargs: Any) -> Keras2SGD:
    """The benchmark's SGD (momentum 0.9), or plain SGD at the equivalence test's rate; `cls`
    a strategy's own Keras2SGD (kwargs its own arguments)."""
    if spec.mode == "equivalence":  # the test's plain SGD at its learning rate
        return cls(learning_rate=float((spec.equivalence or {})["learning_rate"]), **kwargs)
    if spec.mode == "converge":  # the recipe's SGD; its rate is set before every step
        from runners.converge import Recipe

        recipe = Recipe.of(spec)
        if recipe.optimizer != "sgd":
            raise Unavailable(f"optimizer {recipe.optimizer!r}: the tower runners train with "
                              "Keras 2's SGD")
        return cls(learning_rate=recipe.base_lr, momentum=recipe.momentum,
                   weight_decay=recipe.weight_decay, **kwargs)
    return cls(learning_rate=0.01, momentum=0.9, **kwargs)


def template_device(value: str, devices: list[str]) -> str | None:
    """Where a template is built (its variables live): "default" no device scope (TF's
    default placement: the first GPU, or /cpu:0 without GPUs), "cpu" /cpu:0, "gpu" the first
    tower device."""
    if value == "default":
        return None
    return "/cpu:0" if value == "cpu" else devices[0]


def departures(spec: Spec) -> list[str]:
    """The options of this run that differ from the original's own usage (the catalog's
    defaults are the originals', each cited in its runner's docstring), "name=value"; the
    real-data loader is the harness's, not the original's, and is left out."""
    from contract.catalogs.tf import RUNNERS as TF_RUNNERS

    info = next(r for r in TF_RUNNERS if r.name == spec.runner)
    return [f"{name}={spec.options[name]}" for name, opt in info.options.items()
            if name != "loader" and name in spec.options and spec.options[name] != opt.default]


def single_device(spec: Spec, devices: list[str], original: str) -> dict[str, Any] | None:
    """At one device, fields for the plain-model baseline of an original that refuses or
    bypasses one device; None when the wrapper is to be measured (wrap_single_device)."""
    if len(devices) > 1 or spec.options["wrap_single_device"]:
        return None
    return {"wrapped": False, "baseline": f"plain model, as {original} at 1 GPU",
            "tower_devices": devices[:1]}
