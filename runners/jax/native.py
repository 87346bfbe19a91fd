"""Native JAX: one jitted train step over a 1-D device mesh, data parallel; Flax (linen) model,
optax SGD with momentum. Follows jax 0.10.2's own two idioms for data parallelism, chosen by the
option `batchnorm`.

Split: the N devices form a Mesh with one axis, "data". The global batch is one jax.Array
sharded along axis 0 (NamedSharding(mesh, P("data"))): each device holds B/N rows. The
synthetic batch is generated once, under jit, straight into that sharding, so a step copies
nothing from the host. Params, BatchNorm statistics, the momentum and the step counter are
replicated (NamedSharding(mesh, P())), and the jitted step's in/out shardings pin them there.
Synchronise: every device applies the same all-reduced update inside the same program
(synchronous SGD); the state buffers are donated, so an update happens in place.

batchnorm: per_device (default, as MirroredStrategy, DDP, MXNet and the Keras towers normalise)
  The step is jax.shard_map over the mesh: each device runs the Flax model on its own B/N rows,
  so every BatchNorm layer normalises with the moments of those rows (no collective inside the
  forward pass). Reduce: each device's gradient of its local mean cross-entropy is averaged
  over the "data" axis with lax.pmean (an all-reduce, then / N: the gradient of the global mean
  loss, the rows being split evenly), as DDP averages its ranks' gradients. Dropout masks
  differ per device (the rng is folded with the device's axis index). Moving statistics: each
  device updates the running mean and variance with its own moments, then the updated
  statistics are averaged over the devices (lax.pmean, one small all-reduce per step), so every
  device holds the mean of the N per-device running statistics. The update being linear
  (new = momentum x old + (1 - momentum) x moment), this is exactly what MirroredStrategy users
  read from Keras' BatchNormalization variables (SyncOnRead, aggregation MEAN: each replica
  keeps its own copy, a read returns their mean); DDP instead broadcasts rank 0's buffers
  (broadcast_buffers=True), i.e. keeps device 0's statistics only.
batchnorm: global (the pre-2026 behaviour; "sync BatchNorm")
  The step is written for the global batch (value_and_grad of the mean softmax cross-entropy
  over all B rows) under plain jit; XLA's SPMD partitioner splits it per device and, because
  the loss, the parameter gradients and every BatchNorm's batch mean and variance reduce over
  the sharded batch axis, inserts the all-reduces itself (NCCL between GPUs, an in-process
  reduction between virtual CPU devices): statistics are over the whole global batch, one
  all-reduce per BatchNorm layer per pass. Observed (tests/test_jax_runners.py): after one step
  on 2 devices whose halves differ, the running variance is the whole batch's variance under
  global and the mean of the two halves' variances under per_device.
The compiled step's collectives are counted from its HLO and recorded.

Models (models.spec_of / build_for): the CNNs and the built-in transformers (gpt2, gpt2_tiny,
vit_b16, vit_tiny: models/transformer_flax.py) from their flax builders with the compute dtype,
or a user's flax.linen Module (spec.custom_model, models/custom.py), built as written and called
with `train` only if its __call__ takes it. A token model (gpt2, a user's `tokens` entry) trains
on one synthetic batch of ids (B, T + 1) generated under jit into the batch sharding, inputs
ids[:, :-1] and next-token targets ids[:, 1:], the loss the mean cross-entropy of the float32
logits (B, T, V) over all B x T positions; real data is images only. A model without BatchNorm
has no batch_stats: the train state holds an empty one and both batchnorm modes run unchanged
(per_device still pmean's the gradients and the loss). The result's params are counted from
the initialised variables; flops_per_sample is ours for a CNN (count_flops_flax), the spec's
standard count for a built-in transformer, and XLA's cost analysis of the jitted forward for a
user's model (models.flax_common.describe), with flops_source, tokens_per_sample and workload
beside it. A user's model in bf16 computes in bfloat16 by casting its float params and inputs
inside the step (the float32 params are updated); a built-in is built with dtype=bfloat16.

Placement (`placement`): the rows of the first timed batch on each device, read from the batch
jax.Array's addressable_shards (each shard's device and its index into the batch axis).
Real data (data: real): the global batch comes from the Grain pipeline of runners/jax/data.py
(Pillow decode and crop/flip in `workers` processes), each batch jax.device_put into the batch
sharding one batch ahead; the step is compiled for its shapes before the first batch is read,
so the input pipeline's start-up falls in the warm-up and its steady state in the timed window.
Timing: the loss is replicated, so loss.block_until_ready() waits for its copy on every device
(float(loss) would wait only for device 0's copy); every output of one execution on a device
becomes ready together, so the whole step has finished everywhere at each clock reading.
Samples are counted from the train state's step counter (Flax TrainState.step, incremented
inside the jitted step; optax's sgd keeps no counter of its own), read back after the window.
Precision: bf16 builds the Flax model with dtype=bfloat16 (bfloat16 compute, float32 params,
float32 BatchNorm statistics and reductions), the logits cast to float32 for the loss; the
optimizer updates the float32 params.
State (`state_bytes_per_device`, issue 27; runners/jax/state.py): after the timed window, the
bytes each device holds of the params and the optax state (each array's addressable_shards: a
full replica on every device here) and of the gradients, from one extra untimed call of a jitted
gradient function with the step's input shardings (XLA returns them all-reduced, replicated);
`precision_policy` with the reduction dtype read from the compiled step's all-reduce ops. The
step itself is shared with jax_fsdp (runners/jax/fsdp.py), which passes its own Layout.
Equivalence mode runs the same step (same batchnorm mode, same AOT compile) on the probe model
with the batch laid out in the batch sharding by jax.make_array_from_process_local_data (on one
process, a device_put).

Across nodes (spec.num_nodes > 1, issue 16; jax 0.10.2): one process per node, started by srun
(bench/run/slurm_job.py), each driving spec.devices_per_node devices. setup_devices joins them with
JAX's own multi-controller mechanism, jax.distributed.initialize() called with no arguments, so
that its SlurmCluster auto-detection reads SLURM's variables (runners/jax/common.py says what it
reads and the two things the runner sets: gloo CPU collectives, the coordinator port). The mesh
is then jax.devices(), the devices of every process, and every process runs the same programs:
the synthetic batch is generated under jit straight into the global batch sharding, so each
device, hence each process, computes only its own rows (nothing is made on a host, nothing
crosses processes); the step's pmean (batchnorm per_device) or XLA's inserted all-reduces
(global) run between the processes over gloo on CPU; the replicated state is the same on every
process. The equivalence batch is the same on every process, and
make_array_from_process_local_data takes each process's rows of it. The placement is each
process's addressable shards gathered through JAX (multihost_utils.process_allgather), keyed
"cpu:2048 (process 1)"; the result adds `nodes` and `multi_node` (common.close_multihost) and
only process 0 writes it. Real data across nodes is unavailable (MULTI_NODE_REAL_DATA).
What differs from a real cluster: tools/local_slurm.sh's two nodes are one 2-core machine, so
gloo's traffic stays on loopback and the processes share the cores (its images/sec say nothing
of a cluster's); on GPUs the collectives between nodes would be XLA's NCCL, which is untested.
Mode converge (`converge`, runners/converge.py's recipe and loop): the benchmark's model (same
flax builder, compute dtype, seeded from recipe.seed through init's rngs, so 1 and 2 devices
start alike), mesh, shardings and jitted step (same `batchnorm` mode, compiled ahead of time for
each batch shape met: one for whole batches, one more for a kept short batch), trained in the
runner's own loop: each of the recipe's global batches (host numpy) is device_put into the batch
sharding (B/N rows per device) and stepped once. The optimizer is
optax.inject_hyperparams over chain(add_decayed_weights(weight_decay), sgd(lr, momentum)), i.e.
torch.optim.SGD's update (decay added to the gradient, then the momentum trace, then x -lr);
before each step the learning rate in the optax state (its `hyperparams`) is replaced with
lr_at(step), a replicated float32, so the compiled step reads it as an argument and nothing
recompiles. The held-out split is predicted in inference mode (train=False: BatchNorm's
running statistics, no dropout) by a jitted forward over the same batch sharding, in padded
chunks of equal size (one compile), the padding's predictions dropped; moving_stats reads every
leaf of the train state's batch_stats collection (Flax's BatchNorm "mean" and "var", device 0's
copy: per_device mode keeps the copies equal by pmean, global by construction). The placement is
the rows per device of the first epoch's training batches (their jax.Arrays'
addressable_shards, summed), which add up to the epoch's training rows. What differs from the
benchmark: host batches copied per step (as the real-data path does, without look-ahead),
a kept short batch whose rows do not divide by N is unavailable (a NamedSharding lays out even
shares only), and no run across nodes (one process holds the whole batches).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from models import build_for, get_spec, load_builder, model_fields, spec_of
from runners.common import Invalid, Spec, Unavailable, finite, main, timed_loop
from runners.jax.common import (
    all_placement,
    close_multihost,
    framework_versions,
    host_labels,
    placement,
    real_dataset,
    setup_devices,
    sharding_record,
    synthetic_batch,
)
from runners.jax.state import compute_dtype, precision_record, state_record
from runners.memory import model_state_jax
from runners.real_data import RealData, describe

if TYPE_CHECKING:
    import flax.linen as nn
    import jax
    import optax
    from flax.training import train_state

VERSIONS = ("flax", "optax")
DROPOUT_SEED = 1
AXIS = "data"  # the mesh's one axis, along which the batch is split
PLACEMENT_SOURCE = ("rows of the first timed batch per device, from the batch jax.Array's "
                    "addressable_shards")


def make_shardings(devices: list[jax.Device], axis: str = AXIS) -> tuple[Any, Any]:
    """(replicated, batch-sharded) NamedShardings over a 1-D mesh of the devices, its one axis
    `axis` (default "data")."""
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(devices), (axis,))
    return NamedSharding(mesh, P()), NamedSharding(mesh, P(axis))


def state_class() -> type[train_state.TrainState]:
    """Flax's TrainState (params, optax state, step counter) plus the BatchNorm statistics."""
    from flax.training import train_state

    class TrainState(train_state.TrainState):
        batch_stats: Any

    return TrainState


