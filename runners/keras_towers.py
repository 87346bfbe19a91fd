"""Towers on devices for the 2017 Keras make_parallel / multi_gpu_model runners, on Keras 3.

One template model (a functional model from models/) owns the variables. `TowerModel` is a
`keras.Model` subclass whose `call()` slices the batch, calls the *same* template (shared
weights, BatchNorm statistics included) once per device under `tf.device(device)`, and
concatenates the tower outputs on a merge device. In Keras 3 a functional model re-runs
`call()` when the train step is traced, so a `tf.device` scope around graph construction is
lost; doing the slicing and the device scopes inside `call()` puts them into the traced train
step, where they take effect.

Gradients: the merged-loss train step differentiates with `tf.gradients`, which in TF 2 always
colocates each gradient op with its forward op (Keras 2's `colocate_gradients_with_ops=True`),
so each tower's backward pass runs on the tower's device and the per-tower contributions to a
shared variable's gradient are summed where TF aggregates them. With `average_gradients` each
tower computes its own loss and gradients on its device (a GradientTape under the tower's
device scope) and the per-tower gradients are averaged on the parameter device.

Data: the synthetic global batch, or real data (option `loader`: tf.data over the TFRecord
shards, runners/tf_data.py, or the Keras 3 PyDataset of runners/keras_data.py); either way fit
feeds the whole global batch to the TowerModel, which slices it as the runner's recipe does.

Imports TensorFlow and Keras 3: only runner child processes import this module.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from models import get_spec, load_builder
from models.keras_common import (
    count_flops_keras,
    count_params_keras,
    get_canonical_weights,
    set_canonical_weights,
)
from runners.common import Invalid, Spec, load_equivalence_inputs, save_equivalence_output
from runners.tf_common import fit_input, framework_versions, setup_devices, timed_fit

DATA_FORMAT = "channels_last"
LOSS = "sparse_categorical_crossentropy"
DATA_PLACEMENT = {
    "synthetic": "one synthetic global batch in tf.data, fed whole to the tower model",
    "real": "global batches from the input pipeline on the host, fed whole to the tower model, "
            "which slices them as the runner's recipe does",
}


def split_sizes(batch: int, parts: int, remainder: str) -> list[int]:
    """Rows per tower for a batch of `batch` rows over `parts` towers.

    remainder="drop": every tower gets batch // parts rows, the rest is dropped (kuza55,
    avolkov1); remainder="last": the last tower also takes the remainder (multi_gpu_model)."""
    if parts < 1 or batch < parts:
        raise ValueError(f"cannot split a batch of {batch} over {parts} towers")
    size = batch // parts
    if remainder == "drop":
        return [size] * parts
    if remainder == "last":
        return [size] * (parts - 1) + [batch - (parts - 1) * size]
    raise ValueError(f"remainder must be 'drop' or 'last': {remainder!r}")


def require_even_split(global_batch: int, parts: int, runner: str) -> None:
    """Invalid unless the global batch divides by the tower count: `runner` gives every tower
    batch // parts rows and would silently drop the remainder."""
    if global_batch % parts:
        raise Invalid(
            f"{runner} gives each of {parts} towers {global_batch // parts} rows and would "
            f"silently drop the remaining {global_batch % parts} of the global batch of "
            f"{global_batch}; use a global batch divisible by {parts}")


def slice_batch(x: tf.Tensor, index: int, parts: int, remainder: str) -> tf.Tensor:
    """Tower `index`'s rows of x, as kuza55/multi_gpu_model's get_slice: a tf.slice of the
    leading axis built from the batch's runtime size (the traced batch size may be None)."""
    batch = tf.shape(x)[0]
    size = batch // parts
    start = size * index
    if remainder == "last" and index == parts - 1:
        size = batch - start
    elif remainder not in ("drop", "last"):
        raise ValueError(f"remainder must be 'drop' or 'last': {remainder!r}")
    return x[start:start + size]


