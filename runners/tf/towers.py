"""The Keras 2 stack the tower runners share: tf_keras in a TF1 graph, the parallel model
built from a template as the 2017 strategies built it, Keras 2's updates (Keras2Network),
colocated gradients (Keras2SGD) and clipped loss. docs/runners/keras2_towers.md."""

from __future__ import annotations

import contextlib
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras is tf_keras here, never Keras 3
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402

sys.modules["keras"] = tf_keras  # the models' builders and keras_data import `keras`: Keras 2
tf.compat.v1.disable_eager_execution()

from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
from tensorflow.python.ops import data_flow_ops  # noqa: E402

from contract.catalogs.tf import RUNNERS as TF_RUNNERS  # noqa: E402
from contract.result import join  # noqa: E402
from models import get_spec, load_builder  # noqa: E402
from runners import converge  # noqa: E402
from runners.common import Invalid, Spec, Unavailable  # noqa: E402
from runners.tf import devices as tf_devices  # noqa: E402
from runners.tf.placement import graph_run_options  # noqa: E402

tfv1 = tf.compat.v1
K = tfv1.keras.backend  # tf_keras' v1 backend (TF_USE_LEGACY_KERAS): get_session, set_session
DATA_FORMAT = "channels_last"


def sparse_categorical_crossentropy(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
    """Keras 2.0-2.2's loss: the softmax output clipped to [1e-7, 1 - 1e-7], its log taken as
    logits (a merged tower output has no Softmax op for tf_keras to read the logits behind)."""
    eps = tf.constant(1e-7, y_pred.dtype)
    log_p = tf.math.log(tf.clip_by_value(y_pred, eps, 1 - eps))
    labels = tf.cast(tf.reshape(y_true, [-1]), tf.int64)
    return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=log_p)


def setup(spec: Spec) -> tuple[list[str], list[dict[str, Any]], dict[str, Any]]:
    """The run's device names and descriptions; a Keras session that has them, XLA off."""
    if spec.precision != "fp32":
        raise Invalid(f"{spec.runner} runs fp32 only, not {spec.precision}")
    names, devices = tf_devices.setup_devices(spec)
    config = tf_devices.session_config(spec)  # Keras 2's own session config, and N CPUs
    config.graph_options.optimizer_options.global_jit_level = tfv1.OptimizerOptions.OFF
    K.set_session(tfv1.Session(config=config))
    xla_flags = os.environ.get("TF_XLA_FLAGS", "")
    if "auto_jit" in xla_flags or "xla_auto" in xla_flags:
        raise Invalid(f"TF_XLA_FLAGS={xla_flags!r} turns XLA auto-clustering on")
    return names, devices, {"xla": False, "xla_setting": "session global_jit_level OFF, "
                            "no jit_compile (Keras 2 graph mode)"}


def framework_versions() -> dict[str, str]:
    return {"tensorflow": tf.__version__, "tf_keras": tf_keras.__version__,
            "numpy": np.__version__}


def build_template(model: str, device: str | None) -> Any:
    """The model from models/ built by Keras 2, its variables (and input placeholder) created
    under `device` (None: no device scope, TF's default placement)."""
    with tf.device(device) if device is not None else contextlib.nullcontext():
        return load_builder(model, "keras")(get_spec(model), data_format=DATA_FORMAT)


def slice_rows(x: tf.Tensor, index: int, parts: int, remainder: str) -> tf.Tensor:
    """Tower `index`'s rows of the batch, sized from the batch's runtime shape: B // parts rows,
    the last tower also taking the remainder when remainder == "last"."""
    batch = tf.shape(x)[0]
    step = batch // parts
    start = step * index
    if remainder == "last" and index == parts - 1:
        return x[start:]
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
    """How a strategy builds its parallel model: the tower devices, where each tower's rows are
    cut, where outputs merge, and who takes the remainder rows."""

    devices: list[str]
    merge_device: str
    slice_device: str | None = None
    remainder: str = "drop"
    scope: str = "tower"  # the towers' name scope prefix (multi_gpu_model: "replica")


def parallel_model(template: Any, recipe: Recipe | None, device: str, stager: Stager | None
                   ) -> tuple[Any, Any]:
    """(the model fit trains, the staged labels or None): the plain template (recipe None) or the
    template on each tower's slice, outputs concatenated on the merge device."""
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
    """A functional model running the updates Keras 2.0-2.2 ran: only its own layer calls' and
    the unconditional ones (docs/runners/keras2_towers.md, "Updates")."""

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


