"""The benchmark, equivalence and converge paths every Keras 2 tower runner shares, given the
runner's `make`: one traced fit step (placement), then timed fit steps; converge by fit per
epoch as seed 004 did (docs/runners/keras2_towers.md). Import after runners.tf.towers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras

from contract.reasons import code
from contract.result import join
from models import get_spec
from models import keras2_common as k2
from runners.common import Invalid, Spec, TimedWindow, Unavailable
from runners.converge import Recipe, load_splits, train_to_accuracy
from runners.tf import op_kinds
from runners.tf import placement as tfp
from runners.tf import towers as kt
from runners.tf.towers_input import arrays_source, make_source

Make = Callable[[Spec, list[str], str], tuple[kt.Built, dict[str, Any]]]
After = Callable[[kt.Built], dict[str, Any]]  # a runner's fields read from the trained model


class Clock(tf_keras.callbacks.Callback):
    """Drives the timed window at fit's batch ends (session.run returned the loss: the step has
    finished); counts train batches across fit's epochs."""

    def __init__(self, warmup: int, measure: int) -> None:
        super().__init__()
        self.window = TimedWindow(warmup, measure, on_start=self._start)
        self.start_iteration = 0

    def _start(self) -> None:
        self.start_iteration = int(kt.K.get_value(self.model.optimizer.iterations))

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self.window.step_begin()

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.window.step_done(float((logs or {})["loss"]))


# -- the traced step: placement and work per device -------------------------------------------


def conv_layers(template: Any) -> int:
    """The template's convolution layers (nested models' included): convolutions per tower step."""
    from tf_keras.src.layers.convolutional.base_conv import Conv

    return sum(isinstance(layer, Conv) for layer in template._flatten_layers(include_self=False))


def per_device_work(run_metadata: Any, towers: list[str], convs: int, copies: int = 1
                    ) -> dict[str, Any]:
    """What each device executed in the traced step, by op kind, beside what the original runs
    (one forward and one filter-gradient convolution per conv layer per tower device)."""
    kinds = tfp.executed_kinds_by_device(run_metadata)

    def of(kind: str) -> dict[str, int]:
        return {d: k[kind] for d, k in kinds.items() if k.get(kind)}

    expected = {tfp.device_key(d): convs for d in towers}
    backward = expected if copies == 1 else \
        {tfp.device_key(d): [convs, copies * convs] for d in towers}
    return {
        "forward_convs_per_device": of(op_kinds.CONV_FORWARD),
        "backward_convs_per_device": of(op_kinds.CONV_BACKPROP_FILTER),
        "input_grad_convs_per_device": of(op_kinds.CONV_BACKPROP_INPUT),
        "convs_per_tower": convs,
        "expected_work": {"forward_convs_per_device": expected,
                          "backward_convs_per_device": backward},
        "work_source": code("tf.towers_full_trace_work"),
    }


def placement_step(built: kt.Built, fit_args: dict[str, Any], devices: list[str],
                   gradient_copies: int = 1) -> dict[str, Any]:
    """Run one traced fit step (FULL_TRACE) and read it (traced_placement)."""
    built.model.fit(**fit_args, verbose=0)
    return traced_placement(built, devices, gradient_copies)


def traced_placement(built: kt.Built, devices: list[str], gradient_copies: int = 1
                     ) -> dict[str, Any]:
    """The traced step's placement and each device's executed convolutions; the step's callable
    then rebuilt without tracing. Invalid if a tower device did no compute."""
    placement = tfp.compute_ops_by_device(built.run_metadata)
    fn = built.model.train_function
    fn.run_options, fn.run_metadata = None, None
    fn._callable_fn = None  # rebuilt, untraced, on the next step (a warm-up step)
    missing = [d for d in devices if placement.get(tfp.device_key(d), 0) <= 0]
    if missing:
        raise Invalid(f"no compute ops ran on {missing}: TF placed the step on "
                      f"{sorted(placement)}")
    # the step's convolution weight gradients: as built in the graph, and as TF ran them
    # after its graph optimisations (common-subexpression elimination merges identical ones)
    backprop = sum(1 for g in tfp.partition_graphs(built.run_metadata) for node in g.node
                   if op_kinds.op_kind(node.op) == op_kinds.CONV_BACKPROP_FILTER)
    backprop_built = sum(1 for op in built.model.train_function.updates_op.graph
                         .get_operations()
                         if op_kinds.op_kind(op.type) == op_kinds.CONV_BACKPROP_FILTER)
    return {"placement": placement,
            "placement_source": code("tf.towers_partition_graphs"),
            "conv_backprop_filter_ops": backprop,
            "conv_backprop_filter_ops_built": backprop_built,
            **per_device_work(built.run_metadata, devices, conv_layers(built.template),
                              gradient_copies)}


