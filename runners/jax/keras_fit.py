"""Keras 3 on JAX trained with model.fit, shared by the family's Keras runners: DataParallel over
the run's devices, the clock (a TimedWindow callback; its warm-up settled past JAX's compiles),
the probe of the batches Keras hands its jitted step, the timed fit and what JAX reports of its
window. Imports no framework at module level."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from contract.reasons import code
from runners import memory
from runners.common import Invalid, Spec, TimedWindow, Unavailable, finite
from runners.jax.common import MECHANISM, placement, setup_devices, sharding_record
from runners.jax.window_evidence import WindowEvidence

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
    memory.baseline(code("memory.baseline_keras_jax"))
    across_nodes = {"auto_shard_dataset": False} if spec.num_nodes > 1 else {}
    distribution = keras.distribution.DataParallel(devices=devices, **across_nodes)
    keras.distribution.set_distribution(distribution)
    return keras, distribution, described

def batch_sharding(distribution: Any, shape: tuple[int, ...]) -> Any:
    """The jax sharding DataParallel gives an input batch of this shape."""
    return distribution.get_data_layout(shape).backend_layout

SETTLE_CALLS = 3  # train-function calls the settle rule may add to the warm-up at most


@dataclass
class Warmup:
    """The warm-up of a timed fit: `steps` (the input may have run it past Keras' second-epoch
    compile: `why`), the steps per train-function call, the steps the settle rule added, and
    whether it reached its bound with JAX still compiling (`capped`)."""

    steps: int
    per_call: int = 1
    why: str | None = None
    added: int = 0
    capped: bool = False


class FitWindow:
    """The clock's bookkeeping, apart from Keras: its TimedWindow, the window's JAX evidence
    and the settle rule: when JAX compiled during the call that would end the warm-up, the
    warm-up runs one more call (SETTLE_CALLS at most; `on_extend` hears of each)."""

    def __init__(self, warmup: Warmup, measure: int, evidence: WindowEvidence | None,
                 on_start: Callable[[], None]) -> None:
        self.warmup, self.evidence, self.on_extend = warmup, evidence, lambda: None
        self.window = TimedWindow(warmup.steps, measure, warmup.per_call,
                                  on_start=self._start)
        self._on_start, self._seen = on_start, 0

    def _start(self) -> None:
        self._on_start()
        if self.evidence is not None:
            self.evidence.open()

    def _settle(self) -> None:
        if self.evidence is None or self.window.started:
            return
        compiled, self._seen = len(self.evidence.compiled) > self._seen, len(
            self.evidence.compiled)
        w = self.warmup
        if not compiled or (self.window.calls + 1) * w.per_call < self.window.warmup:
            return
        if w.added >= SETTLE_CALLS * w.per_call:
            w.capped = True
            return
        self.window.warmup += w.per_call
        w.added += w.per_call
        self.on_extend()

    def call_done(self, loss: float | None) -> bool:
        """One train-function call has finished on every device: settle, tick; whether the
        window is done (its evidence closed then)."""
        self._settle()
        self.window.step_done(loss)
        if self.window.done and self.evidence is not None:
            self.evidence.close()
        return self.window.done


def make_clock(warmup: int | Warmup, measure: int, on_begin: Callable[[Any], None],
               evidence: WindowEvidence | None = None) -> keras.callbacks.Callback:
    """A callback marking the timed window of fit (a FitWindow: `fit_window`), synchronised on
    every device per train-function call; it stops fit after warmup + measure steps (counted
    over epochs), and hands the model to `on_begin` when training begins (fit has made its
    train function by then). With `evidence`, JAX's compiles are heard from then on."""
    import jax

    keras = import_keras()
    warmup = warmup if isinstance(warmup, Warmup) else Warmup(warmup)

    class JaxFitClock(keras.callbacks.Callback):
        """Clock readings after each measured call has finished on every device;
        `start_iteration`: the optimizer's step counter when the clock started."""

        def __init__(self) -> None:
            super().__init__()
            self.fit_window = FitWindow(warmup, measure, evidence, self._read_iteration)
            self.window = self.fit_window.window
            self.start_iteration: int | None = None
            self._counter = 0
            self._live: jax.Array | None = None  # the counter after the last step, ready

        def on_train_begin(self, logs: dict | None = None) -> None:
            # self._model, not self.model: the property syncs the jax state into the variables
            optimizer = self._model.optimizer
            self._counter = next(i for i, v in enumerate(optimizer.variables)
                                 if v is optimizer.iterations)
            on_begin(self._model)
            if evidence is not None:
                evidence.listen()

        def _read_iteration(self) -> None:
            # before the first step the variables hold the counter; after one, the live state
            self.start_iteration = int(self._model.optimizer.iterations.numpy()
                                       if self._live is None else self._live)

        def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
            if warmup.steps == 0 and not self.window.started:
                self.window.start()

        def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
            # the step counter in the state the last step returned (not yet in the variables),
            # waited for on every device
            state = getattr(self._model, "_jax_state", None)
            if not state:
                raise RuntimeError(f"keras {keras.__version__}'s jax trainer exposes no "
                                   "_jax_state to wait on")
            self._live = state["optimizer_variables"][self._counter].block_until_ready()
            if self.fit_window.call_done((logs or {})["loss"]):
                self._model.stop_training = True

    return JaxFitClock()

