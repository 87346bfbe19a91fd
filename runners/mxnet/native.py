"""Native MXNet: a hybridised Gluon network, one context per device, gradients reduced through
a kvstore (the native baseline seed 000 measured Keras-MXNet against).

Split: the global batch B is split into N equal slices, one per context (mx.cpu(i) here,
mx.gpu(i) on GPUs); the synthetic slices are copied to their contexts once, before the timed
window, so a step copies nothing from the host. Real data (data: real): every step takes the
next global batch from MXNet's ImageRecordIter over train.rec (runners/mxnet/data.py; decode
and augmentation in its own threads, running ahead of training) and copies its N slices to
the contexts (split_and_load) inside the timed step. Parameters: one copy per context,
initialised identically. Forward and backward run per context under autograd.record(); each
context's per-example losses are summed, not averaged, so its gradients are the sum over its
slice.
Reduce: gluon.Trainer pushes every context's gradient to the kvstore (`device`: summed on the
devices, peer to peer between GPUs; `local`: summed on the CPU; `nccl`: NCCL all-reduce) and
pulls the sum back; trainer.step(B) scales it by 1/B, so every context applies the gradient
of the global mean loss: synchronous SGD, identical to one device with batch B.
Synchronise: mx.nd.waitall() after every step, so each clock reading follows a finished step
(MXNet's engine is asynchronous; without it the clock would time the dispatch).
Placement: the context and rows of each slice's loss array of the last timed step (and the
contexts of every parameter's copies), read from the NDArrays.
Equivalence: the same hybridize(static_alloc, static_shape), Trainer and kvstore and resident
slices, on the probe model, one plain SGD step.
Threads: on CPU the parent sets OMP_NUM_THREADS to the physical cores shared by the N contexts
(MXNet's perf guide; MXNet's own default halves the logical CPUs, see runners/threads.py).

Follows MXNet 1.9.1's Gluon data parallelism (split_and_load, Trainer over a kvstore, hybridize
with static memory). Differs from seed 000's native reference (MXNet 0.10.1, Symbol/Module
API, train_imagenet.py): Gluon's CachedOp instead of a bound Module; the kvstore reduction and
the per-context executors are the same engine's.

Multi-node (spec.num_nodes = N > 1, issue 16; MXNet 1.9.1): MXNet's own distributed training,
a `dist_sync` kvstore over ps-lite. The harness starts one process per node through srun
(bench/run/slurm_job.py); each brings up its node's ps-lite roles beside itself
(runners/mxnet/dist_launch.py: the scheduler on node rank 0, one server per node, as MXNet's
tools/launch.py and dmlc-core's tracker do) and is that node's worker, driving
spec.devices_per_node contexts. The kvstore is dist_sync (CPU contexts, or kvstore local) or
dist_sync_device (kvstore device on GPUs); kvstore nccl is unavailable across nodes. Worker r
(kv.rank) takes rows r x B/N .. (r+1) x B/N of the synthetic global batch (real data: share r
of N of the records, B/N per batch), split over its contexts. The Trainer broadcasts worker
0's initial weights (kvstore init + pull). Each step every worker pushes its contexts' summed
gradients; the servers add the N workers' pushes of a key before answering any pull
(dist_sync), so every worker pulls the gradient summed over the global batch, and
trainer.step(B) scales it by 1/B: every worker applies the gradient of the global mean loss,
as on one node. update_on_kvstore=False: the servers only sum and each worker runs SGD itself
(MXNet's Gluon default for dist kvstores is True, the servers running the optimizer; with it
trainer.step(B) scales the same, rescale_grad = 1/B being pickled to the servers at the first
step). False keeps the optimizer's step counter on the worker, which counts the samples as
on one node, and the kvstore a plain sum, through which each worker's identity, placement
(keys "worker<kv.rank>:<context>"), devices and loss shares are gathered after the timed
steps (`nodes`, `multi_node`, the global first and last loss). Process rank 0 writes the
result. The roles end MXNet's way when the kvstore is freed; see dist_launch.
What differs here: tools/local_slurm.sh's two nodes are this one machine (127.0.0.1), so the
servers and workers of both nodes differ only by port (MGBENCH_MASTER_PORT + 1..4), and the
pushes and pulls never leave it; the GPU path (dist_sync_device) is written but untested.

Mode converge (runners/converge.py, issue 28; one node): MXNet's own loop as its Gluon examples
write it (example/gluon/image_classification.py): each of the recipe's global batches split
over the contexts by split_and_load (even_split=False: a short kept last batch splits as
numpy.array_split does), per-example losses under autograd.record() on every context,
backward, trainer.set_learning_rate(lr_at(step)), then trainer.step(rows of the global batch):
the kvstore sums the contexts' gradients and 1/rows makes them the gradient of the global mean
loss. The benchmark's model, initialiser, hybridize, kvstore and dtype; SGD with the recipe's
momentum and weight decay (MXNet's wd, added to every parameter's gradient, BatchNorm's gamma
and beta included, as torch's weight_decay; MXNet's momentum buffer holds lr x gradient, as
Keras', where torch's holds the gradient: the two differ only while the rate changes). Initial
weights: mx.random.seed(recipe.seed), drawn once on the CPU and copied to every context, so 1
and N contexts start alike (the record's initial_weights). BatchNorm: each context normalises
its slice by the slice's statistics and updates its own copy of running_mean and running_var
(Gluon parameters without a gradient, which the kvstore does not reduce): no synchronised
BatchNorm, as in MXNet. Evaluation in inference mode (no autograd.record): the held-out split
over the contexts, as the examples' test() does, each context predicting its share with its
own moving statistics; moving_stats reads every context's copy. Placement: the rows per
context of the last epoch's steps (its training rows). What differs from the examples: the
batches come from runners/converge.py (the shared recipe's order, preprocessing and
augmentation) instead of an mx.io iterator or DataLoader, and the rate is set per step from
the recipe instead of by an lr_scheduler on the optimizer (the same rates).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from models import get_spec, load_builder
from models.gluon_common import (
    count_flops_gluon,
    count_params_gluon,
    get_canonical_weights,
    set_canonical_weights,
)
from runners.common import Invalid, Spec, Unavailable, finite, main
from runners.converge import Batch, Recipe, Splits, load_splits, train_to_accuracy
from runners.mxnet import dist_launch
from runners.mxnet.common import (
    DTYPES,
    contexts,
    framework_versions,
    input_shape_nchw,
    mean_loss,
    synthetic_arrays,
    timed_context_steps,
)
from runners.mxnet.data import describe_pipeline, nd_batches, record_iter, stream
from runners.real_data import check_classes, describe, open_dataset


def make_trainer(spec: Spec, net: gluon.Block, ctxs: list[mx.Context], optimizer: str,
                 params: dict[str, Any], dist_kv: Any = None) -> gluon.Trainer:
    """A gluon.Trainer over the net's parameters with the kvstore the config chose; on several
    nodes over the worker's distributed kvstore `dist_kv`, the servers only summing (see the
    module docstring)."""
    if dist_kv is not None:
        return gluon.Trainer(net.collect_params(), optimizer, params, kvstore=dist_kv,
                             update_on_kvstore=False)
    kvstore = spec.options["kvstore"]
    if kvstore == "nccl" and spec.device != "gpu":
        raise Unavailable("kvstore nccl needs GPUs; use device or local on CPU contexts")
    if kvstore == "nccl" and not mx.runtime.Features().is_enabled("NCCL"):
        raise Unavailable("kvstore nccl: this MXNet build has no NCCL")
    return gluon.Trainer(net.collect_params(), optimizer, params, kvstore=kvstore)


def broadcast_before_first_push(trainer: gluon.Trainer, kv: Any) -> None:
    """On several nodes: worker 0's initial weights in every worker's arrays before any worker
    pushes a gradient. The Trainer's first step broadcasts them (kvstore init, then a pull into
    the weight arrays) and pushes the gradients under the same keys, and nothing orders the
    two (they touch different arrays): a worker whose pull reaches the servers after both
    workers' gradients merged starts from the merged sum instead of the weights (the 2-node
    equivalence test failed 1 run in 4 that way). Broadcast now, wait for it, then meet the
    other workers at a barrier. Needs every parameter's shape (after a forward pass). The
    equivalence step's (exact weights); the benchmark's first step is a warm-up step, and
    there the same early broadcast of MiniGoogLeNet's parameters made a server abort ("init
    K first", kvstore_dist_server.h), not understood yet, so the benchmark keeps the
    Trainer's own order."""
    if kv is None:
        return
    trainer._init_kvstore()  # what Trainer.step does first, done before the step
    trainer._init_params()
    mx.nd.waitall()
    kv._barrier()