# -- one run: its model and the fields benchmark and converge share ---------------------------


@dataclass
class TowerRun:
    """A tower runner's compiled model on the run's devices, and its record fields."""

    spec: Spec
    names: list[str]
    devices: list[dict[str, Any]]
    xla: dict[str, Any]
    input_mode: str
    built: kt.Built
    fields: dict[str, Any]

    @property
    def towers(self) -> list[str]:
        return list(self.fields.get("tower_devices") or self.names[:1])

    def trace(self) -> dict[str, Any]:
        """traced_placement of the traced step that just ran."""
        return traced_placement(self.built, self.towers, self.fields.get("gradient_copies", 1))

    def record(self, placement: dict[str, Any], api: str) -> dict[str, Any]:
        """What benchmark and converge both report: where the step ran, the model, the stack."""
        template = self.built.template
        return join(placement, {
            "replicas": len(placement.get("forward_convs_per_device", {})),
            "framework": kt.framework_versions(), "api": api, "devices": self.devices,
            "input": self.input_mode, "layout": kt.DATA_FORMAT, "dtype_policy": "float32",
            "params": k2.count_params_keras2(template),
            "flops_per_sample": k2.count_flops_keras2(template),
            "variables_device": template.weights[0].device,
        }, self.xla, self.fields, {"departs_from_original": kt.departures(self.spec)})


def benchmark(spec: Spec, make: Make, after: After | None = None) -> dict[str, Any]:
    """make's model: one traced placement step, then the timed steps in one fit call."""
    names, devices, xla = kt.setup(spec)
    input_mode = spec.options["input"]
    warmup, measure = spec.warmup_steps, spec.measure_steps
    source = make_source(spec, get_spec(spec.model), input_mode, 1 + warmup + measure)
    run = TowerRun(spec, names, devices, xla, input_mode, *make(spec, names, input_mode))
    built, staged = run.built, run.built.stager is not None
    if staged:  # a staged source has its first batch (not tf_data)
        kt.prime(built, *source.first())
    built.model.fit(**source.fit_args(1, staged), verbose=0)
    placement = run.trace()
    clock = Clock(warmup, measure)
    built.model.fit(**source.fit_args(warmup + measure, staged), callbacks=[clock], verbose=0)
    steps = int(kt.K.get_value(built.model.optimizer.iterations)) - clock.start_iteration
    batch = spec.global_batch_size
    return join(clock.window.summary(batch, steps * batch),
                {"loss_kind": "Keras 2 per-batch loss",
                 "placement_step": "one extra traced step before the warm-up"},
                run.record(placement, "tf_keras (Keras 2) in TF1 graph mode, fit"), source.info,
                after(built) if after else {})


def equivalence(spec: Spec, make: Make) -> dict[str, Any]:
    """One plain-SGD step through fit on the probe, by the benchmark's input option (a primed
    StagingArea holds the test's batch, so the step trains on it); weights saved after."""
    names, devices, xla = kt.setup(spec)
    input_mode = spec.options["input"]
    weights, x, y, lr = spec.equivalence_inputs()
    built, fields = make(replace(spec, model="probe"), names, input_mode)
    run = TowerRun(spec, names, devices, xla, input_mode, built, fields)
    k2.set_canonical_weights(built.template, weights)
    if input_mode == "tf_data":
        args: dict[str, Any] = {"x": tf.data.Dataset.from_tensors((x, y)).repeat(),
                                "steps_per_epoch": 1, "epochs": 1}
    else:
        kt.prime(built, x, y)
        args = arrays_source(x, y).fit_args(1, built.stager is not None)
    placement = placement_step(built, args, run.towers, fields.get("gradient_copies", 1))
    spec.save_equivalence_output(k2.get_canonical_weights(built.template))
    return {"replicas": len(placement["forward_convs_per_device"]),
            "framework": kt.framework_versions(),
            "devices": devices, "input": input_mode, **placement, **xla, **fields}


# -- mode converge ----------------------------------------------------------------------------


