"""Keras 3 on TensorFlow, data parallel with tf.distribute.MirroredStrategy and fit: variables
mirrored, each global batch split by the distributed iterator, gradients all-reduced
(cross_device_ops). Stack limits at 2+ replicas are recorded unavailable (known_limits);
several nodes: MultiWorkerMirroredStrategy (FitMultiWorkerStrategy's reduce).
docs/runners/tf_mirrored.md has the details and what differs."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from typing import Any

import keras
import tensorflow as tf

from contract.reasons import code
from contract.result import join
from models import ModelSpec, get_spec, load_builder, spec_of
from models import keras_common as kc
from models.custom import CustomModelError
from runners.common import Invalid, Spec, Unavailable, main, one_line, process_rank
from runners.converge import Recipe, load_splits
from runners.memory import model_state_keras
from runners.real_data import TOKENS_REAL
from runners.tf import common as tfc
from runners.tf.devices import MultiWorker, cross_device_ops_used, xla_collectives_guard
from runners.tf.placement import EagerPlacement

DATA_PLACEMENT = {
    "synthetic": "one synthetic batch in tf.data, prefetched to each replica's device",
    "tokens": code("tf.mirrored_tokens_prefetched"),
    "real": code("tf.mirrored_real_distributed"),
    "converge": code("tf.mirrored_converge_distributed"),
    "converge_nodes": code("tf.mirrored_converge_per_worker"),
}
CROSS_DEVICE_OPS = {
    "auto": None,
    "nccl": tf.distribute.NcclAllReduce,
    "hierarchical_copy": tf.distribute.HierarchicalCopyAllReduce,
    "reduction_to_one_device": tf.distribute.ReductionToOneDevice,
}


class FitMultiWorkerStrategy(tf.distribute.MultiWorkerMirroredStrategy):
    """MultiWorkerMirroredStrategy with the reduce() Keras 3's fit expects (keras-team/keras#20585):
    mapped over nested structures, scalars reduced with axis=None (docs/runners/tf_mirrored.md)."""

    def reduce(self, reduce_op: Any, value: Any, axis: Any) -> Any:
        parent = super()

        def one(v: Any) -> Any:
            scalar = all(getattr(t, "shape", None) is not None and t.shape.rank == 0
                         for t in self.experimental_local_results(v))
            return parent.reduce(reduce_op, v, None if scalar else axis)

        return tf.nest.map_structure(one, value)


def make_strategy(spec: Spec) -> tuple[tf.distribute.Strategy, list[dict[str, Any]],
                                       MultiWorker | None]:
    """MirroredStrategy over the run's devices with the configured all-reduce; on several nodes
    MultiWorkerMirroredStrategy (collective auto or nccl), with what the record needs."""
    choice = spec.options["cross_device_ops"]
    if choice == "nccl" and spec.device == "cpu":
        raise Unavailable("cross_device_ops nccl: NCCL all-reduces between GPUs; this run is on "
                          "CPU devices")
    if spec.options["data_format"] == "channels_first" and spec.device == "cpu":
        raise Unavailable("data_format channels_first on CPU devices: TensorFlow's CPU kernel "
                          "for Conv2D's filter gradient (Conv2DCustomBackpropFilterOp) only "
                          "supports NHWC")
    if spec.num_nodes > 1:
        if choice not in ("auto", "nccl"):
            raise Unavailable(
                f"cross_device_ops {choice} on {spec.num_nodes} nodes: it is a "
                "MirroredStrategy all-reduce within one machine; MultiWorkerMirroredStrategy "
                "all-reduces with collective ops (auto or nccl)")
        if spec.data == "real" and spec.options["loader"] == "keras":
            raise Unavailable(
                f"loader keras on {spec.num_nodes} nodes: not built for "
                "MultiWorkerMirroredStrategy here (each worker's PyDataset would have to be "
                "sharded by this runner); loader framework (tf.data) shards by worker")
    return tfc.make_strategy(spec, CROSS_DEVICE_OPS[choice], choice, FitMultiWorkerStrategy)


def build_compiled(spec: Spec, strategy: tf.distribute.Strategy, model_name: str | None,
                   optimizer: Callable[[], keras.optimizers.Optimizer]
                   ) -> tuple[keras.Model, dict[str, Any] | None]:
    """(the model, a user's model's description or None), made under the strategy and compiled
    as the benchmark compiles it; `model_name` a model of models/, or None for the run's."""
    opts = spec.options
    described = None
    with strategy.scope():
        if model_name is None:
            model_spec = spec_of(spec)
            try:
                model, described = kc.build_run_model(spec, model_spec,
                                                      data_format=opts["data_format"])
            except CustomModelError as exc:
                raise Invalid(str(exc)) from None
        else:
            model_spec = get_spec(model_name)
            model = load_builder(model_name, "keras")(model_spec,
                                                      data_format=opts["data_format"])
        model.compile(optimizer=optimizer(), loss=kc.loss_for(model_spec),
                      steps_per_execution=opts["steps_per_execution"],
                      jit_compile=bool(opts["xla"]))
    return model, described


