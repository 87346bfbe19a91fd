"""jax_native: native JAX data parallelism as jax 0.10.2's idioms do it: one jitted train step over
a 1-D mesh (axis "data"), a Flax (linen) model, optax SGD with momentum, the global batch one
jax.Array sharded B/N rows per device, the train state replicated and donated. Option
`batchnorm`: per_device (shard_map, lax.pmean) or global (plain jit, sync BatchNorm). Step and
record: flax_step.py and flax_run.py (shared with jax_fsdp). docs/runners/jax_native.md."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from contract.reasons import code
from contract.result import join
from models import spec_of
from runners.common import Invalid, Spec, main
from runners.converge import Batch, fitting_splits, stepwise, train_to_accuracy
from runners.jax import common, flax_run
from runners.jax.flax_run import VERSIONS, FlaxRun, StepRecord
from runners.jax.flax_step import AXIS, Layout, cast_floats, compile_step

if TYPE_CHECKING:
    import jax
    import numpy as np
    import optax
    from flax.training import train_state

DATA_PARALLEL = Layout(
    AXIS, lambda replicated, abstract: replicated, lambda spec: spec.options["batchnorm"],
    lambda replicated, params: common.sharding_record(replicated),
    code("jax.native_state_source"))

benchmark = partial(flax_run.benchmark, layout=DATA_PARALLEL)
equivalence = partial(flax_run.equivalence, layout=DATA_PARALLEL)


def converge_optimizer(momentum: float, weight_decay: float, lr: float
                       ) -> optax.GradientTransformation:
    """torch.optim.SGD's update in optax: weight decay added to the gradient, the momentum
    trace, x -lr; the learning rate a hyperparameter held in the optax state
    (inject_hyperparams), so that it can be set before every step (NativeConverge.step)."""
    import optax

    def make(learning_rate: float) -> optax.GradientTransformation:
        return optax.chain(optax.add_decayed_weights(weight_decay),
                           optax.sgd(learning_rate, momentum=momentum))

    return optax.inject_hyperparams(make)(learning_rate=lr)


def make_predict(run: FlaxRun) -> Callable[..., Any]:
    """The jitted inference forward of the run's model (params, batch_stats, x) -> argmax class
    per row, x in the batch sharding (each device its rows), the variables replicated; the
    run's `cast` as in the step."""
    import jax
    import jax.numpy as jnp

    from models.flax_common import train_kwargs

    model, cast, call = run.model, run.cast, train_kwargs(run.model, False)

    def predict(params: Any, stats: Any, x: jax.Array) -> jax.Array:
        if cast is not None:
            params, x = cast_floats(params, cast), cast_floats(x, cast)
        variables = {"params": params, **({"batch_stats": stats} if stats else {})}
        return jnp.argmax(model.apply(variables, x, **call), axis=-1)

    return jax.jit(predict, in_shardings=(run.replicated, run.replicated, run.batch),
                   out_shardings=run.batch)


class NativeConverge:
    """The converge adapter: the train state, its step compiled per batch shape met, and what
    the record reads of the run (the first epoch's rows per device, the rates read back)."""

    def __init__(self, run: FlaxRun, state: train_state.TrainState, jitted: Any,
                 heldout_rows: int) -> None:
        import jax

        self.run, self.state, self.jitted = run, state, jitted
        self.compiled: dict[tuple[int, ...], Any] = {}  # the step compiled per batch shape
        self.collectives: dict[str, int] = {}
        self.hlo: str | None = None
        self.rows: dict[str, int] = {}  # the first epoch's rows per device, from the arrays
        self.rows_fed: list[int] = []  # the first epoch's global batches' rows, as made
        self.lrs: list[float] = []  # the optax state's rate after each epoch's last step
        self.read: str | None = None  # what the last moving_stats() read
        self.predict = make_predict(run)
        self.world = jax.process_count()  # one process per node
        self.chunk = common.eval_chunk(heldout_rows, run.n)  # held-out rows per inference call

    def step(self, b: Batch, lr: float, epoch: int) -> Any:
        import numpy as np

        x, y = common.process_local(self.run.batch, (b.x, b.y), b.global_rows)
        if epoch == 0:
            self.rows_fed.append(b.global_rows)
            if self.world > 1:
                common.check_process_rows(x, len(b.y), self.world)
            for device, count in common.placement(x).items():
                self.rows[device] = self.rows.get(device, 0) + count
        # the optax state's learning rate replaced by lr (float32, replicated)
        opt = self.state.opt_state
        (value,) = common.process_local(self.run.replicated, (np.float32(lr),))
        self.state = self.state.replace(opt_state=opt._replace(
            hyperparams={**opt.hyperparams, "learning_rate": value}))
        if x.shape not in self.compiled:
            self.compiled[x.shape], counts = compile_step(self.jitted, self.state, x, y)
            if self.hlo is None:
                self.collectives.update(counts)
                self.hlo = self.compiled[x.shape].as_text()
        self.state, loss = self.compiled[x.shape](self.state, x, y)
        return loss

    def mean_loss(self, losses: list[Any]) -> float:
        import jax
        import numpy as np

        mean = float(np.mean([float(v) for v in jax.block_until_ready(losses)]))
        self.lrs.append(float(self.state.opt_state.hyperparams["learning_rate"]))
        return mean

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> float:
        """Held-out accuracy: every process feeds all of each padded chunk, each device
        predicts its rows; across processes the predictions are gathered to each
        (process_allgather), so every process counts the same accuracy."""
        import numpy as np
        from jax.experimental import multihost_utils

        correct, chunk = 0, self.chunk
        for i in range(0, len(y), chunk):
            part = x[i:i + chunk]
            padded = np.concatenate([part, np.zeros((chunk - len(part), *part.shape[1:]),
                                                    part.dtype)])
            (xs,) = common.process_local(self.run.batch, (padded,))
            classes = self.predict(self.state.params, self.state.batch_stats, xs)
            if not classes.is_fully_addressable:
                classes = multihost_utils.process_allgather(classes, tiled=True)
            correct += int((np.asarray(classes)[:len(part)] == y[i:i + chunk]).sum())
        return correct / len(y)

    def moving_stats(self) -> tuple[bool, str]:
        """(whether every leaf of the batch_stats tree is finite, which is not / how many were
        read): Flax's BatchNorm keeps "mean" and "var" per layer."""
        import jax
        import numpy as np
        from flax.core import unfreeze
        from flax.traverse_util import flatten_dict

        stats = self.state.batch_stats
        flat = flatten_dict(unfreeze(jax.device_get(stats))) if stats else {}
        for path, leaf in flat.items():
            bad = int(np.size(leaf) - np.isfinite(leaf).sum())
            if bad:
                self.read = f"batch_stats/{'/'.join(path)}: {bad} of {np.size(leaf)} not finite"
                return False, self.read
        self.read = f"{len(flat)} batch_stats arrays finite"
        return True, self.read