class TowerModel(keras.Model):
    """`template` called once per device on its slice of the batch, outputs concatenated.

    devices: one TF device name per tower. slice_device: where the batch is sliced (None:
    inside each tower's device scope, the whole batch travels to every device first, as in
    kuza55 and multi_gpu_model). merge_device: where outputs are concatenated and the merged
    loss is computed. prefetch: copy each slice onto its tower's device as an explicit op
    ahead of the tower (the stand-in for avolkov1's StagingArea). average_gradients: per-tower
    losses and gradients, averaged on merge_device, instead of one loss over the merged output.
    """

    def __init__(self, template: keras.Model, devices: list[str], *, merge_device: str,
                 slice_device: str | None = None, remainder: str = "drop",
                 prefetch: bool = False, average_gradients: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(name=kwargs.pop("name", f"{template.name}_towers"), **kwargs)
        self.template = template
        self.devices = list(devices)
        self.merge_device = merge_device
        self.slice_device = slice_device
        self.remainder = remainder
        self.prefetch = prefetch
        self.average_gradients = average_gradients
        self.built = True  # the template is built; the towers add no variables

    # -- forward -----------------------------------------------------------------------------

    def tower_inputs(self, tensors: list[tf.Tensor]) -> list[list[tf.Tensor]]:
        """Per tower, its slice of each tensor, placed as the strategy places it."""
        n = len(self.devices)
        if self.slice_device is None:  # sliced on each tower's device
            out = []
            for i, device in enumerate(self.devices):
                with tf.device(device):
                    out.append([slice_batch(t, i, n, self.remainder) for t in tensors])
            return out
        with tf.device(self.slice_device):
            out = [[slice_batch(t, i, n, self.remainder) for t in tensors] for i in range(n)]
        if self.prefetch:
            staged = []
            for i, device in enumerate(self.devices):
                with tf.device(device):
                    staged.append([tf.identity(t, name=f"stage_{i}") for t in out[i]])
            out = staged
        return out

    def call(self, x: tf.Tensor, training: bool | None = None) -> tf.Tensor:
        outputs = []
        for i, (device, (xi,)) in enumerate(zip(self.devices, self.tower_inputs([x]),
                                                strict=True)):
            with tf.device(device), tf.name_scope(f"tower_{i}"):
                outputs.append(self.template(xi, training=training))
        with tf.device(self.merge_device):
            merged = tf.concat(outputs, axis=0, name="merge")
            logits = [getattr(out, "_keras_logits", None) for out in outputs]
            if all(lg is not None for lg in logits):
                # Keras' crossentropy reads the logits behind a softmax output (numerically
                # stable, no 1e-7 clipping); keep them behind the merged output too, so the
                # merged loss is the one the template alone (or one tower) would compute.
                merged._keras_logits = tf.concat(logits, axis=0, name="merge_logits")
        return merged

    # -- training ----------------------------------------------------------------------------

    def train_step(self, data: Any) -> dict[str, Any]:
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        variables = self.trainable_variables
        if self.average_gradients:
            loss, grads, y_pred = self._averaged_step(x, y, variables)
        else:
            y_pred = self(x, training=True)
            with tf.device(self.merge_device):
                loss = self.compute_loss(x=x, y=y, y_pred=y_pred, training=True)
            # TF 2 tf.gradients colocates every gradient op with its forward op
            # (colocate_gradients_with_ops=True, as Keras 2 asked for): towers backprop on
            # their own devices.
            grads = tf.gradients(loss, [v.value for v in variables])
        with tf.device(self.merge_device):
            self.optimizer.apply_gradients(zip(grads, variables, strict=True))
        return self._update_metrics(loss, y, y_pred)

    def _averaged_step(self, x: tf.Tensor, y: tf.Tensor, variables: list[keras.Variable]
                       ) -> tuple[tf.Tensor, list[tf.Tensor], tf.Tensor]:
        losses, tower_grads, preds = [], [], []
        for i, (device, (xi, yi)) in enumerate(zip(self.devices, self.tower_inputs([x, y]),
                                                   strict=True)):
            with tf.device(device), tf.name_scope(f"tower_{i}"):
                with tf.GradientTape() as tape:
                    pred = self.template(xi, training=True)
                    loss = self.compute_loss(x=xi, y=yi, y_pred=pred, training=True)
                tower_grads.append(tape.gradient(loss, variables))
            losses.append(loss)
            preds.append(pred)
        with tf.device(self.merge_device):
            grads = [tf.add_n(list(g)) / len(self.devices) for g in zip(*tower_grads,
                                                                         strict=True)]
            return tf.add_n(losses) / len(self.devices), grads, tf.concat(preds, axis=0)

    def _update_metrics(self, loss: tf.Tensor, y: tf.Tensor, y_pred: tf.Tensor
                        ) -> dict[str, Any]:
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {m.name: m.result() for m in self.metrics}


# -- shared runner plumbing -------------------------------------------------------------------


def ps_device(spec: Spec, devices: list[str]) -> str:
    """The parameter device of the `ps` option: /cpu:0, or the first tower device."""
    return "/cpu:0" if spec["options"].get("ps", "cpu") == "cpu" else devices[0]


def build_template(model: str, device: str | None) -> keras.Model:
    """The model from models/ (channels_last), its variables created under `device`."""
    build = load_builder(model, "keras")
    if device is None:
        return build(get_spec(model), data_format=DATA_FORMAT)
    with tf.device(device):
        return build(get_spec(model), data_format=DATA_FORMAT)


def variable_device(model: keras.Model) -> str:
    """Where the model's first variable lives, as TF names the device."""
    return model.weights[0].value.device


def benchmark_towers(spec: Spec, make: Callable[[Spec, list[str]], tuple[TowerModel, keras.Model]],
                     extra: dict[str, Any] | None = None,
                     after: Callable[[keras.Model], dict[str, Any]] | None = None
                     ) -> dict[str, Any]:
    """The benchmark every tower runner shares: make(spec, device names) -> (TowerModel,
    template); compile, time model.fit on the run's data (the synthetic batch, or global
    batches of real data from the `loader` option's pipeline), report. `after(template)` runs
    once the timed window is over; its dict joins the result."""
    if spec["precision"] != "fp32":
        raise Invalid(f"{spec['runner']} runs fp32 only, not {spec['precision']}")
    names, devices = setup_devices(spec)
    model, template = make(spec, names)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.01, momentum=0.9), loss=LOSS)
    data, data_info = fit_input(spec, get_spec(spec["model"]), DATA_FORMAT,
                                spec["warmup_steps"] + spec["measure_steps"])
    timing = timed_fit(spec, model, data)
    return {
        **timing,
        "replicas": len(names),
        "framework": framework_versions(),
        "devices": devices,
        "layout": DATA_FORMAT,
        "dtype_policy": "float32",
        "params": count_params_keras(template),
        "flops_per_sample": count_flops_keras(template),
        "tower_devices": list(model.devices),
        "variables_device": variable_device(template),
        "merge_device": model.merge_device,
        "slice_device": model.slice_device or "each tower's device",
        "data_placement": DATA_PLACEMENT[spec["data"]],
        **data_info,
        **(extra or {}),
        **(after(template) if after else {}),
    }