def dist_kvstore_type(spec: Spec) -> str:
    """The distributed kvstore of a multi-node run for the config's kvstore option: device on
    GPUs is dist_sync_device (each worker sums its GPUs' gradients on a GPU before the push),
    anything else on CPU contexts dist_sync (summed on the CPU, as both local kvstores do on
    CPU contexts); MXNet 1.9 has no NCCL kvstore across machines."""
    kvstore = spec.options["kvstore"]
    if kvstore == "nccl":
        raise Unavailable("kvstore nccl: MXNet 1.9's NCCL kvstore is single-machine; across "
                          "nodes use device (dist_sync_device) or local (dist_sync)")
    return "dist_sync_device" if kvstore == "device" and spec.device == "gpu" else "dist_sync"


def split_to_contexts(array: Any, ctxs: list[mx.Context], dtype: str = "float32") -> list[Any]:
    """Equal slices of a host array along the batch axis, each copied to its context."""
    return gluon.utils.split_and_load(mx.nd.array(array, dtype=dtype), ctxs, even_split=True)


def real_feed(batches: Iterator[tuple[Any, Any]], ctxs: list[mx.Context], dtype: str,
              labels: list[int]) -> Iterator[tuple[list[Any], list[Any]]]:
    """Each global batch of the iterator split over the contexts (cast there for fp16); the
    first batch's labels are appended to `labels`, as the record's evidence of what trained."""
    for x, y in batches:
        if not labels:
            labels.extend(int(v) for v in y.asnumpy())
        xs = gluon.utils.split_and_load(x, ctxs, even_split=True)
        if dtype != "float32":
            xs = [s.astype(dtype) for s in xs]
        yield xs, gluon.utils.split_and_load(y, ctxs, even_split=True)


