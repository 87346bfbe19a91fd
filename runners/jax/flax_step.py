"""The Flax train step jax_native and jax_fsdp share: the mesh's shardings, the state built under
jit, the jitted SGD step (per-device BatchNorm under shard_map, or global under plain jit), its
AOT compile with its collectives, the untimed gradient call, and `Layout` (replicated or
sharded). Imports no framework at module level."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from contract.reasons import code
from models import build_for
from runners.common import Invalid, Spec

if TYPE_CHECKING:
    import flax.linen as nn
    import jax
    import optax
    from flax.training import train_state

DROPOUT_SEED = 1
AXIS = "data"  # jax_native's mesh axis, along which the batch is split


def make_shardings(devices: list[jax.Device], axis: str = AXIS) -> tuple[Any, Any]:
    """(replicated, batch-sharded) NamedShardings over a 1-D mesh of the devices, its one axis
    `axis` (default "data")."""
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(devices), (axis,))
    return NamedSharding(mesh, P()), NamedSharding(mesh, P(axis))


def state_maker(model: nn.Module, tx: optax.GradientTransformation
                ) -> Callable[[Any], train_state.TrainState]:
    """The function of the initial variables that builds the train state: Flax's TrainState
    (params, optax state, step counter) plus the BatchNorm statistics."""
    from flax.training import train_state

    class TrainState(train_state.TrainState):
        batch_stats: Any

    def make(variables: Any) -> train_state.TrainState:
        return TrainState.create(apply_fn=model.apply, params=variables["params"], tx=tx,
                                 batch_stats=variables.get("batch_stats", {}))

    return make


def create_state(model: nn.Module, variables: Any, tx: optax.GradientTransformation,
                 sharding: Any) -> train_state.TrainState:
    """The train state built under jit directly into `sharding` (one for every leaf, or a tree
    of them shaped like the state)."""
    import jax

    return jax.jit(state_maker(model, tx), out_shardings=sharding)(variables)


def init_variables(model: nn.Module, shape: tuple[int, ...], dtype: str = "float32",
                   call: dict[str, Any] | None = None, seed: int = 0) -> Any:
    """The model's initial variables (seeded by `seed`, default 0) on the default device, from
    a batch of one sample of `shape` (H, W, C images; (seq_len,) int32 token ids), the module
    called with `call` (default train=False; {} for a user's module that takes no `train`)."""
    import jax
    import jax.numpy as jnp

    from models.flax_common import init_rngs

    x = jnp.zeros((1, *shape), dtype)
    call = {"train": False} if call is None else call
    return jax.jit(lambda: model.init(init_rngs(seed), x, **call))()


BATCHNORM_MODES = ("per_device", "global")
BATCHNORM_RECORD = {
    "per_device": code("jax.flax_batchnorm_per_device"),
    "global": "global-batch statistics (jit over the sharded batch: XLA all-reduces the mean "
              "and variance)",
}


def cast_floats(tree: Any, dtype: Any) -> Any:
    """The tree with its floating arrays cast to `dtype` (a user's model in bf16)."""
    import jax
    import jax.numpy as jnp

    return jax.tree_util.tree_map(
        lambda a: a.astype(dtype) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)


def loss_and_grads(call: dict[str, Any] | None = None, cast: Any = None,
                   grads_sharding: Any = None, loss_of: Callable[[Any, Any], Any] | None = None
                   ) -> Callable[..., tuple[Any, Any, Any]]:
    """The function (state, x, y, dropout key) -> (mean loss over x's rows, its gradients, the
    updated BatchNorm statistics) of make_train_step (its `call` and `cast`); the gradients
    constrained to `grads_sharding` (a tree of the params' shape; jax_fsdp's) if given; the
    loss `loss_of(logits, y)` (default: cross_entropy.token_loss, float32)."""
    import jax

    from runners.jax.cross_entropy import token_loss

    kwargs = {"train": True} if call is None else call
    loss_of = token_loss if loss_of is None else loss_of

    def grads_and_stats(state: train_state.TrainState, x: jax.Array, y: jax.Array,
                        dropout: jax.Array) -> tuple[jax.Array, Any, Any]:
        """(mean loss over x's rows, its gradients, the updated BatchNorm statistics)."""

        def loss_fn(params: Any) -> tuple[jax.Array, Any]:
            if cast is not None:
                params, inputs = cast_floats(params, cast), cast_floats(x, cast)
            else:
                inputs = x
            logits, updates = state.apply_fn(
                {"params": params, "batch_stats": state.batch_stats}, inputs, **kwargs,
                mutable=["batch_stats"], rngs={"dropout": dropout})
            return loss_of(logits, y), updates

        (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        if grads_sharding is not None:
            grads = jax.lax.with_sharding_constraint(grads, grads_sharding)
        return loss, grads, updates.get("batch_stats", state.batch_stats)

    return grads_and_stats


def make_train_step(state_sharding: Any, batch: Any, batchnorm: str = "per_device",
                    call: dict[str, Any] | None = None, cast: Any = None,
                    grads_sharding: Any = None, loss_of: Callable[[Any, Any], Any] | None = None
                    ) -> Callable[..., Any]:
    """The jitted step (state, x, y) -> (state, loss): SGD on the mean cross-entropy, BatchNorm
    statistics updated, per device under shard_map (needs a replicated state) or global under
    plain jit; the state donated and its shardings pinned. `call`: the module's training kwargs;
    `cast`: a user's bf16 model's casts; `grads_sharding`: the gradients constrained to it;
    `loss_of`: the loss of (logits, labels) (loss_and_grads)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    if batchnorm not in BATCHNORM_MODES:
        raise Invalid(f"batchnorm must be one of {BATCHNORM_MODES}, not {batchnorm!r}")
    grads_and_stats = loss_and_grads(call, cast, grads_sharding, loss_of)
    axis = batch.spec[0]
    scalar = NamedSharding(batch.mesh, P())

    def global_step(state: train_state.TrainState, x: jax.Array, y: jax.Array
                    ) -> tuple[train_state.TrainState, jax.Array]:
        dropout = jax.random.fold_in(jax.random.key(DROPOUT_SEED), state.step)
        loss, grads, stats = grads_and_stats(state, x, y, dropout)
        return state.apply_gradients(grads=grads, batch_stats=stats), loss

    def device_step(state: train_state.TrainState, x: jax.Array, y: jax.Array
                    ) -> tuple[train_state.TrainState, jax.Array]:
        """One device's part: its B/N rows in, the averaged update applied to its replica."""
        dropout = jax.random.fold_in(jax.random.key(DROPOUT_SEED), state.step)
        dropout = jax.random.fold_in(dropout, jax.lax.axis_index(axis))
        loss, grads, stats = grads_and_stats(state, x, y, dropout)
        grads, stats, loss = jax.lax.pmean((grads, stats, loss), axis)
        return state.apply_gradients(grads=grads, batch_stats=stats), loss

    step = global_step
    if batchnorm == "per_device":
        # check_vma=False: the gradients stay per device until the explicit pmean (with
        # check_vma=True jax would psum the replicated params' gradients on its own).
        step = jax.shard_map(device_step, mesh=batch.mesh, in_specs=(P(), P(axis), P(axis)),
                             out_specs=(P(), P()), check_vma=False)
    return jax.jit(step, in_shardings=(state_sharding, batch, batch),
                   out_shardings=(state_sharding, scalar), donate_argnums=0)


def gradients_once(state: Any, x: Any, y: Any, state_sharding: Any, batch: Any,
                   grads_and_stats: Callable[..., tuple[Any, Any, Any]]) -> Any:
    """The gradients of the step's loss (`grads_and_stats`: loss_and_grads of the step's
    settings) on (x, y) at `state`, from one untimed call of a jitted function with the step's
    input shardings, laid out as XLA holds them (for the state record)."""
    import jax


    def grads(state: Any, x: Any, y: Any) -> Any:
        dropout = jax.random.fold_in(jax.random.key(DROPOUT_SEED), state.step)
        return grads_and_stats(state, x, y, dropout)[1]

    return jax.block_until_ready(
        jax.jit(grads, in_shardings=(state_sharding, batch, batch))(state, x, y))


def compile_step(step: Any, state: Any, x: Any, y: Any) -> tuple[Any, dict[str, int]]:
    """The step compiled ahead of time for these arguments, and the collectives XLA put in it."""
    compiled = step.lower(state, x, y).compile()
    hlo = compiled.as_text()
    ops = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
    return compiled, {op: hlo.count(f" {op}(") + hlo.count(f" {op}-start(") for op in ops}


def build_model(spec: Spec, model_spec: Any, dtype: Any, attention: str | None = None
                ) -> tuple[Any, dict[str, Any] | None]:
    """(the run's Flax module, describe()'s counts for a user's model, None for a built-in):
    a built-in's flax builder with the compute dtype (and `attention`, a transformer's
    jax.nn.dot_product_attention implementation, where given), or the user's build function; a
    user's model that cannot be built, is not a flax.linen.Module, fails on its declared input
    or returns other logits than it declares is Invalid."""
    import flax.linen as nn

    from models.custom import CustomModelError, check_output, not_a_model
    from models.flax_common import describe

    try:
        model = build_for(spec, "flax", dtype=dtype,
                          **({"attention": attention} if attention else {}))
        if model_spec.workload != "custom":
            return model, None
        if not isinstance(model, nn.Module):
            raise not_a_model(spec.custom_model, model, "a flax.linen.Module")
        counted = describe(model, model_spec)
        check_output(spec.custom_model, model_spec, counted["output_shape"], 2)
    except CustomModelError as exc:
        raise Invalid(str(exc)) from None
    return model, counted


@dataclass(frozen=True)
class Layout:
    """How a runner of this step lays the train state out over its 1-D mesh: jax_native
    replicates it (DATA_PARALLEL); jax_fsdp (runners/jax/fsdp.py) shards it."""

    axis: str  # the mesh's one axis, along which the batch is split too
    # (replicated sharding, abstract TrainState) -> the state's sharding (one, or a tree)
    state_sharding: Callable[[Any, Any], Any]
    # the batchnorm mode of a run (its option, or the one the layout allows)
    batchnorm: Callable[[Spec], str]
    # the record's shardings["params"] of a run's params (read back from the arrays)
    params_record: Callable[[Any, Any], Any]
    state_source: str
    # the step constrains the gradients to the params' shardings (jax_fsdp)
    constrain_grads: bool = False

    def grads_sharding(self, state_sharding: Any) -> Any:
        """The gradients' sharding the step asks for: the params' (a tree), or None."""
        return state_sharding.params if self.constrain_grads else None

    def create_state(self, model: nn.Module, variables: Any, tx: optax.GradientTransformation,
                     replicated: Any) -> tuple[train_state.TrainState, Any]:
        """(the train state built under jit into this layout, the state's sharding)."""
        import jax

        make = state_maker(model, tx)
        sharding = self.state_sharding(replicated, jax.eval_shape(make, variables))
        return jax.jit(make, out_shardings=sharding)(variables), sharding
