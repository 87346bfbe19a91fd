"""The run of the Flax step that jax_native and jax_fsdp share (`FlaxRun`): devices, model,
shardings, input, the timed window, the equivalence step and the record; a runner passes its
`Layout`."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from contract.catalogs.jax import ATTENTION_IMPLEMENTATION, attention_applies, attention_problem
from contract.reasons import code
from contract.result import join
from models import get_spec, load_builder, model_fields, spec_of
from runners.common import Spec, Unavailable, finite, timed_loop
from runners.jax import common, compiled_evidence, flax_step
from runners.jax.cross_entropy import CrossEntropy
from runners.jax.data import grain_fields
from runners.jax.flax_step import BATCHNORM_RECORD
from runners.jax.state import compute_dtype, precision_record, state_record
from runners.memory import model_state_jax
from runners.real_data import TOKENS_REAL, RealData, describe, open_for_model

VERSIONS = ("flax", "optax")
PLACEMENT_SOURCE = ("rows of the first timed batch per device, from the batch jax.Array's "
                    "addressable_shards")
MULTI_NODE_REAL_DATA = (
    "data: real across nodes: the Grain pipeline (runners/jax/data.py) makes whole global "
    "batches, so every process would decode all of each batch; a per-process shard of the file "
    "stream is not built yet")


@dataclass
class FlaxRun:
    """A run's devices, its Flax model (built as the benchmark builds it) and the 1-D mesh's
    shardings; `counted`: describe()'s counts of a user's model (None for a built-in), whose
    bf16 casts its params and inputs inside the step (`cast`)."""

    spec: Spec
    model_spec: Any
    devices: list[Any]
    described: list[dict[str, Any]]
    model: Any = None
    counted: dict[str, Any] | None = None
    dtype: Any = None
    cast: Any = None
    replicated: Any = None
    batch: Any = None
    params: int = 0
    loss: CrossEntropy | None = None

    @classmethod
    def start(cls, spec: Spec, model_spec: Any) -> FlaxRun:
        """The run's devices, its batch split over them, its loss (the `cross_entropy` option;
        float32 for a runner without it)."""
        devices, described = common.setup_devices(spec)
        spec.split_batch(len(devices))
        return cls(spec, model_spec, devices, described,
                   loss=CrossEntropy(spec.options.get("cross_entropy", "float32")))

    @property
    def n(self) -> int:
        return len(self.devices)

    @property
    def tokens(self) -> bool:
        return self.model_spec.input_kind == "tokens"

    def build(self, axis: str, seed: int = 0) -> Any:
        """Build the model and the shardings over `axis`; the initial variables (seeded)."""
        import jax.numpy as jnp

        from models.flax_common import count_params_flax, train_kwargs

        if why := attention_problem(self.spec, self.devices[0].platform):
            raise Unavailable(why)
        self.dtype = {"fp32": None, "tf32": None, "bf16": jnp.bfloat16}[self.spec.precision]
        implementation = ATTENTION_IMPLEMENTATION[self.attention] if self.attention else None
        self.model, self.counted = flax_step.build_model(self.spec, self.model_spec, self.dtype,
                                                         implementation)
        # a user's model is built as written: bf16 casts its params and inputs inside the step
        self.cast = self.dtype if self.counted is not None else None
        self.replicated, self.batch = flax_step.make_shardings(self.devices, axis)
        variables = flax_step.init_variables(self.model, self.model_spec.input_shape,
                                   "int32" if self.tokens else "float32",
                                   train_kwargs(self.model, False), seed)
        self.params = count_params_flax(variables)
        return variables

    @property
    def attention(self) -> str | None:
        """The `attention` option as the run applies it: its value on a built-in transformer
        (auto for a runner without the option), None where it does not apply."""
        return self.spec.options.get("attention", "auto") if attention_applies(self.spec) \
            else None

    @property
    def call(self) -> dict[str, Any]:
        """The module's keyword arguments in training (train=True, or {} if it takes none)."""
        from models.flax_common import train_kwargs

        return train_kwargs(self.model, True)

    def step(self, state_sharding: Any, batchnorm: str, layout: flax_step.Layout) -> Any:
        """The jitted train step (flax_step.make_train_step) of this run and layout."""
        return flax_step.make_train_step(state_sharding, self.batch, batchnorm, self.call,
                                         self.cast, layout.grads_sharding(state_sharding),
                                         self.loss)

    def loss_record(self) -> dict[str, Any]:
        """The loss's `cross_entropy` record, for a runner with the option ({} otherwise)."""
        return loss_record(self.spec, self.loss)

    def dtype_lines(self, cast: Any) -> tuple[str, str]:
        """(the record's dtype, precision_policy's how): a built-in built with the compute
        dtype, or (`cast` given) a user's module cast in the step."""
        if cast is not None:
            return ("bfloat16 compute (params and inputs cast in the step), float32 params",
                    "the user's module's float32 params and float inputs cast to bfloat16 in "
                    "the step")
        if self.dtype is None:
            return "float32", "flax module dtype float32"
        return ("bfloat16 compute, float32 params",
                "flax module dtype=bfloat16 (param_dtype float32), float32 logits for the loss")

    def record(self, state: Any, step: StepRecord) -> dict[str, Any]:
        """The fields benchmark and converge share: devices, layout, shardings, collectives,
        BatchNorm, the model's counts, its state and precision policy."""
        from models.flax_common import count_flops_flax

        dtype_line, how = self.dtype_lines(step.cast)
        has_bn = bool(state.batch_stats)
        fields = model_fields(self.model_spec, lambda: self.params,
                              lambda: count_flops_flax(self.model, self.model_spec.input_shape),
                              lambda: self.counted)
        return join({
            "replicas": self.n,
            "devices": self.described,
            "layout": "token ids (batch, sequence)" if self.tokens else "channels_last",
            "dtype": dtype_line,
            "shardings": {"params": step.params_sharding,
                          "batch": common.sharding_record(self.batch),
                          "per_device_batch": self.spec.global_batch_size // self.n},
            "collectives": step.collectives,
            # "none" for a model without BatchNorm (the option then changes nothing)
            "batchnorm": step.batchnorm if has_bn else "none",
            "batchnorm_statistics": (BATCHNORM_RECORD[step.batchnorm] if has_bn else
                                     "none: the model has no BatchNorm"),
        }, fields, model_state_jax(state.params, state.opt_state, state.batch_stats),
            precision_record(self.spec.precision, compute=compute_dtype(
                self.cast or getattr(self.model, "dtype", None)), params=state.params,
                grads=step.grads, hlo=step.hlo, how=how))


@dataclass(frozen=True)
class StepRecord:
    """What a mode read of its compiled step, for FlaxRun.record."""

    batchnorm: str
    collectives: dict[str, int]
    params_sharding: Any
    grads: Any
    hlo: str | None
    cast: Any


def input_batches(data: RealData | None, run: FlaxRun) -> tuple[Iterator[Any], Any, Any,
                                                                 dict[str, Any]]:
    """(batches, x and y to compile the step for, what the record says about the input):
    one resident synthetic batch for ever (images and labels, or token ids and their next
    tokens), or the Grain pipeline's batches."""
    import jax
    import jax.numpy as jnp

    model_spec, global_batch, batch = run.model_spec, run.spec.global_batch_size, run.batch
    if data is None:
        x, y = common.device_batch(model_spec, global_batch, (batch, batch))
        where = (code("jax.flax_token_batch_on_devices") if run.tokens else "one synthetic "
                 "global batch generated under jit into the batch sharding; no host copy per step")
        return itertools.repeat((x, y)), x, y, {"data_placement": where}
    from runners.jax.data import device_batches

    size = model_spec.input_shape[0]
    batches, line = device_batches(data, size, global_batch, batch)
    x = jax.ShapeDtypeStruct((global_batch, *model_spec.input_shape), jnp.float32,
                             sharding=batch)
    y = jax.ShapeDtypeStruct((global_batch,), jnp.int32, sharding=batch)
    return batches, x, y, {**describe(data, size), "input_pipeline": line,
                           "data_placement": "a host batch per step from the Grain workers, "
                                             "device_put into the batch sharding"}


class TimedSteps:
    """The timed loop's step over the input batches: the state it carries, the step counter
    when the clock starts and the first timed batch (for the placement and the gradients)."""

    def __init__(self, state: Any, step: Any, batches: Iterator[Any]) -> None:
        self.state, self.step, self.batches = state, step, batches
        self.start: int | None = None
        self.first: tuple[Any, Any] | None = None

    def open_window(self) -> None:
        self.start = int(self.state.step)

    def run(self) -> Any:
        x, y = next(self.batches)
        self.state, loss = self.step(self.state, x, y)
        if self.start is not None and self.first is None:
            self.first = x, y
        return loss


def benchmark(spec: Spec, layout: flax_step.Layout) -> dict[str, Any]:
    """The timed run of the step under `layout`."""
    if spec.num_nodes > 1 and spec.data != "synthetic":
        raise Unavailable(MULTI_NODE_REAL_DATA)
    model_spec = spec_of(spec)
    if model_spec.input_kind == "tokens" and spec.data != "synthetic":
        raise Unavailable(TOKENS_REAL)
    run = FlaxRun.start(spec, model_spec)
    import optax

    data = None if spec.data == "synthetic" else open_for_model(spec, model_spec)
    variables = run.build(layout.axis)
    state, state_sharding = layout.create_state(run.model, variables,
                                                optax.sgd(0.01, momentum=0.9), run.replicated)
    del variables
    batches, x, y, input_record = input_batches(data, run)
    batchnorm = layout.batchnorm(spec)
    try:
        step, collectives = flax_step.compile_step(run.step(state_sharding, batchnorm, layout),
                                                   state, x, y)
        steps = TimedSteps(state, step, batches)
        # loss.block_until_ready(): every device's copy, so the step has finished everywhere
        window = timed_loop(steps.run, lambda loss: loss.block_until_ready(), spec.warmup_steps,
                            spec.measure_steps, on_start=steps.open_window)
    finally:
        if data is not None:
            batches.close()  # the Grain workers
    # after the window, untimed: the gradients as the strategy holds them, for the state record
    grads = flax_step.gradients_once(steps.state, *steps.first, state_sharding, run.batch,
                                     flax_step.loss_and_grads(
                                         run.call, run.cast, layout.grads_sharding(state_sharding),
                                         run.loss))
    global_batch, hlo = spec.global_batch_size, step.as_text()
    return join(window.summary(global_batch, (int(steps.state.step) - steps.start) * global_batch),
                timed_fields(run, layout, steps, data, input_record, grads),
                run.record(steps.state, StepRecord(
                    batchnorm, collectives, layout.params_record(run.replicated,
                                                                 steps.state.params),
                    grads, hlo, run.cast)),
                compiled_evidence.attention_record(hlo, run.attention), run.loss_record(),
                {"compiled_memory": compiled_evidence.memory_record(step)},
                common.close_multihost(spec))


def timed_fields(run: FlaxRun, layout: flax_step.Layout, steps: TimedSteps, data: RealData | None,
                 input_record: dict[str, Any], grads: Any) -> dict[str, Any]:
    """The benchmark's own fields: the loss, versions, placement, input, state record."""
    framework = common.framework_versions(*VERSIONS)
    extra = grain_fields(framework, steps.first[1]) if data is not None else {}
    state = steps.state
    return join({
        "loss_kind": ("global mean next-token cross-entropy over every position of each "
                      "step's batch" if run.tokens else "global mean cross-entropy of each "
                                                        "step's batch"),
        "framework": framework,
        "placement": common.all_placement(common.placement(steps.first[0])),
        "placement_source": PLACEMENT_SOURCE,
    }, input_record, extra, state_record(
        {"params": state.params, "grads": grads, "optimizer": state.opt_state},
        run.devices, layout.state_source))


def equivalence(spec: Spec, layout: flax_step.Layout) -> dict[str, Any]:
    """One plain SGD step on the probe through the benchmark's step (batchnorm mode, state layout,
    AOT compile), the batch laid out by jax.make_array_from_process_local_data; weights saved by
    process 0 (a sharded state gathered to every process first)."""
    devices, described = common.setup_devices(spec)
    import jax
    import optax

    from models.flax_common import get_canonical_weights, set_canonical_weights

    weights, x, y, lr = spec.equivalence_inputs()
    n = len(devices)
    spec.split_batch(n, rows=len(x))
    model_spec = get_spec("probe")
    model = load_builder("probe", "flax")(model_spec)
    variables = set_canonical_weights(flax_step.init_variables(model, model_spec.input_shape),
                                      weights)
    replicated, batch = flax_step.make_shardings(devices, layout.axis)
    state, state_sharding = layout.create_state(model, variables, optax.sgd(lr), replicated)
    # inputs come NHWC; every process holds the whole batch and gives each device its rows
    xs = jax.make_array_from_process_local_data(batch, x, x.shape)
    ys = jax.make_array_from_process_local_data(batch, y, y.shape)
    batchnorm = layout.batchnorm(spec)
    entropy = CrossEntropy(spec.options.get("cross_entropy", "float32"))
    step, collectives = flax_step.compile_step(flax_step.make_train_step(
        state_sharding, batch, batchnorm, grads_sharding=layout.grads_sharding(state_sharding),
        loss_of=entropy), state, xs, ys)
    state, loss = step(state, xs, ys)
    finite(loss.block_until_ready())
    params = state.params
    if not all(a.is_fully_addressable for a in jax.tree_util.tree_leaves(params)):
        from jax.experimental import multihost_utils

        params = multihost_utils.process_allgather(params, tiled=True)
    canonical = get_canonical_weights({"params": params})
    if jax.process_index() == 0:
        spec.save_equivalence_output(canonical)
    return join({"replicas": n, "framework": common.framework_versions(*VERSIONS),
                 "devices": described, "loss": float(loss),
                 "batch_sharding": common.sharding_record(xs.sharding),
                 "params_sharding": layout.params_record(replicated, state.params),
                 "batchnorm": batchnorm, "collectives": collectives,
                 "placement": common.all_placement(common.placement(xs)),
                 "placement_source": PLACEMENT_SOURCE},
                loss_record(spec, entropy), common.close_multihost(spec))


def loss_record(spec: Spec, loss: CrossEntropy | None) -> dict[str, Any]:
    """The `cross_entropy` record of a run whose runner has the option (jax_native; jax_fsdp,
    without it, records nothing of it)."""
    return loss.record() if loss is not None and "cross_entropy" in spec.options else {}