def synthetic_feed(xs: list[Any], ys: list[Any]) -> Iterator[tuple[list[Any], list[Any]]]:
    """The same resident slices every step."""
    while True:
        yield xs, ys


def hybridize_as_configured(net: gluon.HybridBlock, spec: Spec) -> bool:
    """hybridize (default): compile the net to a static graph with static memory and shapes,
    as the MXNet docs advise for speed; false keeps the imperative Gluon net."""
    hybridize = bool(spec.options["hybridize"])
    if hybridize:
        net.hybridize(static_alloc=True, static_shape=True)
    return hybridize


def read_placement(losses: list[Any], net: gluon.Block) -> dict[str, Any]:
    """Where a step ran, read from MXNet's arrays: the context of each slice's loss (computed
    by the forward on that slice) with its rows, and the parameter copies per context."""
    rows: dict[str, int] = {}
    for loss in losses:
        rows[str(loss.context)] = rows.get(str(loss.context), 0) + int(loss.shape[0])
    copies: dict[str, int] = {}
    for param in net.collect_params().values():
        for data in param.list_data():
            copies[str(data.context)] = copies.get(str(data.context), 0) + 1
    return {"placement": rows, "parameter_copies": copies,
            "placement_source": "NDArray.context and rows of each slice's loss array of the "
                                "step; parameter_copies: contexts of each Parameter's data()"}