class TrainFunctionProbe:
    """Wraps model.train_function (Keras' step over its epoch iterator; fit looks it up at every
    step) to look at the batch Keras passes its jitted step when `wants()`: `see(x)` gets its
    inputs (a jax.Array as Keras' trainer distributed it; a call of steps_per_execution steps
    shows its first batch). install(model) once fit has made the function; fit keeps it from
    one call to the next, so it is wrapped once."""

    def __init__(self) -> None:
        self.calls = 0
        self._wrapped: Any = None

    def wants(self) -> bool:
        raise NotImplementedError

    def see(self, x: Any) -> None:
        raise NotImplementedError

    def install(self, model: keras.Model) -> None:
        if self._wrapped is not None and model.train_function is self._wrapped:
            return
        inner = model.train_function

        def observed(state: Any, iterator: Iterator[Any]) -> Any:
            if self.wants():
                data = next(iterator)
                self.see(data[0])  # (x, y[, sample_weight])
                iterator = itertools.chain((data,), iterator)
            self.calls += 1
            return inner(state, iterator)

        model.train_function = self._wrapped = observed

class BatchPlacement(TrainFunctionProbe):
    """Where the batch of call `index` lies: {device: rows}, and its sharding; delay() moves
    the index one call on (the warm-up ran one more)."""

    def __init__(self, index: int) -> None:
        super().__init__()
        self.index, self.placement, self.sharding = index, None, None

    def wants(self) -> bool:
        return self.calls == self.index

    def delay(self) -> None:
        self.index += 1

    def see(self, x: Any) -> None:
        self.placement, self.sharding = placement(x), sharding_record(x.sharding)

class EpochRows(TrainFunctionProbe):
    """The rows per device of every batch, added up while `active`."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, int] = {}
        self.active = True

    def wants(self) -> bool:
        return self.active

    def see(self, x: Any) -> None:
        for device, rows in placement(x).items():
            self.rows[device] = self.rows.get(device, 0) + rows

PLACEMENT_SOURCE = code("jax.keras_fit_rows_first_timed")

def fit_steps(spec: Spec, model: keras.Model, feed: dict[str, Any], warmup: Warmup | None = None,
              evidence: WindowEvidence | None = None) -> tuple[Any, Any]:
    """model.fit(**feed) for warmup + measure steps with the clock and the placement probe of
    the first timed call's batch (its index moved by the settle rule)."""
    warmup = warmup or Warmup(spec.warmup_steps)
    probe = BatchPlacement(warmup.steps // warmup.per_call)
    clock = make_clock(warmup, spec.measure_steps, probe.install, evidence)
    clock.fit_window.on_extend = probe.delay
    try:
        model.fit(**feed, callbacks=[clock], verbose=0)
    finally:
        if evidence is not None:
            evidence.close()
    return clock, probe

def fit_one_step(spec: Spec, model: keras.Model, feed: dict[str, Any]
                 ) -> tuple[float, BatchPlacement]:
    """model.fit(**feed) for exactly one step (the equivalence step), checked by the
    optimizer's step counter: its loss and the placement probe of its batch."""
    clock, probe = fit_steps(replace(spec, warmup_steps=0, measure_steps=1), model, feed)
    if int(model.optimizer.iterations.numpy()) != 1 or probe.placement is None:
        raise Invalid("fit did not run exactly one step")
    return finite(clock.window.losses[0]), probe

def warmup_fields(warmup: Warmup, asked: int) -> dict[str, Any]:
    """warmup_steps_run, and warmup_extended where the input or the settle rule extended it
    (the steps it added, its bound, and whether JAX still compiled at the bound)."""
    why = [warmup.why] if warmup.why else []
    if warmup.added:
        bound = f"{SETTLE_CALLS * warmup.per_call} at most"
        if warmup.capped:
            bound += ", reached with JAX still compiling"
        why.append(f"{warmup.added} more step(s) ({bound}): "
                   f"{code('jax.keras_settle_compiles')}")
    out: dict[str, Any] = {"warmup_steps_run": warmup.steps + warmup.added}
    if why:
        out["warmup_extended"] = f"{asked} -> {warmup.steps + warmup.added}: " + "; ".join(why)
    return out

def timed_fit(spec: Spec, model: keras.Model, feed: dict[str, Any], warmup: Warmup | None = None
              ) -> dict[str, Any]:
    """model.fit for warmup + measure steps: the timing summary, samples counted from the
    optimizer's step counter, the losses, the placement of the first timed batch, the
    warm-up run and what JAX reports of the window (window_evidence.py)."""
    warmup = warmup or Warmup(spec.warmup_steps)
    evidence = WindowEvidence()
    clock, probe = fit_steps(spec, model, feed, warmup, evidence)
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
        "steps_per_execution": int(model.steps_per_execution),  # as Keras holds it
        **warmup_fields(warmup, spec.warmup_steps),
        **evidence.record(steps),
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

def keras_counts(model: keras.Model) -> tuple[int, int]:
    """(parameters, forward FLOPs per sample) as models.keras_common counts a CNN's (the
    template's runner)."""
    from models.keras_common import count_flops_keras, count_params_keras

    return count_params_keras(model), count_flops_keras(model)
