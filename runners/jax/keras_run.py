"""The run of a Keras 3 runner on JAX under a distribution (`Strategy`: keras_jax's
DataParallel, keras_model_parallel's ModelParallel): the model built as the run asks (a
built-in or a user's, BatchNorm swapped for per_device), compiled, fed (runners/jax/
keras_input.py) and trained by the timed fit (runners/jax/keras_fit.py); the state and precision
records after fit, untimed; the equivalence step; the record fields benchmark and converge share.
docs/runners/keras_jax.md says what each records and why."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from contract.reasons import code
from contract.result import join
from models import get_spec, load_builder, spec_of
from models.custom import CustomModelError
from runners.common import Invalid, Spec, Unavailable, one_line
from runners.jax import common, keras_batchnorm, keras_fit
from runners.jax.data import grain_fields
from runners.jax.keras_batchnorm import BATCHNORM_MODES, BATCHNORM_RECORD
from runners.jax.keras_fit import KERAS_MECHANISM, PLACEMENT_SOURCE, POLICIES
from runners.jax.keras_input import fit_input, input_mode, per_call, preplaced
from runners.jax.state import keras_state
from runners.memory import model_state_keras
from runners.real_data import TOKENS_REAL, open_for_model

MULTI_NODE_PREPLACED = (
    "input: preplaced across nodes: Keras 3.15's jax trainer hands every batch to "
    "jax.make_array_from_process_local_data as this process's rows, so a global batch already "
    "on every process's devices cannot pass through fit unchanged; use input: numpy")
MULTI_NODE_REAL_DATA = (
    "data: real across nodes: the Grain pipeline and the PyDataset make whole global batches "
    "(runners/jax/data.py, runners/keras_data.py), so every process would decode all of each "
    "batch; a per-process shard of the file stream is not built yet")


@dataclass(frozen=True)
class Strategy:
    """How a Keras runner distributes: `distribute(spec, name)` -> (keras, the distribution,
    set globally, the device descriptions) for the model `name` (None: the run's; "probe"),
    `describe(distribution, trained model)` the record fields of its own, and the state
    record's source."""

    distribute: Callable[[Spec, str | None], tuple[Any, Any, list[dict[str, Any]]]]
    describe: Callable[[Any, Any], dict[str, Any]] = lambda distribution, model: {}
    state_source: str = code("jax.keras_state_source")


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
            model = keras_batchnorm.per_device_batchnorm(keras, model)
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


@dataclass
class KerasRun:
    """A run's Keras, its distribution (set globally) and devices, the dtype policy (set
    globally), the run's model once built (its batchnorm mode, a user's model's description)
    and the distribution's layouts of the global batch's inputs and labels."""

    spec: Spec
    keras: Any
    distribution: Any
    described: list[dict[str, Any]]
    policy: str
    model_spec: Any
    model: Any = None
    batchnorm: str = ""
    counted: dict[str, Any] | None = None
    shape: tuple[int, ...] = ()
    shardings: tuple[Any, Any] = field(default=(None, None))

    @classmethod
    def start(cls, spec: Spec, strategy: Strategy) -> KerasRun:
        """Distribute, split the batch over the devices, set the dtype policy."""
        keras, distribution, described = strategy.distribute(spec, None)
        spec.split_batch(distribution.device_mesh.devices.size)
        policy = POLICIES[spec.precision]
        keras.mixed_precision.set_global_policy(policy)
        run = cls(spec, keras, distribution, described, policy, spec_of(spec))
        global_batch = spec.global_batch_size
        run.shape = (global_batch, *run.model_spec.input_shape)
        run.shardings = (keras_fit.batch_sharding(distribution, run.shape),
                         keras_fit.batch_sharding(
                             distribution, run.shape[:2] if run.tokens else (global_batch,)))
        return run

    @property
    def n(self) -> int:
        return self.distribution.device_mesh.devices.size

    @property
    def tokens(self) -> bool:
        return self.model_spec.input_kind == "tokens"

    def build(self) -> Any:
        """The run's model (build_model), kept with its batchnorm mode and description."""
        self.model, self.batchnorm, self.counted = build_model(self.keras, self.spec, None,
                                                               data_format="channels_last")
        return self.model

    def record(self, trained: Any = None) -> dict[str, Any]:
        """The fields benchmark and converge share; the model state is `trained`'s (the model
        fit trained, default the run's model)."""
        from models.keras_common import has_batchnorm, model_record

        model = self.model
        kernel = next((v for v in model.trainable_variables if v.path.endswith("kernel")),
                      model.trainable_variables[0])  # a user's model may have no kernel
        bn = has_batchnorm(model)
        return join({
            "replicas": self.n,
            "devices": self.described,
            "layout": "tokens (batch, sequence)" if self.tokens else "channels_last",
            "dtype_policy": self.policy,
            "xla": True,  # the jax trainer always jits its step
            "shardings": {**keras_fit.distribution_record(self.distribution, self.shardings[0],
                                                self.shape),
                          "variables": common.sharding_record(kernel.value.sharding)},
            # the summary's BN column: "none" for a model without BatchNorm (the option is moot)
            "batchnorm": self.batchnorm if bn else "none",
            "batchnorm_statistics": (BATCHNORM_RECORD[self.batchnorm] if bn else
                                     "the model has no BatchNormalization layer"),
        }, model_record(model, self.model_spec, self.counted),
            model_state_keras(trained if trained is not None else model))


def benchmark(spec: Spec, strategy: Strategy) -> dict[str, Any]:
    """The timed fit under the strategy's distribution."""
    check_multi_node(spec)
    run = KerasRun.start(spec, strategy)
    from models.keras_common import loss_for

    if run.tokens and spec.data == "real":
        raise Unavailable(TOKENS_REAL)
    data = None if spec.data == "synthetic" else open_for_model(spec, run.model_spec)
    model = run.build()
    model.compile(optimizer=run.keras.optimizers.SGD(learning_rate=0.01, momentum=0.9),
                  loss=loss_for(run.model_spec), steps_per_execution=per_call(spec))
    noted: list[Any] = []
    feed, input_record, owner = fit_input(spec, data, run.model_spec, run.shardings, noted)
    warmup = keras_fit.Warmup(input_record.pop("warmup_steps_run", spec.warmup_steps),
                              per_call(spec), input_record.pop("warmup_extended", None))
    try:
        timing = keras_fit.timed_fit(spec, model, feed, warmup)
    finally:
        if owner is not None:
            owner.close()  # the Grain workers
    timing["placement"] = common.all_placement(timing["placement"])
    # after fit, untimed: the model state where the distribution holds it, and the precision
    state = keras_state(model, common.device_batch(run.model_spec, spec.global_batch_size,
                                            run.shardings),
                        run.distribution.device_mesh.devices.flatten().tolist(),
                        strategy.state_source, spec.precision,
                        f"keras.mixed_precision.set_global_policy({run.policy!r})")
    framework = common.framework_versions("keras")
    if owner is not None:
        # the first timed batch's labels: past the steps the settle rule added
        input_record.update(grain_fields(framework, noted[warmup.added]))
    return join(timing, {"framework": framework}, run.record(), input_record, state,
                strategy.describe(run.distribution, model),
                multi_node_record(spec, run.distribution))


def multi_node_record(spec: Spec, distribution: Any) -> dict[str, Any]:
    """close_multihost's record ({} on one node) with what Keras' DataParallel says of the
    processes (Keras reads them from jax once keras.distribution.initialize has run)."""
    record = common.close_multihost(spec, KERAS_MECHANISM)
    if record:
        record["multi_node"]["keras_distribution"] = {
            "num_processes": distribution.num_processes,
            "auto_shard_dataset": distribution.auto_shard_dataset,
            "source": "keras.distribution.DataParallel.num_processes, .auto_shard_dataset"}
    return record


def equivalence(spec: Spec, strategy: Strategy) -> dict[str, Any]:
    """One plain SGD step of fit on the probe model through the benchmark's path (the same
    `input` and `batchnorm`, the batch distributed by the strategy's distribution); weights
    saved after (by process 0 across nodes, where each process feeds fit its share of the
    rows)."""
    check_multi_node(spec)
    keras, distribution, described = strategy.distribute(spec, "probe")
    import jax

    from models.keras_common import get_canonical_weights, set_canonical_weights

    weights, x, y, lr = spec.equivalence_inputs()
    n = distribution.device_mesh.devices.size
    spec.split_batch(n, rows=len(x))
    model, batchnorm, _ = build_model(keras, spec, "probe")
    set_canonical_weights(model, weights)
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=lr),
                  loss="sparse_categorical_crossentropy")
    mode = input_mode(spec)
    if mode == "numpy":
        rows = len(x) // spec.num_nodes  # this process's share, in process order
        mine = slice(jax.process_index() * rows, (jax.process_index() + 1) * rows)
        feed = {"x": x[mine], "y": y[mine], "batch_size": rows, "epochs": 1, "shuffle": True}
    else:
        layouts = (keras_fit.batch_sharding(distribution, x.shape),
                   keras_fit.batch_sharding(distribution, y.shape))
        feed = preplaced(*jax.device_put((x, y), layouts), 1)
    loss, probe = keras_fit.fit_one_step(spec, model, feed)
    canonical = get_canonical_weights(model)
    if jax.process_index() == 0:
        spec.save_equivalence_output(canonical)
    return join({"replicas": n, "framework": common.framework_versions("keras"),
                 "devices": described, "loss": loss, "input": mode, "batchnorm": batchnorm,
                 "batch_sharding": probe.sharding,
                 "placement": common.all_placement(probe.placement),
                 "placement_source": PLACEMENT_SOURCE}, strategy.describe(distribution, model),
                multi_node_record(spec, distribution))