def train_step(net: gluon.Block, trainer: gluon.Trainer, loss_fn: gluon.loss.Loss,
               xs: list[Any], ys: list[Any], global_batch: int) -> list[Any]:
    """One synchronous step over every context; returns the per-context loss arrays."""
    with autograd.record():
        losses = [loss_fn(net(x), y) for x, y in zip(xs, ys, strict=True)]
    autograd.backward(losses)
    trainer.step(global_batch)  # kvstore sum over contexts, then gradient x 1/global_batch
    return losses


def benchmark(spec: Spec) -> dict[str, Any]:
    return across_nodes(spec, train)


def across_nodes(spec: Spec, run: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """run(spec) on one node; on several, run(spec, ps) within this node's ps-lite roles
    (runners/mxnet/dist_launch.py), then how the roles ended added to `multi_node`."""
    if spec.num_nodes == 1:
        return run(spec)
    with dist_launch.session(spec.num_nodes) as ps:
        result = run(spec, ps)
    ps.finish_record(result["multi_node"])  # how the roles ended, known only now
    return result


def train(spec: Spec, ps: dist_launch.PsLite | None = None) -> dict[str, Any]:
    """The benchmark; `ps`: this node's ps-lite roles on a multi-node run (this process is one
    of its workers, driving spec.devices_per_node contexts)."""
    opts = spec.options
    ctxs, devices = contexts(spec)
    nodes, global_batch = spec.num_nodes, spec.global_batch_size
    n = len(ctxs)
    if n * nodes != spec.num_devices:
        raise Invalid(f"{spec.num_devices} devices do not divide over {nodes} nodes")
    spec.split_batch(n * nodes, "contexts" if nodes == 1 else f"contexts of {nodes} workers")
    local_batch = global_batch // nodes  # this worker's rows of each global batch
    dtype = DTYPES[spec.precision]
    if dtype == "float16" and spec.device == "cpu":
        raise Unavailable("fp16 on CPU contexts: MXNet 1.9 has no float16 convolution "
                          "kernels for the CPU; run fp16 on GPUs")
    model_spec = get_spec(spec.model)
    real = spec.data == "real"
    if real:  # open the dataset first: a bad folder is unavailable before the net is built
        data = open_dataset(spec)
        check_classes(data, model_spec.num_classes, spec.model)
        size = model_spec.input_shape[0]
    # the workers meet in the kvstore: from here on every worker must reach each collective
    kv = ps.kvstore(dist_kvstore_type(spec)) if ps is not None else None
    rank = kv.rank if kv is not None else 0
    if real:  # this worker's share of the records (all of them on one node)
        it = record_iter(data, size, local_batch, spec.device, part_index=rank,
                         num_parts=nodes)
    net = load_builder(spec.model, "gluon")(model_spec)
    net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2), ctx=ctxs)
    if dtype == "float16":
        net.cast("float16")  # fp32 master weights are kept by multi_precision below
    hybridize = hybridize_as_configured(net, spec)
    trainer = make_trainer(spec, net, ctxs, "sgd", {
        "learning_rate": 0.01, "momentum": 0.9, "multi_precision": dtype == "float16"},
        dist_kv=kv)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    labels: list[int] = []
    if real:
        feed = real_feed(nd_batches(stream(it)), ctxs, dtype, labels)
    else:  # the same global batch as one node; each worker steps on its rows of it
        x, y = synthetic_arrays(model_spec, global_batch)
        rows = slice(rank * local_batch, (rank + 1) * local_batch)
        feed = synthetic_feed(split_to_contexts(x[rows], ctxs, dtype),
                              split_to_contexts(y[rows], ctxs))

    # on N nodes each step's loss is this worker's share of the global mean
    window, steps, last = timed_context_steps(
        spec, lambda: train_step(net, trainer, loss_fn, *next(feed), global_batch), trainer,
        global_batch)
    if real:
        placement = ("each global batch from the ImageRecordIter split over the contexts "
                     "(split_and_load) inside the timed step")
        if nodes > 1:
            placement = ("each worker's batch from its own share of the records "
                         "(ImageRecordIter part_index kv.rank of num_parts nodes) split over "
                         "its contexts (split_and_load) inside the timed step")
        extra = {**describe(data, size), "first_batch_labels": labels,
                 "input_pipeline": f"{describe_pipeline(data, size, spec.device)}; "
                                   f"{placement}"}
    else:
        placement, extra = "one synthetic slice per context, copied once before timing", {}
        if nodes > 1:
            placement = ("worker r's rows r x B/N .. (r+1) x B/N of the synthetic global "
                         "batch, one slice per context, copied once before timing")
    out = {
        **window.summary(global_batch, steps * global_batch),
        "loss_kind": "global mean cross-entropy of each step's batch",
        "replicas": n * nodes,
        "framework": framework_versions(),
        "devices": devices,
        "layout": "channels_first",
        "dtype": dtype,
        "api": "gluon",
        "hybridize": hybridize,
        "kvstore": trainer._kvstore.type if trainer._kvstore is not None else
        f"none (kvstore {opts['kvstore']!r} skipped: one context)",
        "data_placement": placement,
        **read_placement(last, net),
        "params": count_params_gluon(net),
        "flops_per_sample": count_flops_gluon(net, input_shape_nchw(model_spec)),
        **extra,
    }
    if ps is not None:
        gathered, losses = gather_workers(ps, trainer, out, window.losses, labels)
        out.update(gathered, first_loss=finite(losses[0]), last_loss=finite(losses[-1]))
    return out


