"""JAX-family child code shared by its runners: the run's devices (virtual CPU devices through
XLA_FLAGS, or the first N GPUs), versions, synthetic batches made under jit into a sharding,
placement from addressable_shards, converge preconditions, and multi-node plumbing
(jax.distributed.initialize; untested on a real multi-GPU cluster). Imports no framework at
module level: call setup_devices(spec) before anything imports jax."""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from contract.reasons import code
from runners import memory
from runners.common import Invalid, Spec, Unavailable, node_identity, process_rank
from runners.converge import Recipe

if TYPE_CHECKING:
    import jax
    import numpy as np


DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
CPU_KIND = "virtual CPU device (XLA host platform)"


def _with_device_count(flags: str, n: int) -> str:
    """XLA_FLAGS with the host device count set to n (an earlier count flag is replaced)."""
    kept = re.sub(rf"{DEVICE_COUNT_FLAG}=\S*", "", flags).split()
    return " ".join([*kept, f"{DEVICE_COUNT_FLAG}={n}"])


def setup_devices(spec: Spec, initialize: Callable[[], None] | None = None
                  ) -> tuple[list[jax.Device], list[dict[str, Any]]]:
    """The run's N jax devices and their descriptions: N virtual CPU devices or the first N GPUs;
    call before anything imports jax. Across nodes, joins the other processes first
    (join_processes; `initialize` replaces jax.distributed.initialize) and returns all devices."""
    n = spec.num_devices
    if spec.device == "cpu":
        if "jax" in sys.modules:
            raise RuntimeError("setup_devices must run before jax is imported: XLA reads "
                               f"{DEVICE_COUNT_FLAG} when its CPU backend starts")
        os.environ["XLA_FLAGS"] = _with_device_count(os.environ.get("XLA_FLAGS", ""),
                                                     spec.devices_per_node)
        os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    if spec.num_nodes > 1:
        join_processes(spec, initialize)
    if spec.device == "cpu":
        devices = jax.devices("cpu")
        memory.baseline(code("memory.baseline_jax_devices"))  # XLA's runtime left out
        if len(devices) != n:
            raise Unavailable(f"XLA_FLAGS={os.environ['XLA_FLAGS']!r} gave {len(devices)} CPU "
                              f"devices, not {n}")
        return devices, [_describe(d, CPU_KIND, spec) for d in devices]
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as exc:
        raise Unavailable(f"jax {jax.__version__} has no GPU backend ({exc}); install "
                          "envs/jax-gpu.txt") from None
    if len(gpus) < n:
        raise Unavailable(f"needs {n} GPUs; jax sees {len(gpus)}")
    memory.baseline(code("memory.baseline_jax_devices"))
    return gpus[:n], [_describe(d, d.device_kind, spec) for d in gpus[:n]]


def _describe(device: jax.Device, kind: str, spec: Spec) -> dict[str, Any]:
    """A device as the result lists it (with its process on a multi-node run)."""
    out = {"name": str(device), "id": device.id, "kind": kind}
    if spec.num_nodes > 1:
        out["process_index"] = device.process_index
    return out


MECHANISM = "jax.distributed.initialize, SLURM auto-detection"
SLURM_VARIABLES = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
                   "SLURM_LOCALID")  # what jax's SlurmCluster.is_env_present asks for


def detected_cluster() -> str | None:
    """The cluster environment jax.distributed.initialize() auto-detects here (the first of
    jax's ClusterEnv types that is not opt-in and says it is present), or None."""
    from jax._src import clusters

    return next((env.__name__ for env in clusters.ClusterEnv._cluster_types
                 if not env.opt_in_only_method and env.is_env_present()), None)


def join_processes(spec: Spec, initialize: Callable[[], None] | None = None) -> None:
    """Join the run's other processes, one per node, through jax.distributed.initialize() with
    no arguments (or `initialize`, which must call it so), its SLURM auto-detection reading
    the job's variables; then check what jax says against the spec (docs/runners/jax_native.md)."""
    import jax

    missing = [v for v in SLURM_VARIABLES if v not in os.environ]
    if missing:
        raise Unavailable(f"a {spec.num_nodes}-node run joins its processes through "
                          "jax.distributed.initialize's SLURM auto-detection, and this process "
                          f"was not started by srun: {', '.join(missing)} unset")
    if spec.device == "cpu":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    else:  # SlurmCluster would give each process one GPU, SLURM_LOCALID
        os.environ.setdefault("JAX_LOCAL_DEVICE_IDS",
                              ",".join(str(i) for i in range(spec.devices_per_node)))
    if os.environ.get("MGBENCH_MASTER_PORT") and "JAX_COORDINATOR_PORT" not in os.environ:
        os.environ["JAX_COORDINATOR_PORT"] = os.environ["MGBENCH_MASTER_PORT"]
    detected = detected_cluster()
    if detected != "SlurmCluster":
        raise Unavailable(f"jax {jax.__version__} auto-detects {detected} here, not "
                          "SlurmCluster")
    (initialize or jax.distributed.initialize)()
    said = {"process_count": jax.process_count(), "process_index": jax.process_index(),
            "local_device_count": jax.local_device_count()}
    wanted = {"process_count": spec.num_nodes, "process_index": process_rank(),
              "local_device_count": spec.devices_per_node}
    if said != wanted:
        raise Invalid(f"jax.distributed.initialize joined {said}; the run is {wanted} "
                      "(process_index against MGBENCH_PROCESS_RANK, which picks the process "
                      "that writes the result)")