def converge(spec: Spec) -> dict[str, Any]:
    """Mode converge: train_to_accuracy with the benchmark's model, mesh and jitted step, the
    learning rate set per step in the optax state; across nodes each process feeds its share
    of every global batch (its jax.process_index() as the rank)."""
    recipe = common.sgd_recipe(spec, "jax_native", None)
    model_spec = spec_of(spec)
    splits = fitting_splits(spec, model_spec)
    run = FlaxRun.start(spec, model_spec)
    import jax  # only now: FlaxRun.start set up the devices (runners/jax/common.py)

    common.check_short_batch(recipe, len(splits.y_train), run.n, "a NamedSharding")
    variables = run.build(AXIS, recipe.seed)
    tx = converge_optimizer(recipe.momentum, recipe.weight_decay, recipe.base_lr)
    state, _ = DATA_PARALLEL.create_state(run.model, variables, tx, run.replicated)
    del variables
    batchnorm = DATA_PARALLEL.batchnorm(spec)
    a = NativeConverge(run, state, run.step(run.replicated, batchnorm, DATA_PARALLEL),
                       len(splits.y_heldout))
    result = train_to_accuracy(spec, stepwise(a.step, a.mean_loss), a.evaluate, a.moving_stats,
                               jax.process_index(), a.world, splits)
    # the gradients have the params' dtypes (they are taken with respect to them); the dtype
    # lines are a built-in's (cast None), as this mode has always recorded them
    return join(result, run.record(a.state, StepRecord(
        batchnorm, a.collectives, common.sharding_record(run.replicated), a.state.params, a.hlo,
        None)), run.loss_record(), {
        "framework": common.framework_versions(*VERSIONS),
        "loss_kind": "global mean cross-entropy of each step's batch, averaged over the epoch",
        "optimizer": code("jax.optax_sgd_weight_decay"),
        # per epoch, the rate of its last step, read back from the optax state after it
        "lr_read_back": a.lrs,
        "moving_stats_read": a.read,
    }, placement_fields(a, result["curve"]), common.close_multihost(spec))


def placement_fields(a: NativeConverge, curve: list[dict[str, Any]]) -> dict[str, Any]:
    """The placement of the first epoch (every process's devices, gathered) and how the data
    went in; across processes, also each process's held-out accuracies, which must agree.
    Collectives across processes: every process calls it."""
    placement = common.all_placement(a.rows)
    if sum(placement.values()) != sum(a.rows_fed):
        raise Invalid(f"the first epoch fed {sum(placement.values())} rows to the devices, not "
                      f"its {sum(a.rows_fed)}")
    fields = {"placement": placement, "placement_source": code("jax.batch_rows_first_epoch")}
    if a.world == 1:
        return {**fields, "data_placement": "the recipe's host numpy batches "
                "(runners/converge.py) device_put into the batch sharding every step"}
    accuracies = common.allgather_json([p["accuracy"] for p in curve])
    if any(acc != accuracies[0] for acc in accuracies):
        raise Invalid(f"the processes' held-out accuracies differ: {accuracies}")
    return {**fields, "data_placement": "each process's share of each batch (epoch_batches) in "
            "jax.make_array_from_process_local_data",
            "heldout_evaluation": "every process feeds all held-out rows, each device "
            "predicts its share, process_allgather",
            "heldout_accuracy_per_process": accuracies}


if __name__ == "__main__":
    main(benchmark, equivalence, converge)