def gather_workers(ps: dist_launch.PsLite, trainer: gluon.Trainer, local: dict[str, Any],
                   step_losses: list[float], labels: list[int]
                   ) -> tuple[dict[str, Any], list[float]]:
    """What a multi-node record says of every worker, gathered through the kvstore after the
    steps: each worker's identity, placement and parameter copies (read from its own
    NDArrays), its devices, its share of each step's mean loss and its first labels. The
    placement keys are "worker<kv.rank>:<context>". Also each step's global mean loss: the
    sum of the workers' shares, as on one node."""
    kv = trainer._kvstore
    rows = ps.allgather({"worker": ps.worker_record(), "placement": local["placement"],
                         "parameter_copies": local["parameter_copies"],
                         "devices": local["devices"], "step_losses": step_losses,
                         "labels": labels})
    if [r["worker"]["kv_rank"] for r in rows] != list(range(kv.num_workers)):
        raise Invalid(f"gathered kv ranks {[r['worker']['kv_rank'] for r in rows]} of "
                      f"{kv.num_workers} workers")

    def merged(key: str) -> dict[str, int]:
        return {f"worker{i}:{ctx}": count for i, r in enumerate(rows)
                for ctx, count in r[key].items()}

    losses = [sum(r["step_losses"][i] for r in rows) for i in range(len(step_losses))]
    workers = [{k: v for k, v in r["worker"].items() if k != "roles"} for r in rows]
    roles = [{"node": r["worker"]["node"], "started_by_kv_rank": r["worker"]["kv_rank"], **role}
             for r in rows for role in r["worker"]["roles"]]
    out: dict[str, Any] = {
        "placement": merged("placement"), "parameter_copies": merged("parameter_copies"),
        "placement_source": "each worker's own read (NDArray.context and rows of each slice's "
                            "loss array of the last timed step; parameter_copies: contexts of "
                            "each Parameter's data()), gathered through the dist kvstore "
                            "(push/pull of the encoded JSON); keys worker<kv.rank>:<context>",
        "devices": [{**d, "name": f"worker{i}:{d['name']}", "node": r["worker"]["node"]}
                    for i, r in enumerate(rows) for d in r["devices"]],
        "nodes": [{k: w[k] for k in ("node", "host", "slurm_procid", "slurm_job_id", "pid",
                                     "kv_rank", "process_rank")} for w in workers],
        "multi_node": {
            "mechanism": dist_launch.MECHANISM,
            "kv_type": kv.type, "kv_num_workers": kv.num_workers, "kv_rank": kv.rank,
            "update_on_kvstore": trainer._update_on_kvstore,
            "kv_rank_is_node_rank": all(w["kv_rank"] == w["process_rank"] for w in workers),
            "dmlc": workers[kv.rank]["dmlc"],
            "workers": workers,
            "scheduler": next((r for r in roles if r["role"] == "scheduler"), None),
            "servers": [r for r in roles if r["role"] == "server"],
            "source": "kv.type, kv.num_workers, kv.rank of each worker's kvstore "
                      "(mx.kv.create), gathered through the kvstore with each worker's DMLC "
                      "settings and the roles it started; scheduler: ps-lite's own log of "
                      "the nodes it registered (PS_VERBOSE=1) and its exit status; servers: "
                      "running at the gather, and the exit status of node rank 0's"}}
    if labels:
        out["first_batch_labels"] = [v for r in rows for v in r["labels"]]
    return out, [finite(v) for v in losses]


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step on the probe model through the benchmark's path (its hybridize,
    Trainer and kvstore, the synthetic slices resident on the contexts); weights saved. On
    several nodes each worker steps on its rows of the batch through the dist kvstore."""
    return across_nodes(spec, equivalence_step)


def equivalence_step(spec: Spec, ps: dist_launch.PsLite | None = None) -> dict[str, Any]:
    ctxs, devices = contexts(spec)
    weights, x, y, lr = spec.equivalence_inputs()
    n, nodes = len(ctxs), spec.num_nodes
    spec.split_batch(n * nodes, "contexts" if nodes == 1 else f"contexts of {nodes} workers",
                     rows=len(x))
    kv = ps.kvstore(dist_kvstore_type(spec)) if ps is not None else None
    local = len(x) // nodes
    rows = slice(kv.rank * local, (kv.rank + 1) * local) if kv is not None else slice(None)
    net = load_builder("probe", "gluon")(get_spec("probe"))
    net.initialize(mx.init.Zero(), ctx=ctxs)
    hybridize = hybridize_as_configured(net, spec)
    xs = split_to_contexts(x[rows].transpose(0, 3, 1, 2), ctxs)  # inputs come NHWC
    ys = split_to_contexts(y[rows].astype("float32"), ctxs)
    for s in xs:  # completes deferred shape inference on every context (no gradient)
        net(s)
    set_canonical_weights(net, weights)
    trainer = make_trainer(spec, net, ctxs, "sgd", {"learning_rate": lr}, dist_kv=kv)
    broadcast_before_first_push(trainer, kv)
    feed = synthetic_feed(xs, ys)
    losses = train_step(net, trainer, gluon.loss.SoftmaxCrossEntropyLoss(), *next(feed), len(x))
    loss = mean_loss(losses, len(x))  # on N nodes: this worker's share of the mean
    mx.nd.waitall()
    if ps is None or ps.place.rank == 0:  # every worker holds the same weights
        spec.save_equivalence_output(get_canonical_weights(net))
    out = {"replicas": n * nodes, "framework": framework_versions(), "devices": devices,
           "loss": loss, "hybridize": hybridize, **read_placement(losses, net),
           "kvstore": trainer._kvstore.type if trainer._kvstore is not None else "none"}
    if ps is not None:
        gathered, (out["loss"],) = gather_workers(ps, trainer, out, [loss], [])
        out.update(gathered)
    return out


def converge(spec: Spec) -> dict[str, Any]:
    """Mode converge (runners/converge.py): train the model on the dataset's training split to
    the recipe's held-out accuracy with this runner's own Gluon loop (see the module
    docstring's last paragraph)."""
    if spec.num_nodes > 1:
        raise Unavailable("mode converge runs on one node (one process over N contexts); "
                          "the dist_sync kvstore path trains synthetic batches only")
    recipe = Recipe.of(spec)
    if recipe.optimizer != "sgd":
        raise Unavailable(f"optimizer {recipe.optimizer!r}: mxnet_native trains with SGD")
    ctxs, devices = contexts(spec)
    n = len(ctxs)
    spec.split_batch(n, "contexts")
    dtype = DTYPES[spec.precision]
    if dtype == "float16" and spec.device == "cpu":
        raise Unavailable("fp16 on CPU contexts: MXNet 1.9 has no float16 convolution "
                          "kernels for the CPU; run fp16 on GPUs")
    model_spec = get_spec(spec.model)
    splits = load_splits(spec)
    check_splits(splits, model_spec, recipe, n)

    mx.random.seed(recipe.seed)  # the initial weights: drawn once on the CPU, copied to each
    net = load_builder(spec.model, "gluon")(model_spec)
    net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2), ctx=ctxs)
    if dtype == "float16":
        net.cast("float16")
    initial = weights_digest(net)
    hybridize = hybridize_as_configured(net, spec)
    trainer = make_trainer(spec, net, ctxs, "sgd", {
        "learning_rate": recipe.lr(0, 0, 1), "momentum": recipe.momentum,
        "wd": recipe.weight_decay, "multi_precision": dtype == "float16"})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rows: dict[str, int] = {}  # rows per context of the latest epoch, read from the losses
    last: list[Any] = []
    applied: list[float] = []  # the optimizer's learning rate at each epoch's first step

    def train_epoch(epoch: int, batches: list[Batch], lr_at: Callable[[int], float]) -> float:
        rows.clear()
        step_losses = []
        for step, b in enumerate(batches):
            xs = gluon.utils.split_and_load(mx.nd.array(b.x.transpose(0, 3, 1, 2),
                                                        dtype=dtype), ctxs, even_split=False)
            ys = gluon.utils.split_and_load(mx.nd.array(b.y, dtype="float32"), ctxs,
                                            even_split=False)
            trainer.set_learning_rate(lr_at(step))
            if step == 0:
                applied.append(float(trainer.learning_rate))
            losses = train_step(net, trainer, loss_fn, xs, ys, b.global_rows)
            step_losses.append(mx.nd.add_n(*[part.sum().astype("float32").as_in_context(ctxs[0])
                                             for part in losses]) / b.global_rows)
            for loss in losses:
                rows[str(loss.context)] = rows.get(str(loss.context), 0) + int(loss.shape[0])
            last[:] = losses
        mx.nd.waitall()  # the epoch's steps have run (MXNet's engine is asynchronous)
        return float(np.mean([s.asscalar() for s in step_losses]))

    def evaluate(x: np.ndarray, y: np.ndarray) -> float:
        """Inference mode (no autograd.record: BatchNorm's moving statistics), the held-out
        split over the contexts as MXNet's Gluon examples' test() does, each context
        predicting its share with its own copy of the parameters and moving statistics."""
        xs = gluon.utils.split_and_load(mx.nd.array(x.transpose(0, 3, 1, 2), dtype=dtype), ctxs,
                                        even_split=False)
        predicted = [net(s).argmax(axis=1).asnumpy() for s in xs]
        return float((np.concatenate(predicted).astype(np.int64) == y).mean())

    def moving_stats() -> tuple[bool, str]:
        return read_moving_stats(net)

    result = train_to_accuracy(spec, train_epoch, evaluate, moving_stats, splits=splits)
    copies = read_placement(last, net)
    return {
        **result,
        "loss_kind": "mean sparse cross-entropy over each global batch (contexts' summed "
                     "losses, trainer.step(global rows))",
        "replicas": n,
        "framework": framework_versions(),
        "devices": devices,
        "layout": "channels_first",
        "dtype": dtype,
        "api": "gluon",
        "hybridize": hybridize,
        "kvstore": trainer._kvstore.type if trainer._kvstore is not None else
        f"none (kvstore {spec.options['kvstore']!r} skipped: one context)",
        "data_placement": "each global batch split over the contexts by split_and_load "
                          "(even_split=False: a short kept batch as numpy.array_split)",
        "placement": dict(rows),
        "parameter_copies": copies["parameter_copies"],
        "placement_source": "NDArray.context and rows of each slice's loss array, summed over "
                            "the last epoch's steps (its training rows); parameter_copies: "
                            "contexts of each Parameter's data()",
        "moving_stats_source": "every context's copy of each BatchNorm running_mean and "
                               "running_var Parameter (Parameter.list_data())",
        "evaluation": "inference mode, the held-out split over the contexts (split_and_load), "
                      "each context's own moving statistics, as MXNet's Gluon examples' test()",
        "optimizer": {"name": type(trainer._optimizer).__name__.lower(),
                      "momentum": trainer._optimizer.momentum, "wd": trainer._optimizer.wd,
                      "steps": trainer._optimizer.num_update,
                      "epoch_start_lr": applied,
                      "source": "the Trainer's optimizer: its momentum, wd, num_update (steps "
                                "applied) and learning_rate read after set_learning_rate at "
                                "each epoch's first step"},
        "initial_weights": initial,
        "params": count_params_gluon(net),
        "flops_per_sample": count_flops_gluon(net, input_shape_nchw(model_spec)),
    }