def equivalence_towers(spec: Spec,
                       make: Callable[[Spec, list[str]], tuple[TowerModel, keras.Model]]
                       ) -> dict[str, Any]:
    """One plain SGD step through model.fit on the probe; the template's weights saved after."""
    names, devices = setup_devices(spec)
    weights, x, y, lr = load_equivalence_inputs(spec)
    model, template = make({**spec, "model": "probe"}, names)
    set_canonical_weights(template, weights)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=lr), loss=LOSS)
    ds = tf.data.Dataset.from_tensors((x, y))
    model.fit(ds, epochs=1, steps_per_epoch=1, verbose=0, shuffle=False)
    save_equivalence_output(spec, get_canonical_weights(template))
    return {"replicas": len(names), "framework": framework_versions(), "devices": devices}


def check_saveable(template: keras.Model) -> bool:
    """Save the template to a .keras file, load it back, and check every weight matches
    (seed 002 tip 4: save the template, not the parallel wrapper). Invalid if not."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "template.keras")
        template.save(path)
        loaded = keras.models.load_model(path, compile=False)
    ours, theirs = template.get_weights(), loaded.get_weights()
    if len(ours) != len(theirs) or not all(
            a.shape == b.shape and np.array_equal(a, b) for a, b in zip(ours, theirs,
                                                                         strict=True)):
        raise Invalid("the saved and reloaded template's weights differ from the template's")
    return True