def run_input(spec: Spec, model_spec: ModelSpec, data_format: str) -> tuple[Any, dict[str, Any]]:
    """fit_input's data, or for a token model one synthetic global batch of token ids in tf.data,
    split by the distributed iterator as the synthetic images are."""
    if model_spec.input_kind != "tokens":
        return tfc.fit_input(spec, model_spec, data_format, spec.warmup_steps + spec.measure_steps)
    if spec.data == "real":
        raise Unavailable(TOKENS_REAL)
    return tfc.global_batch_dataset(tfc.synthetic_tokens(
        model_spec.input_shape[0], model_spec.num_classes, spec.global_batch_size)), {}


def stop_placement(placement: EagerPlacement) -> keras.callbacks.Callback:
    """Stops collecting partition graphs at the end of fit's first call (its function made)."""
    return keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: placement.stop())


@contextlib.contextmanager
def known_limits(spec: Spec, strategy: tf.distribute.Strategy) -> Iterator[None]:
    """Keras 3 fit's failures under MirroredStrategy with 2+ replicas that are the stack's limits
    (xla; steps_per_execution > 1 with CollectiveAllReduce), re-raised Unavailable with TF's
    words."""
    try:
        with xla_collectives_guard():
            yield
    except tf.errors.InvalidArgumentError as exc:
        message, replicas = str(exc), strategy.num_replicas_in_sync
        if replicas > 1 and spec.options["xla"] and "Trying to access resource" in message:
            raise Unavailable(
                f"xla with {replicas} replicas: Keras {keras.__version__} jit-compiles the "
                "whole step (strategy.run over every replica) as one XLA cluster, which cannot "
                "read the other replicas' variables (TensorFlow: "
                f"{xla_resource_error(message)})") from exc
        per_call = spec.options["steps_per_execution"]
        if (replicas > 1 and per_call > 1 and "must feed a value for placeholder" in message
                and "while/" in message):
            raise Unavailable(
                f"steps_per_execution={per_call} with {replicas} replicas and "
                f"{cross_device_ops_used(strategy)}: TensorFlow {tf.__version__} fails inside "
                f"Keras {keras.__version__}'s multi-step while loop "
                f"({one_line(message.split('INVALID_ARGUMENT:')[-1], 120)}); "
                + ("cross_device_ops reduction_to_one_device or hierarchical_copy run it"
                   if spec.num_nodes == 1 else
                   "on several nodes MultiWorkerMirroredStrategy has only the collective "
                   "all-reduce")) from exc
        raise


def xla_resource_error(message: str) -> str:
    """The device pair of TensorFlow's "Trying to access resource" error, in one line."""
    m = re.search(r"Trying to access resource (\S+).*?located in device (\S+) from device "
                  r"(\S+)", message, re.S)
    if not m:
        return one_line(message, 160)
    return f"resource {m[1]} located in device {m[2]} accessed from device {m[3]}"


def compile_info(spec: Spec, strategy: tf.distribute.Strategy, devices: list[dict[str, Any]],
                 layout: str | None = None) -> dict[str, Any]:
    opts = spec.options
    return {
        "replicas": strategy.num_replicas_in_sync,
        "framework": tfc.framework_versions(),
        "devices": devices,
        "layout": layout or opts["data_format"],
        "steps_per_execution": opts["steps_per_execution"],
        "xla": bool(opts["xla"]),
        "cross_device_ops": cross_device_ops_used(strategy),
    }


def worker_input(strategy: Any, data: Any, multi: Any) -> tuple[Any, Any]:
    """fit's dataset, sharded across the workers of a multi-node run, and what this worker's
    replicas get of its first global batch as fit distributes it; one machine: (data, None)."""
    if multi is None:
        return data, None
    data = tfc.shard_across_workers(data)
    first = next(iter(strategy.experimental_distribute_dataset(data)))
    return data, tfc.local_batch(strategy, first, code("tf.mirrored_probe_first_batch"))