def weights_digest(net: gluon.Block) -> dict[str, Any]:
    """A SHA-256 of every parameter's first copy (names sorted), and whether every context's
    copy equals it: the same seed gives the same initial weights on 1 and N contexts."""
    digest = hashlib.sha256()
    identical = True
    for name, param in sorted(net.collect_params().items()):
        copies = [d.asnumpy() for d in param.list_data()]
        digest.update(name.encode() + copies[0].tobytes())
        identical = identical and all(np.array_equal(copies[0], c) for c in copies[1:])
    return {"sha256": digest.hexdigest(), "contexts_identical": identical,
            "source": "Parameter.list_data() after net.initialize, before the first step"}


def check_splits(splits: Splits, model_spec: Any, recipe: Recipe, n: int) -> None:
    """Unavailable when the dataset does not fit the model, or a kept short last batch has
    fewer rows than contexts: split_and_load would hand a context an empty slice, and MXNet
    1.9 cannot copy one to a context (_copyto's shape inference fails on a 0-row array), so
    seed 002's empty tower cannot arise here."""
    shape = tuple(splits.x_train.shape[1:])
    if shape != tuple(model_spec.input_shape) or splits.classes > model_spec.num_classes:
        raise Unavailable(f"the dataset's images {shape} and {splits.classes} classes do not "
                          f"fit {model_spec.name} ({model_spec.input_shape}, "
                          f"{model_spec.num_classes} classes)")
    rest = len(splits.y_train) % recipe.global_batch
    if recipe.last_batch == "keep" and 0 < rest < n:
        raise Unavailable(f"last_batch keep: the short last batch of {rest} rows cannot be "
                          f"split over {n} contexts (MXNet's split_and_load cannot copy an "
                          "empty slice to a context); use drop or pad")


def read_moving_stats(net: gluon.Block) -> tuple[bool, str]:
    """Whether every context's copy of every BatchNorm moving mean and variance is finite, and
    the first that is not."""
    for name, param in net.collect_params().items():
        if not name.endswith(("running_mean", "running_var")):
            continue
        for data in param.list_data():
            values = data.asnumpy()
            if not np.isfinite(values).all():
                return False, (f"{name} on {data.context}: "
                               f"{int((~np.isfinite(values)).sum())} of {values.size} not finite")
    return True, "every context's BatchNorm running_mean and running_var is finite"


if __name__ == "__main__":
    main(benchmark, equivalence, converge)
