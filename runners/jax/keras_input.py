"""What keras_jax and keras_model_parallel hand model.fit (option `input`): numpy (host data Keras
lays out itself every step) or preplaced (batches already in the distribution's layout)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

from contract.reasons import code
from runners.common import Invalid, Spec
from runners.jax.common import allgather_json, device_batch
from runners.jax.keras_fit import SETTLE_CALLS
from runners.real_data import RealData, describe

SYNTHETIC_PLACEMENT = code("jax.keras_synthetic_on_devices")
ARRAYS_PLACEMENT = code("jax.keras_numpy_arrays")
INPUTS = ("numpy", "preplaced")
HOST_DATA_CAP = 2 << 30  # bytes of synthetic numpy data at most


def preplaced(x: Any, y: Any, steps: int) -> dict[str, Any]:
    """fit's data arguments for one global batch already on the devices in DataParallel's
    layout, yielded for ever by a generator (what fit takes), `steps` per epoch."""
    return {"x": (batch for batch in itertools.repeat((x, y))), "steps_per_epoch": steps}


def per_call(spec: Spec) -> int:
    """Steps per train-function call: the option steps_per_execution (keras_jax), else 1."""
    return int(spec.options.get("steps_per_execution", 1))


def fed_steps(spec: Spec) -> int:
    """The steps fit is given: warm-up and measured ones, and the settle rule's headroom
    (keras_fit.SETTLE_CALLS calls), so that fit never runs out before the clock stops it."""
    return spec.warmup_steps + spec.measure_steps + SETTLE_CALLS * per_call(spec)


def noting_labels(batches: Iterator[Any], index: int, noted: list[Any], span: int = 0
                  ) -> Iterator[Any]:
    """The batches unchanged; the labels of batches `index` to `index + span` go to `noted`
    (the first timed step's is noted[the steps the settle rule added])."""
    for i, (x, y) in enumerate(batches):
        if index <= i <= index + span:
            noted.append(y)
        yield x, y

def warmup_past_recompile(warmup: int, measure: int, epoch_batches: int) -> int:
    """The warm-up steps that keep the first step of the second epoch (where Keras' jax trainer
    compiles its step again) out of the timed window: `warmup`, unless the window would hold
    that step; then up to and including it."""
    if epoch_batches >= warmup + measure or warmup > epoch_batches:
        return warmup
    return epoch_batches + 1


def host_dataset(model_spec: Any, global_batch: int, steps: int, processes: int = 1,
                 multiple: int = 1) -> dict[str, Any]:
    """The synthetic numpy dataset a Keras user would hand fit: K global batches of random
    images and labels (K = steps, or as many as fit the memory cap), and fit's batch_size and
    shuffle (fit_input sets the epochs, from the warm-up it settles on); K a multiple of
    `multiple` (steps per call: an epoch ends on a whole call). Across `processes`
    (a multi-node run) each holds its own rows of every batch (its share, a seed of its own)
    and K is the smallest over the processes, so that every process runs the same steps."""
    import numpy as np

    batch = global_batch // processes
    tokens = model_spec.input_kind == "tokens"
    sample = model_spec.input_shape[0] + 1 if tokens else int(np.prod(model_spec.input_shape))
    batch_bytes = batch * sample * 4
    free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    k = max(1, min(steps, min(HOST_DATA_CAP, free // 4) // batch_bytes))
    k = max(multiple, k - k % multiple)
    seed = 0
    if processes > 1:
        import jax

        # the smallest K of every process's, so that all run the same steps
        k, seed = min(int(v) for v in allgather_json(int(k))), jax.process_index()
    rng = np.random.default_rng(seed)
    if tokens:  # ids (rows, T + 1): inputs ids[:, :-1], next-token targets ids[:, 1:]
        ids = rng.integers(0, model_spec.num_classes, (k * batch, sample), dtype=np.int32)
        return {"x": ids[:, :-1], "y": ids[:, 1:], "batch_size": batch, "shuffle": True}
    x = rng.standard_normal((k * batch, *model_spec.input_shape), dtype=np.float32)
    y = rng.integers(0, model_spec.num_classes, k * batch, dtype=np.int32)
    return {"x": x, "y": y, "batch_size": batch, "shuffle": True}


def input_mode(spec: Spec) -> str:
    """The option `input`, checked."""
    mode = spec.options["input"]
    if mode not in INPUTS:
        raise Invalid(f"input must be one of {INPUTS}, not {mode!r}")
    return mode


def fit_input(spec: Spec, data: RealData | None, model_spec: Any, shardings: tuple[Any, Any],
              noted: list[Any]) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """(fit's data arguments, what the record says about the input, the iterator to close or
    None) for the option `input` over synthetic data, the Grain pipeline or the PyDataset."""
    mode = input_mode(spec)
    if data is None and mode == "numpy":
        return host_input(spec, model_spec) + (None,)
    if data is None:
        x, y = device_batch(model_spec, spec.global_batch_size, shardings)
        return (preplaced(x, y, fed_steps(spec)),
                {"input": mode, "data_placement": SYNTHETIC_PLACEMENT}, None)
    return real_input(spec, data, model_spec, shardings, noted)


def host_input(spec: Spec, model_spec: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """fit's arguments for the synthetic numpy dataset (host_dataset), its epochs set from the
    warm-up that keeps the second epoch's recompile out of the window (whole calls); the
    record's lines (warmup_steps_run, and warmup_extended's reason where it was extended)."""
    calls = per_call(spec)
    feed = host_dataset(model_spec, spec.global_batch_size, fed_steps(spec), spec.num_nodes,
                        calls)
    k = len(feed["x"]) // feed["batch_size"]
    warmup = warmup_past_recompile(spec.warmup_steps,
                                   spec.measure_steps + SETTLE_CALLS * calls, k)
    warmup = -(-warmup // calls) * calls
    feed["epochs"] = -(-(warmup + spec.measure_steps + SETTLE_CALLS * calls) // k)
    record = {"input": "numpy", "data_placement": ARRAYS_PLACEMENT, "host_dataset": {
        "batches": k, "epochs": feed["epochs"], "shuffle": True},
        "warmup_steps_run": warmup}
    if spec.num_nodes > 1:
        record["data_placement"] = code("jax.keras_numpy_arrays_per_process")
        record["host_dataset"]["rows_per_process"] = feed["batch_size"]
    if warmup != spec.warmup_steps:
        record["warmup_extended"] = (
            f"the host data holds {k} batches, so step {k + 1} opens the second epoch; "
            f"{code('jax.keras_second_epoch_compiles')}")
    return feed, record


def real_input(spec: Spec, data: RealData, model_spec: Any, shardings: tuple[Any, Any],
               noted: list[Any]) -> tuple[dict[str, Any], dict[str, Any], Any]:
    """fit_input for real data: the PyDataset (loader keras) or the Grain pipeline's numpy or
    preplaced batches, the first timed batch's labels noted."""
    global_batch, mode = spec.global_batch_size, spec.options["input"]
    steps = fed_steps(spec)
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
            "data_placement": code("jax.keras_pydataset_batches")}, None
    from runners.jax.data import device_batches, host_iterator

    if mode == "numpy":
        batches, line = host_iterator(data, size, global_batch, "numpy batches to Keras fit, "
                                      "which lays each out over the devices itself")
        where = code("jax.keras_grain_host_batches")
    else:
        batches, line = device_batches(data, size, global_batch, *shardings)
        where = code("jax.keras_grain_device_put")
    labelled = noting_labels(batches, spec.warmup_steps, noted, SETTLE_CALLS * per_call(spec))
    return {"x": labelled, "steps_per_epoch": steps}, {
        **record, "input_pipeline": line, "data_placement": where}, batches