def converge_loss(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
    """The 2017 loss on the labels of the rows the towers trained on (kuza55's get_slice drops a
    short batch's remainder: those labels are left out too)."""
    rows = tf.shape(y_pred)[0]
    return kt.sparse_categorical_crossentropy(tf.reshape(y_true, [-1])[:rows], y_pred)


class StepLR(tf_keras.callbacks.Callback):
    """Seed 004's LearningRateScheduler made per step: lr_at(batch) set before each train batch;
    keeps each batch's loss and runs `after_first` once, after the traced first batch."""

    def __init__(self, lr_at: Callable[[int], float],
                 after_first: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.lr_at, self.after_first = lr_at, after_first
        self.losses: list[float] = []

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        kt.K.set_value(self.model.optimizer.lr, self.lr_at(batch))

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.losses.append(float((logs or {})["loss"]))
        if self.after_first is not None:
            hook, self.after_first = self.after_first, None
            hook()


class TowerConverge:
    """Mode converge's adapter: one fit call per epoch on the epoch's batches as numpy arrays,
    the rate set before every step (StepLR); evaluation by the template's predict."""

    def __init__(self, run: TowerRun) -> None:
        self.run, self.placement = run, {}
        self.batch = run.spec.global_batch_size

    def train_epoch(self, epoch: int, batches: list[Any], lr_at: Callable[[int], float]
                    ) -> float:
        x = np.concatenate([b.x for b in batches])
        y = np.concatenate([b.y for b in batches])
        steps = StepLR(lr_at, None if self.placement else
                       lambda: self.placement.update(self.run.trace()))
        try:
            self.run.built.model.fit(x, y, batch_size=self.batch, epochs=epoch + 1,
                                     initial_epoch=epoch, shuffle=False, callbacks=[steps],
                                     verbose=0)
        except tf.errors.InvalidArgumentError as exc:
            rows, towers = len(batches[-1].y), len(self.run.towers)
            if len(steps.losses) != len(batches) - 1 or rows // towers > 0 \
                    or not self.run.fields.get("wrapped"):
                raise
            # seed 002's empty tower: oneDNN's CPU Conv2D fails where a GPU puts NaN in BN
            lines = [line.strip() for line in str(exc).splitlines()]
            detail = next((line for line in lines if "INVALID_ARGUMENT" in line), lines[0])
            raise Invalid(f"the short last batch of epoch {epoch + 1} ({rows} rows over "
                          f"{towers} towers) left a tower no rows, and TF failed on the "
                          f"empty batch: {detail}") from exc
        if len(steps.losses) != len(batches):
            raise Invalid(f"fit ran {len(steps.losses)} steps of epoch {epoch + 1}, not the "
                          f"recipe's {len(batches)} batches")
        return float(np.mean(steps.losses))

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> float:
        probs = self.run.built.template.predict(x, batch_size=self.batch, verbose=0)
        return float(np.mean(np.argmax(probs, axis=-1) == y))

    def moving_stats(self) -> tuple[bool, str]:
        """(all finite, the first that is not) of the template's BatchNorm moving statistics."""
        variables = [v for layer in self.run.built.template._flatten_layers(include_self=False)
                     for name in ("moving_mean", "moving_variance")
                     if (v := getattr(layer, name, None)) is not None]
        if not variables:
            return True, "no BatchNorm layers"
        for v, value in zip(variables, kt.K.batch_get_value(variables), strict=True):
            bad = int(np.size(value) - np.isfinite(value).sum())
            if bad:
                return False, f"{v.name}: {bad} of {np.size(value)} values not finite"
        return True, f"{len(variables)} BatchNorm moving statistics finite"


def converge(spec: Spec, make: Make, after: After | None = None) -> dict[str, Any]:
    """Mode converge as seed 004 trained: TowerConverge on make's model with converge_loss and the
    recipe's SGD, initial weights seeded by tf_keras.utils.set_random_seed(recipe.seed)."""
    names, devices, xla = kt.setup(spec)
    input_mode = spec.options["input"]
    if input_mode != "feed_dict":
        raise Unavailable(f"mode converge feeds the recipe's numpy batches to fit (input "
                          f"feed_dict), not input {input_mode}")
    recipe = Recipe.of(spec)
    # sets Python's, tf_keras' and TF's graph seeds, all of which the initialisers draw from
    tf_keras.utils.set_random_seed(recipe.seed)
    run = TowerRun(spec, names, devices, xla, input_mode, *make(spec, names, input_mode))
    model = run.built.model
    options, _ = tfp.graph_run_options(full_trace=True)
    model.compile(optimizer=model.optimizer, loss=converge_loss, options=options,
                  run_metadata=run.built.run_metadata)
    adapter = TowerConverge(run)
    splits = load_splits(spec)
    result = train_to_accuracy(spec, adapter.train_epoch, adapter.evaluate,
                               adapter.moving_stats, splits=splits)
    batch = spec.global_batch_size
    short = len(splits.y_train) % batch if recipe.last_batch == "keep" else 0
    slicing = run.built.slicing
    return join(result, {
        # rows of a short kept last batch each tower trains on (seed 002's trap: 0 rows)
        "short_batch_rows_per_tower": (([short] if slicing is None else kt.split_rows(
            short, len(slicing.devices), slicing.remainder)) if short else None),
        "placement_step": "the run's first training step, traced",
        "loss_kind": "Keras 2 per-batch loss, mean over the epoch's steps",
        "evaluation": "the template's predict on the held-out split (inference mode)",
    }, run.record(adapter.placement,
                  "tf_keras (Keras 2) in TF1 graph mode, fit per epoch, LR per step by callback"),
        after(run.built) if after else {})