def allgather_json(obj: Any) -> list[Any]:
    """Every process's `obj` (JSON-able), in process order, gathered through JAX itself:
    multihost_utils.process_allgather of the encoded bytes (their lengths first, then the bytes
    padded to the longest). A collective: every process must call it."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return [json.loads(json.dumps(obj, default=str))]
    data = np.frombuffer(json.dumps(obj, default=str).encode(), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int32)))
    sizes = sizes.reshape(-1)
    padded = np.zeros(int(sizes.max()), np.uint8)
    padded[:data.size] = data
    rows = np.asarray(multihost_utils.process_allgather(padded))
    return [json.loads(bytes(row[:size]).decode()) for row, size in zip(rows, sizes,
                                                                          strict=True)]


def all_placement(local: dict[str, int]) -> dict[str, int]:
    """A placement over every process's devices: each process's own (placement() of its
    addressable shards) gathered with allgather_json; `local` itself on one process."""
    import jax

    if jax.process_count() == 1:
        return local
    merged: dict[str, int] = {}
    for part in allgather_json(local):
        for key, rows in part.items():
            if key in merged:
                raise Invalid(f"two processes report placement key {key!r}")
            merged[key] = rows
    return merged


def close_multihost(spec: Spec, mechanism: str = MECHANISM) -> dict[str, Any]:
    """The record of a multi-node run (`nodes`, each process as JAX sees it; `multi_node`, what JAX
    read back), then jax.distributed.shutdown(); {} on one node. Call it last, on every process."""
    if spec.num_nodes == 1:
        return {}
    import jax
    from jax._src import distributed

    local = jax.local_devices()
    nodes = allgather_json({**node_identity(), "process_index": jax.process_index(),
                            "local_devices": [str(d) for d in local],
                            "local_device_ids": [d.id for d in local],
                            "platform": local[0].platform if local else None})
    collectives = (jax.config.jax_cpu_collectives_implementation if spec.device == "cpu"
                   else "XLA GPU collectives (NCCL)")
    record = {"nodes": nodes, "multi_node": {
        "mechanism": mechanism,
        "cluster_detected": detected_cluster(),
        "process_count": jax.process_count(),
        "device_count": jax.device_count(),
        "local_device_count": jax.local_device_count(),
        "coordinator_address": distributed.global_state.coordinator_address,
        "coordinator_port_from": "JAX_COORDINATOR_PORT="
                                 f"{os.environ.get('JAX_COORDINATOR_PORT')} (MGBENCH_MASTER_PORT="
                                 f"{os.environ.get('MGBENCH_MASTER_PORT')})",
        "cpu_collectives": collectives,
        "source": code("jax.multihost_source")}}
    jax.distributed.shutdown()
    return record


def framework_versions(*extra: str) -> dict[str, str]:
    """Versions of jax, jaxlib, numpy and the named extra packages (flax, optax, keras)."""
    import importlib

    names = ("jax", "jaxlib", *extra, "numpy")
    return {name: importlib.import_module(name).__version__ for name in names}


def synthetic_batch(shape_hwc: tuple[int, int, int], classes: int, batch: int,
                    sharding: jax.sharding.Sharding,
                    label_sharding: jax.sharding.Sharding | None = None
                    ) -> tuple[jax.Array, jax.Array]:
    """One random global batch (NHWC float32 images, int32 labels), generated by a jitted
    function straight into `sharding` (the labels into `label_sharding`, default the same):
    each device makes its own rows, nothing crosses the host, and the values are the same
    whatever the device count."""
    import jax
    import jax.numpy as jnp

    def make() -> tuple[jax.Array, jax.Array]:
        kx, ky = jax.random.split(jax.random.key(0))
        x = jax.random.normal(kx, (batch, *shape_hwc), jnp.float32)
        y = jax.random.randint(ky, (batch,), 0, classes, jnp.int32)
        return x, y

    x, y = jax.jit(make, out_shardings=(sharding, label_sharding or sharding))()
    return jax.block_until_ready((x, y))


def token_batch(seq_len: int, vocab: int, batch: int, sharding: jax.sharding.Sharding
                ) -> tuple[jax.Array, jax.Array]:
    """One random global batch of token ids (batch, seq_len + 1) in [0, vocab), generated by a
    jitted function straight into `sharding` (each device makes its own rows), split into the
    inputs ids[:, :-1] and the next-token targets ids[:, 1:], both (batch, seq_len) int32."""
    import jax
    import jax.numpy as jnp

    def make() -> tuple[jax.Array, jax.Array]:
        ids = jax.random.randint(jax.random.key(0), (batch, seq_len + 1), 0, vocab, jnp.int32)
        return ids[:, :-1], ids[:, 1:]

    return jax.block_until_ready(jax.jit(make, out_shardings=(sharding, sharding))())


def device_batch(model_spec: Any, global_batch: int, shardings: tuple[Any, Any]
                 ) -> tuple[Any, Any]:
    """One synthetic global batch made on the devices in `shardings` (the inputs', the
    labels'): token ids and their next tokens (token_batch), or images and labels."""
    if model_spec.input_kind == "tokens":
        return token_batch(model_spec.input_shape[0], model_spec.num_classes, global_batch,
                           shardings[1])
    return synthetic_batch(model_spec.input_shape, model_spec.num_classes, global_batch,
                           *shardings)


def placement(array: jax.Array) -> dict[str, int]:
    """Where a batch array lives, read from jax: {device as jax names it: rows of the array's
    shards on it}, from array.addressable_shards (each shard's device and index into axis 0).
    An array spanning several processes (a multi-node run) names each device with its process,
    "cpu:2048 (process 1)", and only this process's shards are here (all_placement gathers)."""
    rows: dict[str, int] = {}
    for shard in array.addressable_shards:
        start, stop, _ = shard.index[0].indices(array.shape[0])
        key = str(shard.device)
        if not array.is_fully_addressable:
            key = f"{key} (process {shard.device.process_index})"
        rows[key] = rows.get(key, 0) + stop - start
    return rows


def sharding_record(sharding: jax.sharding.Sharding) -> str:
    """A sharding as one readable line, e.g. "NamedSharding(mesh={data: 2}, spec=P('data',))"."""
    mesh = getattr(sharding, "mesh", None)
    spec = getattr(sharding, "spec", None)
    if mesh is None or spec is None:
        return str(sharding)
    axes = ", ".join(f"{name}: {size}" for name, size in mesh.shape.items())
    return f"NamedSharding(mesh={{{axes}}}, spec={spec})"


def ready_rows(batch: tuple[jax.Array, jax.Array]) -> int:
    """The rows of a pipeline's (images, labels) batch once its copy to the devices has
    finished: what a pipeline-mode run counts."""
    import jax

    jax.block_until_ready(batch)
    return int(batch[0].shape[0])


EVAL_CHUNK = 1024  # held-out rows per evaluation call at most (eval_chunk)


def sgd_recipe(spec: Spec, runner: str, missing: str | None) -> Recipe:
    """A converge run's recipe; Unavailable across nodes for a runner that cannot feed each
    process its share (`missing`: what of a per-process share it lacks; None: it can) or with
    an optimizer other than sgd."""
    if spec.num_nodes > 1 and missing is not None:
        raise Unavailable("mode converge across nodes: the recipe's batches are made whole on "
                          "one process (runners/converge.py); a per-process share " + missing)
    recipe = Recipe.of(spec)
    if recipe.optimizer != "sgd":
        raise Unavailable(f"optimizer {recipe.optimizer!r}: {runner} converges with sgd only")
    return recipe


def process_local(sharding: jax.sharding.Sharding, local: tuple[np.ndarray, ...],
                  global_rows: int | None = None) -> tuple[jax.Array, ...]:
    """Global arrays in `sharding` from this process's `local` arrays: jax.device_put on one
    process; across processes jax.make_array_from_process_local_data, each process giving its
    share of `global_rows` (axis 0), or (global_rows None) all of each array, every process
    the same values, each device taking its part."""
    import jax

    if jax.process_count() == 1:
        return jax.device_put(local, sharding)
    return tuple(jax.make_array_from_process_local_data(
        sharding, a, a.shape if global_rows is None else (global_rows, *a.shape[1:]))
        for a in local)


def check_process_rows(array: jax.Array, share: int, world: int) -> None:
    """Invalid unless this process's devices hold rows [r x s, (r + 1) x s) of the global
    array (r its jax.process_index(), s its `share` of rows, equal over the `world`
    processes, as runners.converge.epoch_batches cuts them): read from addressable_shards."""
    import jax

    rank, rows = jax.process_index(), array.shape[0]
    spans = sorted(s.index[0].indices(rows)[:2] for s in array.addressable_shards)
    covered = [i for start, stop in spans for i in range(start, stop)]
    if covered != list(range(rank * share, (rank + 1) * share)) or share * world != rows:
        raise Invalid(f"process {rank} of {world} gave its {share} rows of a {rows}-row batch; "
                      f"its devices hold rows {spans}")


def check_short_batch(recipe: Recipe, train_rows: int, n: int, layout: str) -> None:
    """Unavailable when a kept short last batch does not divide over the n devices (`layout`
    lays out even shares only)."""
    rest = train_rows % recipe.global_batch
    if recipe.last_batch == "keep" and rest % n:
        raise Unavailable(f"last_batch keep: the short last batch of {rest} rows does not "
                          f"divide over {n} devices ({layout} lays out even shares only); "
                          "use drop or pad")


def eval_chunk(heldout_rows: int, n: int) -> int:
    """Held-out rows per evaluation call: at most EVAL_CHUNK, padded up to a multiple of the n
    devices (every device the same rows)."""
    chunk = min(EVAL_CHUNK, heldout_rows)
    return chunk + -chunk % n