class Keras2SGD(tf_keras.optimizers.legacy.SGD):
    """tf_keras' legacy SGD, with the gradients Keras 2.2 took; `weight_decay` (mode converge's
    recipe, which Keras 2's SGD lacked) added to every gradient, g + wd x w, as torch's SGD."""

    def __init__(self, *args: Any, weight_decay: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.l2_decay = float(weight_decay)

    def get_gradients(self, loss: tf.Tensor, params: list[Any]) -> list[tf.Tensor]:
        # Keras 2.0-2.2's K.gradients: each gradient op on its forward op's device
        grads = tfv1.gradients(loss, params, colocate_gradients_with_ops=True)
        if any(g is None for g in grads):
            raise ValueError("a variable has no gradient")
        if self.l2_decay:
            grads = [g + self.l2_decay * p for g, p in zip(grads, params, strict=True)]
        return grads


@dataclass
class Built:
    """A compiled parallel (or plain) model ready for fit."""

    model: Any
    template: Any
    stager: Stager | None
    run_metadata: Any
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
    model.compile(optimizer=optimizer, loss=sparse_categorical_crossentropy, **kwargs)
    return Built(model, template, stager, run_metadata, recipe)


def prime(built: Built, x: np.ndarray, y: np.ndarray) -> None:
    """Put one batch into every StagingArea (the step after reads it)."""
    if built.stager is None:
        return
    feed = {built.model.inputs[0]: x, built.model.inputs[1]: y}
    K.get_session().run(built.stager.puts, feed_dict=feed)


def optimizer(spec: Spec, cls: type[Keras2SGD] = Keras2SGD, **kwargs: Any) -> Keras2SGD:
    """The benchmark's SGD (momentum 0.9), or plain SGD at the equivalence test's rate; `cls`
    a strategy's own Keras2SGD (kwargs its own arguments)."""
    if spec.mode == "equivalence":  # the test's plain SGD at its learning rate
        return cls(learning_rate=float((spec.equivalence or {})["learning_rate"]), **kwargs)
    if spec.mode == "converge":  # the recipe's SGD; its rate is set before every step
        recipe = converge.Recipe.of(spec)
        if recipe.optimizer != "sgd":
            raise Unavailable(f"optimizer {recipe.optimizer!r}: the tower runners train with "
                              "Keras 2's SGD")
        return cls(learning_rate=recipe.base_lr, momentum=recipe.momentum,
                   weight_decay=recipe.weight_decay, **kwargs)
    return cls(learning_rate=0.01, momentum=0.9, **kwargs)


def template_device(value: str, devices: list[str]) -> str | None:
    """Where a template is built: "default" no device scope, "cpu" /cpu:0, "gpu" the first tower
    device."""
    if value == "default":
        return None
    return "/cpu:0" if value == "cpu" else devices[0]


def departures(spec: Spec) -> list[str]:
    """"name=value" of the options that differ from the original's own usage (the catalog's
    defaults); the real-data loader, the harness's own, left out."""
    info = next(r for r in TF_RUNNERS if r.name == spec.runner)
    return [f"{name}={spec.options[name]}" for name, opt in info.options.items()
            if name != "loader" and name in spec.options and spec.options[name] != opt.default]


def plain_baseline(spec: Spec, devices: list[str], input_mode: str, original: str,
                   fields: dict[str, Any]) -> tuple[Built, dict[str, Any]] | None:
    """At one device, the plain model compiled on it and `fields` with its own (an original
    that refuses or bypasses one device); None with wrap_single_device or several devices."""
    if len(devices) > 1 or spec.options["wrap_single_device"]:
        return None
    template = build_template(spec.model, devices[0])
    built = compile_model(template, None, devices[0], input_mode, optimizer(spec))
    return built, join(fields, {"wrapped": False, "baseline": f"plain model, as {original} at "
                                "1 GPU", "tower_devices": devices[:1]})


def split_rows(rows: int, parts: int, remainder: str) -> list[int]:
    """The rows of a batch of `rows` each of `parts` towers takes (slice_rows' rule)."""
    step = rows // parts
    return [step] * (parts - 1) + [rows - (parts - 1) * step if remainder == "last" else step]