def create_state(model: nn.Module, variables: Any, tx: optax.GradientTransformation,
                 sharding: Any) -> train_state.TrainState:
    """The train state built under jit directly into `sharding`: one sharding for every leaf
    (replicated), or a function of the abstract state (jax.eval_shape's) giving the sharding
    of each of its leaves (jax_fsdp's)."""
    import jax

    cls = state_class()

    def make(variables: Any) -> train_state.TrainState:
        return cls.create(apply_fn=model.apply, params=variables["params"], tx=tx,
                          batch_stats=variables.get("batch_stats", {}))

    if callable(sharding):
        sharding = sharding(jax.eval_shape(make, variables))
    return jax.jit(make, out_shardings=sharding)(variables)


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
    "per_device": "per-device statistics (shard_map: each device's B/N rows); running "
                  "statistics averaged over devices after each step (pmean)",
    "global": "global-batch statistics (jit over the sharded batch: XLA all-reduces the mean "
              "and variance)",
}


def loss_and_grads(call: dict[str, Any] | None = None, cast: Any = None,
                   grads_sharding: Any = None) -> Callable[..., tuple[Any, Any, Any]]:
    """The function (state, x, y, dropout key) -> (mean loss over x's rows, its gradients, the
    updated BatchNorm statistics) of make_train_step (its `call` and `cast`); the gradients
    constrained to `grads_sharding` (a tree of the params' shape; jax_fsdp's) if given."""
    import jax
    import jax.numpy as jnp
    import optax

    kwargs = {"train": True} if call is None else call

    def cast_floats(tree: Any) -> Any:
        return jax.tree_util.tree_map(
            lambda a: a.astype(cast) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)

    def grads_and_stats(state: train_state.TrainState, x: jax.Array, y: jax.Array,
                        dropout: jax.Array) -> tuple[jax.Array, Any, Any]:
        """(mean loss over x's rows, its gradients, the updated BatchNorm statistics)."""

        def loss_fn(params: Any) -> tuple[jax.Array, Any]:
            if cast is not None:
                params, inputs = cast_floats(params), cast_floats(x)
            else:
                inputs = x
            logits, updates = state.apply_fn(
                {"params": params, "batch_stats": state.batch_stats}, inputs, **kwargs,
                mutable=["batch_stats"], rngs={"dropout": dropout})
            loss = optax.softmax_cross_entropy_with_integer_labels(
                logits.astype(jnp.float32), y).mean()
            return loss, updates

        (loss, updates), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        if grads_sharding is not None:
            grads = jax.lax.with_sharding_constraint(grads, grads_sharding)
        return loss, grads, updates.get("batch_stats", state.batch_stats)

    return grads_and_stats