def benchmark(spec: Spec) -> dict[str, Any]:
    keras.mixed_precision.set_global_policy(tfc.POLICIES[spec.precision])
    strategy, devices, multi = make_strategy(spec)
    model_spec = spec_of(spec)
    tokens = model_spec.input_kind == "tokens"
    model, described = build_compiled(
        spec, strategy, None, lambda: keras.optimizers.SGD(learning_rate=0.01, momentum=0.9))
    # a user's Keras model takes images as it declares them, H, W, C (models/custom.py)
    data_format = "channels_last" if spec.custom_model else spec.options["data_format"]
    data, data_info = run_input(spec, model_spec, data_format)
    data, first_batch = worker_input(strategy, data, multi)
    placement = EagerPlacement().start()  # before fit's first call makes its train function
    with known_limits(spec, strategy):
        timed = tfc.timed_fit(spec, model, data, spec.options["steps_per_execution"],
                              callbacks=[stop_placement(placement)])
    layout = "tokens (batch, sequence)" if tokens else data_format
    result = join(
        timed, compile_info(spec, strategy, devices, layout), placement.result(),
        {"dtype_policy": tfc.POLICIES[spec.precision],
         "data_placement": DATA_PLACEMENT["tokens" if tokens else spec.data]},
        data_info, kc.model_record(model, model_spec, described), model_state_keras(model),
        tfc.keras_policy(model, spec.precision),
        # one worker's devices only: a multi-worker run would need every worker's (not read)
        tfc.state_bytes_tf(model) if multi is None else {})
    if multi is not None:  # last: a collective every worker joins
        result["input_sharding"] = tfc.SHARDING_NOTE
        result.update(multi.record(
            result["placement"], placement.run_metadata, {"first_batch": first_batch},
            {"FitMultiWorkerStrategy.reduce": code("tf.fit_reduce_patch")}))
    return result


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step on the probe model, compiled and fed as the benchmark; weights saved."""
    strategy, devices, multi = make_strategy(spec)
    weights, x, y, lr = spec.equivalence_inputs()
    model, _ = build_compiled(spec, strategy, "probe",
                              lambda: keras.optimizers.SGD(learning_rate=lr))
    with strategy.scope():
        kc.set_canonical_weights(model, weights)
    data = tfc.global_batch_dataset((tfc.nchw(x, spec.options["data_format"]), y), repeat=False)
    data, first_batch = worker_input(strategy, data, multi)
    placement = EagerPlacement().start()
    # the benchmark's input path, given once: fit stops after exactly one step
    with known_limits(spec, strategy):
        model.fit(data, epochs=1, verbose=0, shuffle=False,
                  callbacks=[stop_placement(placement)])
    steps = int(model.optimizer.iterations.numpy())
    if steps != 1:
        raise Invalid(f"the equivalence fit ran {steps} optimizer steps, not 1")
    if process_rank() == 0:  # several workers: each holds the same weights, one writes them
        spec.save_equivalence_output(kc.get_canonical_weights(model))
    result = {**compile_info(spec, strategy, devices), **placement.result()}
    if multi is not None:
        result.update(multi.record(
            result["placement"], placement.run_metadata, {"first_batch": first_batch},
            {"FitMultiWorkerStrategy.reduce": code("tf.fit_reduce_patch")}))
    return result


class StepLearningRate(keras.callbacks.Callback):
    """Sets model.optimizer.learning_rate to the recipe's `lr_at(step)` before every step of fit's
    epoch (a mirrored variable: every replica's copy takes it)."""

    def __init__(self) -> None:
        super().__init__()
        self.lr_at: Callable[[int], float] = lambda step: 0.0

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        self.model.optimizer.learning_rate = self.lr_at(batch)


class MirroredConverge(tfc.StrategyConverge):
    """Keras 3 fit, one call per epoch on that epoch's batches in tf.data, the rate set before every
    step (StepLearningRate); the placement from the first train call. Several nodes (`multi`):
    each worker's share of every global batch given to fit through
    distribute_datasets_from_function, and the first batch each worker's replicas got."""

    def __init__(self, spec: Spec, strategy: tf.distribute.Strategy, model: keras.Model,
                 multi: MultiWorker | None = None) -> None:
        # a user's Keras model takes images as it declares them, H, W, C (models/custom.py)
        data_format = "channels_last" if spec.custom_model else spec.options["data_format"]
        super().__init__(strategy, model, model.optimizer, data_format)
        self.spec, self.placement, self.step_lr = spec, EagerPlacement(), StepLearningRate()
        self.multi, self.first_batch = multi, None
        if multi is not None:
            self.worker, self.workers = multi.resolver.task_id, spec.num_nodes

    def worker_input(self, epoch: int, batches: list) -> Any:
        """fit's input of one epoch on several nodes: this worker's shares cut into one slice
        per local replica, one input pipeline per worker (InputContext), its first distributed
        batch read in epoch 0 (a collective every worker joins)."""
        local = self.strategy.num_replicas_in_sync // self.workers
        pieces = tfc.replica_pieces(batches, local)

        def per_worker(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
            if (ctx.input_pipeline_id, ctx.num_input_pipelines) != (self.worker, self.workers):
                raise Invalid(f"TF gave this worker input pipeline {ctx.input_pipeline_id} of "
                              f"{ctx.num_input_pipelines}; it is worker {self.worker} of "
                              f"{self.workers}")
            return tfc.epoch_dataset(pieces, self.data_format)

        data = self.strategy.distribute_datasets_from_function(per_worker)
        if epoch == 0:
            self.first_batch = tfc.local_batch(self.strategy, next(iter(data)),
                                               code("tf.mirrored_converge_first_batch"))
        return data

    def train(self, epoch: int, batches: list, lr_at: Callable[[int], float]) -> float:
        self.step_lr.lr_at = lr_at
        callbacks: list[keras.callbacks.Callback] = [self.step_lr]
        # several nodes: the input made and probed before the placement starts, as benchmark's
        data = None if self.multi is None else self.worker_input(epoch, batches)
        if epoch == 0:  # the train function's partition graphs, made by its first call
            self.placement.start()
            callbacks.append(stop_placement(self.placement))
        with self.empty_replicas(batches), known_limits(self.spec, self.strategy):
            if data is None:
                data = tfc.epoch_dataset(batches, self.data_format)
            history = self.model.fit(data, epochs=epoch + 1, initial_epoch=epoch,
                                     callbacks=callbacks, verbose=0, shuffle=False)
        return float(history.history["loss"][-1])


def check_across_nodes(spec: Spec, recipe: Recipe, rows: int) -> None:
    """Unavailable on several nodes when the recipe keeps a short last batch that does not
    split evenly over the replicas: each worker's pipeline gives its replicas equal slices."""
    rest = rows % recipe.global_batch if recipe.last_batch == "keep" else 0
    if spec.num_nodes > 1 and rest % spec.num_devices:
        raise Unavailable(
            f"last_batch keep on {spec.num_nodes} nodes: the short last batch of {rest} rows "
            f"does not split evenly over {spec.num_devices} replicas; each worker feeds its "
            "own share through distribute_datasets_from_function, at one per-replica batch "
            "size for every replica (InputContext.get_per_replica_batch_size)")


def converge(spec: Spec) -> dict[str, Any]:
    """Mode converge: MirroredConverge on the benchmark's strategy, model and compile with the
    recipe's optimizer, initial weights seeded by keras.utils.set_random_seed(recipe.seed);
    several nodes: MultiWorkerMirroredStrategy, every worker's placement and batch gathered."""
    recipe = Recipe.of(spec)
    splits = load_splits(spec)
    model_spec = spec_of(spec)
    tfc.check_converge_model(spec, model_spec, splits, across_nodes=True)
    check_across_nodes(spec, recipe, len(splits.y_train))
    if spec.options["steps_per_execution"] > 1:
        raise Unavailable(
            f"steps_per_execution={spec.options['steps_per_execution']} in mode converge: "
            "fit calls on_train_batch_begin once per call of that many steps, so the "
            "recipe's learning rate could not be set before every step")
    keras.mixed_precision.set_global_policy(tfc.POLICIES[spec.precision])
    strategy, devices, multi = make_strategy(spec)
    keras.utils.set_random_seed(recipe.seed)  # the initial weights: alike at any device count
    model, described = build_compiled(spec, strategy, None, lambda: tfc.recipe_optimizer(recipe))
    adapter = MirroredConverge(spec, strategy, model, multi)
    result = adapter.run(spec, splits, tfc.POLICIES[spec.precision])
    result = join(result, compile_info(spec, strategy, devices), adapter.placement.result(), {
        "data_placement": DATA_PLACEMENT["converge" if multi is None else "converge_nodes"],
        "lr_setting": "StepLearningRate callback: model.optimizer.learning_rate before each step",
        "train_loss_kind": code("tf.keras_epoch_loss"),
    }, kc.model_record(model, model_spec, described), tfc.keras_policy(model, spec.precision))
    if multi is not None:  # last: a collective every worker joins
        result.update(multi.record(
            result["placement"], adapter.placement.run_metadata,
            {"first_batch": adapter.first_batch},
            {"FitMultiWorkerStrategy.reduce": code("tf.fit_reduce_patch")}))
    return result


if __name__ == "__main__":
    main(benchmark, equivalence, converge)