def make_train_step(state_sharding: Any, batch: Any, batchnorm: str = "per_device",
                    call: dict[str, Any] | None = None, cast: Any = None,
                    grads_sharding: Any = None) -> Callable[..., Any]:
    """The jitted step (state, x, y) -> (state, loss): SGD on the mean cross-entropy (over the
    rows, or over every position of (B, T, V) token logits), BatchNorm statistics updated (a
    model without BatchNorm has an empty batch_stats), per device under shard_map or over the
    global batch under plain jit (see the module docstring); the state donated, its shardings
    (`state_sharding`: one replicated sharding, or jax_fsdp's tree) pinned, the loss
    replicated. `call`: the module's keyword arguments in training (default train=True; {}
    for a user's module without `train`). `cast` (a user's model in bf16): the params and a
    float input cast to that dtype inside the step, the float32 params updated. per_device
    needs a replicated state (shard_map hands each device its whole replica).
    `grads_sharding`: the gradients constrained to it (jax_fsdp: the params' shardings)."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    if batchnorm not in BATCHNORM_MODES:
        raise Invalid(f"batchnorm must be one of {BATCHNORM_MODES}, not {batchnorm!r}")
    grads_and_stats = loss_and_grads(call, cast, grads_sharding)
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
                   call: dict[str, Any] | None = None, cast: Any = None,
                   grads_sharding: Any = None) -> Any:
    """The gradients of the step's loss on (x, y) at `state`, from one call of a jitted
    function with the step's input shardings and no output sharding asked for: XLA's SPMD
    partitioner returns them laid out as it holds them (reduced: replicated, or sharded like
    the params where the step constrains them so, `grads_sharding`); for the state record,
    after the timed window."""
    import jax

    grads_and_stats = loss_and_grads(call, cast, grads_sharding)

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


def token_batch(seq_len: int, vocab: int, global_batch: int, sharding: Any
                ) -> tuple[jax.Array, jax.Array]:
    """One random global batch of token ids (B, T + 1) in [0, vocab), generated by a jitted
    function straight into the batch sharding (each device makes its own rows), split into the
    inputs ids[:, :-1] and the next-token targets ids[:, 1:], both (B, T) int32."""
    import jax
    import jax.numpy as jnp

    def make() -> tuple[jax.Array, jax.Array]:
        ids = jax.random.randint(jax.random.key(0), (global_batch, seq_len + 1), 0, vocab,
                                 jnp.int32)
        return ids[:, :-1], ids[:, 1:]

    return jax.block_until_ready(jax.jit(make, out_shardings=(sharding, sharding))())


TOKENS_REAL_DATA = ("data real: the prepared datasets are images; a token model trains on "
                    "synthetic tokens")


def input_batches(data: RealData | None, model_spec: Any, global_batch: int, batch: Any
                  ) -> tuple[Iterator[Any], Any, Any, dict[str, Any]]:
    """(batches, x and y to compile the step for, what the record says about the input):
    one resident synthetic batch for ever (images and labels, or token ids and their next
    tokens), or the Grain pipeline's batches."""
    import jax
    import jax.numpy as jnp

    if data is None and model_spec.input_kind == "tokens":
        x, y = token_batch(model_spec.input_shape[0], model_spec.num_classes, global_batch,
                           batch)
        return itertools.repeat((x, y)), x, y, {
            "data_placement": "one synthetic global batch of token ids (B, T + 1) generated "
                              "under jit into the batch sharding (inputs ids[:, :-1], targets "
                              "ids[:, 1:]); no host copy per step"}
    if data is None:
        x, y = synthetic_batch(model_spec.input_shape, model_spec.num_classes, global_batch,
                               batch)
        return itertools.repeat((x, y)), x, y, {
            "data_placement": "one synthetic global batch generated under jit into the batch "
                              "sharding; no host copy per step"}
    from runners.jax.data import device_batches

    size = model_spec.input_shape[0]
    batches, line = device_batches(data, size, global_batch, batch)
    x = jax.ShapeDtypeStruct((global_batch, *model_spec.input_shape), jnp.float32,
                             sharding=batch)
    y = jax.ShapeDtypeStruct((global_batch,), jnp.int32, sharding=batch)
    return batches, x, y, {**describe(data, size), "input_pipeline": line,
                           "data_placement": "a host batch per step from the Grain workers, "
                                             "device_put into the batch sharding"}


MULTI_NODE_REAL_DATA = (
    "data: real across nodes: the Grain pipeline (runners/jax/data.py) makes whole global "
    "batches, so every process would decode all of each batch; a per-process shard of the file "
    "stream is not built yet")


def build_model(spec: Spec, model_spec: Any, dtype: Any) -> tuple[Any, dict[str, Any] | None]:
    """(the run's Flax module, describe()'s counts for a user's model, None for a built-in):
    a built-in's flax builder with the compute dtype, or the user's build function; a user's
    model that cannot be built, is not a flax.linen.Module, fails on its declared input or
    returns other logits than it declares is Invalid."""
    import flax.linen as nn

    from models.custom import CustomModelError, check_output, not_a_model
    from models.flax_common import describe

    try:
        model = build_for(spec, "flax", dtype=dtype)
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


DATA_PARALLEL = Layout(
    AXIS, lambda replicated, abstract: replicated, lambda spec: spec.options["batchnorm"],
    lambda replicated, params: sharding_record(replicated),
    "jax: every array's addressable_shards (shard.data.nbytes per device) after the timed "
    "window: the params and optax state of the train state (replicated: a full copy on each "
    "device; batch_stats not counted), and the gradients from one extra untimed call of a "
    "jitted gradient function with the step's input shardings on the first timed batch, laid "
    "out as XLA returns them (all-reduced, replicated)")


def benchmark(spec: Spec, layout: Layout = DATA_PARALLEL) -> dict[str, Any]:
    """The timed run (jax_native's, or jax_fsdp's with its layout)."""
    if spec.num_nodes > 1 and spec.data != "synthetic":
        raise Unavailable(MULTI_NODE_REAL_DATA)
    model_spec = spec_of(spec)
    tokens = model_spec.input_kind == "tokens"
    if tokens and spec.data != "synthetic":
        raise Unavailable(TOKENS_REAL_DATA)
    devices, described = setup_devices(spec)
    import jax.numpy as jnp
    import optax

    from models.flax_common import count_flops_flax, count_params_flax, train_kwargs

    n, global_batch = len(devices), spec.global_batch_size
    spec.split_batch(n)
    dtype = {"fp32": None, "tf32": None, "bf16": jnp.bfloat16}[spec.precision]
    data = real_dataset(spec, model_spec)
    model, counted = build_model(spec, model_spec, dtype)
    # a user's model is built as written: bf16 casts its params and inputs inside the step
    cast = dtype if counted is not None else None
    replicated, batch = make_shardings(devices, layout.axis)
    variables = init_variables(model, model_spec.input_shape, "int32" if tokens else "float32",
                               train_kwargs(model, False))
    params = count_params_flax(variables)
    state_sharding: Any = None

    def shard(abstract: Any) -> Any:
        nonlocal state_sharding
        state_sharding = layout.state_sharding(replicated, abstract)
        return state_sharding

    state = create_state(model, variables, optax.sgd(0.01, momentum=0.9), shard)
    del variables
    batches, x, y, input_record = input_batches(data, model_spec, global_batch, batch)
    batchnorm = layout.batchnorm(spec)
    fields = model_fields(model_spec, lambda: params,
                          lambda: count_flops_flax(model, model_spec.input_shape),
                          lambda: counted)
    call = train_kwargs(model, True)
    try:
        step, collectives = compile_step(
            make_train_step(state_sharding, batch, batchnorm, call, cast,
                            layout.grads_sharding(state_sharding)), state, x, y)
        start: int | None = None  # the step counter when the clock starts
        first: tuple[Any, Any] | None = None  # the first timed batch

        def open_window() -> None:
            nonlocal start
            start = int(state.step)

        def run() -> Any:
            nonlocal state, first
            x, y = next(batches)
            state, loss = step(state, x, y)
            if start is not None and first is None:
                first = x, y
            return loss

        # loss.block_until_ready(): every device's copy, so the step has finished everywhere
        window = timed_loop(run, lambda loss: loss.block_until_ready(), spec.warmup_steps,
                            spec.measure_steps, on_start=open_window)
    finally:
        if data is not None:
            batches.close()  # the Grain workers
    steps = int(state.step) - start
    # after the window, untimed: the gradients as the strategy holds them, for the state record
    grads = gradients_once(state, *first, state_sharding, batch, call, cast,
                           layout.grads_sharding(state_sharding))
    framework, extra = framework_versions(*VERSIONS), {}
    if data is not None:
        from runners.jax.data import grain_version

        framework.update(grain_version())
        extra = {"first_timed_labels": host_labels(first[1])}
    dtype_line = "float32" if dtype is None else "bfloat16 compute, float32 params"
    how = ("flax module dtype=bfloat16 (param_dtype float32), float32 logits for the loss"
           if dtype is not None else "flax module dtype float32")
    if cast is not None:
        dtype_line = "bfloat16 compute (params and inputs cast in the step), float32 params"
        how = "the user's module's float32 params and float inputs cast to bfloat16 in the step"
    return {
        **window.summary(global_batch, steps * global_batch),
        "loss_kind": ("global mean next-token cross-entropy over every position of each "
                      "step's batch" if tokens else "global mean cross-entropy of each step's "
                                                    "batch"),
        "replicas": n,
        "framework": framework,
        "devices": described,
        "layout": "token ids (batch, sequence)" if tokens else "channels_last",
        "dtype": dtype_line,
        "shardings": {"params": layout.params_record(replicated, state.params),
                      "batch": sharding_record(batch), "per_device_batch": global_batch // n},
        "collectives": collectives,
        # "none" for a model without BatchNorm (the option then changes nothing)
        "batchnorm": batchnorm if state.batch_stats else "none",
        "batchnorm_statistics": (BATCHNORM_RECORD[batchnorm] if state.batch_stats else
                                 "none: the model has no BatchNorm"),
        "placement": all_placement(placement(first[0])),
        "placement_source": PLACEMENT_SOURCE,
        **input_record,
        **extra,
        **fields,
        **model_state_jax(state.params, state.opt_state, state.batch_stats),
        **state_record({"params": state.params, "grads": grads, "optimizer": state.opt_state},
                       devices, layout.state_source),
        **precision_record(spec.precision, compute=compute_dtype(cast or getattr(
            model, "dtype", None)), params=state.params, grads=grads, hlo=step.as_text(),
            how=how),
        **close_multihost(spec),
    }


def equivalence(spec: Spec, layout: Layout = DATA_PARALLEL) -> dict[str, Any]:
    """One plain SGD step on the probe model through the benchmark's step (same batchnorm mode,
    same shard_map or jit, the same state layout, compiled ahead of time as there), the batch
    laid out in the batch sharding by jax.make_array_from_process_local_data (each process the
    rows of its own devices; one process: a device_put); weights saved (by process 0 across
    nodes; a sharded state is gathered to every process first)."""
    devices, described = setup_devices(spec)
    import jax
    import optax

    from models.flax_common import get_canonical_weights, set_canonical_weights

    weights, x, y, lr = spec.equivalence_inputs()
    n = len(devices)
    spec.split_batch(n, rows=len(x))
    model_spec = get_spec("probe")
    model = load_builder("probe", "flax")(model_spec)
    variables = set_canonical_weights(init_variables(model, model_spec.input_shape), weights)
    replicated, batch = make_shardings(devices, layout.axis)
    state_sharding: Any = None

    def shard(abstract: Any) -> Any:
        nonlocal state_sharding
        state_sharding = layout.state_sharding(replicated, abstract)
        return state_sharding

    state = create_state(model, variables, optax.sgd(lr), shard)
    # inputs come NHWC; every process holds the whole batch and gives each device its rows
    xs = jax.make_array_from_process_local_data(batch, x, x.shape)
    ys = jax.make_array_from_process_local_data(batch, y, y.shape)
    batchnorm = layout.batchnorm(spec)
    step, collectives = compile_step(make_train_step(
        state_sharding, batch, batchnorm, grads_sharding=layout.grads_sharding(state_sharding)),
        state, xs, ys)
    state, loss = step(state, xs, ys)
    finite(loss.block_until_ready())
    params = state.params
    if not all(a.is_fully_addressable for a in jax.tree_util.tree_leaves(params)):
        from jax.experimental import multihost_utils

        params = multihost_utils.process_allgather(params, tiled=True)
    canonical = get_canonical_weights({"params": params})
    if jax.process_index() == 0:
        spec.save_equivalence_output(canonical)
    return {"replicas": n, "framework": framework_versions(*VERSIONS), "devices": described,
            "loss": float(loss), "batch_sharding": sharding_record(xs.sharding),
            "params_sharding": layout.params_record(replicated, state.params),
            "batchnorm": batchnorm, "collectives": collectives,
            "placement": all_placement(placement(xs)), "placement_source": PLACEMENT_SOURCE,
            **close_multihost(spec)}


MULTI_NODE_CONVERGE = ("mode converge across nodes: the recipe's batches are made whole on one "
                       "process (runners/converge.py); a per-process share fed through "
                       "make_array_from_process_local_data is not built yet")
CONVERGE_PLACEMENT_SOURCE = ("rows per device of the first epoch's training batches, from each "
                             "batch jax.Array's addressable_shards (summed over the epoch)")
EVAL_CHUNK = 1024  # held-out rows per inference call at most (padded to a multiple of N)


def converge_optimizer(momentum: float, weight_decay: float, lr: float
                       ) -> optax.GradientTransformation:
    """torch.optim.SGD's update in optax: weight decay added to the gradient, the momentum
    trace, x -lr; the learning rate a hyperparameter held in the optax state
    (inject_hyperparams), so that it can be set before every step (with_lr)."""
    import optax

    def make(learning_rate: float) -> optax.GradientTransformation:
        return optax.chain(optax.add_decayed_weights(weight_decay),
                           optax.sgd(learning_rate, momentum=momentum))

    return optax.inject_hyperparams(make)(learning_rate=lr)


def with_lr(state: train_state.TrainState, lr: float, sharding: Any) -> train_state.TrainState:
    """The state with the optax state's learning rate replaced by `lr` (float32, laid out in
    `sharding`, the state's replicated one)."""
    import jax
    import numpy as np

    opt = state.opt_state
    value = jax.device_put(np.float32(lr), sharding)
    return state.replace(opt_state=opt._replace(
        hyperparams={**opt.hyperparams, "learning_rate": value}))


def first_non_finite(stats: Any) -> tuple[bool, str]:
    """(whether every leaf of a batch_stats tree is finite, which is not / how many were
    read): Flax's BatchNorm keeps "mean" and "var" per layer."""
    import jax
    import numpy as np
    from flax.core import unfreeze
    from flax.traverse_util import flatten_dict

    flat = flatten_dict(unfreeze(jax.device_get(stats))) if stats else {}
    for path, leaf in flat.items():
        bad = int(np.size(leaf) - np.isfinite(leaf).sum())
        if bad:
            return False, f"batch_stats/{'/'.join(path)}: {bad} of {np.size(leaf)} not finite"
    return True, f"{len(flat)} batch_stats arrays finite"


def make_predict(model: nn.Module, call: dict[str, Any], cast: Any, replicated: Any,
                 batch: Any) -> Callable[..., Any]:
    """The jitted inference forward (params, batch_stats, x) -> argmax class per row, x in the
    batch sharding (each device its rows), the variables replicated; `cast` as in the step."""
    import jax
    import jax.numpy as jnp

    def cast_floats(tree: Any) -> Any:
        return jax.tree_util.tree_map(
            lambda a: a.astype(cast) if jnp.issubdtype(a.dtype, jnp.floating) else a, tree)

    def predict(params: Any, stats: Any, x: jax.Array) -> jax.Array:
        if cast is not None:
            params, x = cast_floats(params), cast_floats(x)
        variables = {"params": params, **({"batch_stats": stats} if stats else {})}
        return jnp.argmax(model.apply(variables, x, **call), axis=-1)

    return jax.jit(predict, in_shardings=(replicated, replicated, batch), out_shardings=batch)


def converge(spec: Spec) -> dict[str, Any]:
    """Mode converge (module docstring): train_to_accuracy with the benchmark's model, mesh and
    jitted step, the learning rate set per step in the optax state."""
    from runners.converge import Recipe, fitting_splits, train_to_accuracy

    if spec.num_nodes > 1:
        raise Unavailable(MULTI_NODE_CONVERGE)
    recipe = Recipe.of(spec)
    if recipe.optimizer != "sgd":
        raise Unavailable(f"optimizer {recipe.optimizer!r}: jax_native converges with sgd only")
    model_spec = spec_of(spec)
    splits = fitting_splits(spec, model_spec)
    devices, described = setup_devices(spec)
    import jax
    import jax.numpy as jnp
    import numpy as np

    from models.flax_common import count_flops_flax, count_params_flax, train_kwargs

    n, global_batch = len(devices), spec.global_batch_size
    spec.split_batch(n)
    rest = len(splits.y_train) % global_batch
    if recipe.last_batch == "keep" and rest % n:
        raise Unavailable(f"last_batch keep: the short last batch of {rest} rows does not "
                          f"divide over {n} devices (a NamedSharding lays out even shares "
                          "only); use drop or pad")
    dtype = {"fp32": None, "tf32": None, "bf16": jnp.bfloat16}[spec.precision]
    model, counted = build_model(spec, model_spec, dtype)
    cast = dtype if counted is not None else None
    replicated, batch = make_shardings(devices)
    infer = train_kwargs(model, False)
    variables = init_variables(model, model_spec.input_shape, call=infer, seed=recipe.seed)
    params = count_params_flax(variables)
    tx = converge_optimizer(recipe.momentum, recipe.weight_decay, recipe.base_lr)
    state = create_state(model, variables, tx, replicated)
    del variables
    batchnorm = DATA_PARALLEL.batchnorm(spec)
    jitted = make_train_step(replicated, batch, batchnorm, train_kwargs(model, True), cast)
    compiled: dict[tuple[int, ...], Any] = {}  # the step compiled per batch shape
    collectives: dict[str, int] = {}
    hlo: list[str] = []
    rows: dict[str, int] = {}  # the first epoch's rows per device, read from the arrays
    rows_fed: list[int] = []  # the first epoch's global batches' rows, as the recipe made them
    lrs: list[float] = []  # the optax state's learning rate after each epoch's last step

    def train_epoch(epoch: int, batches: list[Any], lr_at: Callable[[int], float]) -> float:
        nonlocal state
        losses = []
        for step, b in enumerate(batches):
            x, y = jax.device_put((b.x, b.y), batch)
            if epoch == 0:
                rows_fed.append(b.global_rows)
                for device, count in placement(x).items():
                    rows[device] = rows.get(device, 0) + count
            state = with_lr(state, lr_at(step), replicated)
            if x.shape not in compiled:
                compiled[x.shape], counts = compile_step(jitted, state, x, y)
                if not hlo:
                    collectives.update(counts)
                    hlo.append(compiled[x.shape].as_text())
            state, loss = compiled[x.shape](state, x, y)
            losses.append(loss)
        mean = float(np.mean([float(v) for v in jax.block_until_ready(losses)]))
        lrs.append(float(state.opt_state.hyperparams["learning_rate"]))
        return mean

    predict = make_predict(model, infer, cast, replicated, batch)
    chunk = min(EVAL_CHUNK, len(splits.y_heldout))
    chunk += -chunk % n  # a multiple of N: every device gets the same rows

    def evaluate(x: np.ndarray, y: np.ndarray) -> float:
        correct = 0
        for i in range(0, len(y), chunk):
            part = x[i:i + chunk]
            padded = np.concatenate([part, np.zeros((chunk - len(part), *part.shape[1:]),
                                                    part.dtype)])
            classes = predict(state.params, state.batch_stats, jax.device_put(padded, batch))
            correct += int((np.asarray(classes)[:len(part)] == y[i:i + chunk]).sum())
        return correct / len(y)

    read: list[str] = []  # what the last moving_stats() read

    def moving_stats() -> tuple[bool, str]:
        finite, detail = first_non_finite(state.batch_stats)
        read[:] = [detail]
        return finite, detail

    result = train_to_accuracy(spec, train_epoch, evaluate, moving_stats, splits=splits)
    epoch_rows = sum(rows_fed)
    if sum(rows.values()) != epoch_rows:
        raise Invalid(f"the first epoch fed {sum(rows.values())} rows to the devices, not its "
                      f"{epoch_rows}")
    fields = model_fields(model_spec, lambda: params,
                          lambda: count_flops_flax(model, model_spec.input_shape),
                          lambda: counted)
    how = ("flax module dtype=bfloat16 (param_dtype float32), float32 logits for the loss"
           if dtype is not None else "flax module dtype float32")
    extra = {
        "replicas": n,
        "framework": framework_versions(*VERSIONS),
        "devices": described,
        "layout": "channels_last",
        "dtype": "float32" if dtype is None else "bfloat16 compute, float32 params",
        "loss_kind": "global mean cross-entropy of each step's batch, averaged over the epoch",
        "optimizer": ("optax.inject_hyperparams(chain(add_decayed_weights(weight_decay), "
                      "sgd(lr, momentum))): torch.optim.SGD's update; lr set in the optax "
                      "state before every step"),
        "shardings": {"params": sharding_record(replicated), "batch": sharding_record(batch),
                      "per_device_batch": global_batch // n},
        "collectives": collectives,
        "batchnorm": batchnorm if state.batch_stats else "none",
        "batchnorm_statistics": (BATCHNORM_RECORD[batchnorm] if state.batch_stats else
                                 "none: the model has no BatchNorm"),
        # per epoch, the rate of its last step, read back from the optax state after it
        "lr_read_back": lrs,
        "moving_stats_read": read[0] if read else None,
        "placement": rows,
        "placement_source": CONVERGE_PLACEMENT_SOURCE,
        "data_placement": "the recipe's host numpy batches (runners/converge.py) device_put "
                          "into the batch sharding every step",
        **fields,
        **model_state_jax(state.params, state.opt_state, state.batch_stats),
        # the gradients have the params' dtypes (they are taken with respect to them)
        **precision_record(spec.precision, compute=compute_dtype(cast or getattr(
            model, "dtype", None)), params=state.params, grads=state.params,
            hlo=hlo[0] if hlo else None, how=how),
    }
    clash = sorted(set(extra) & set(result))
    if clash:
        raise RuntimeError(f"converge fields {clash} are also runner fields")
    return {**result, **extra}


if __name__ == "__main__":
    main(benchmark, equivalence, converge)
