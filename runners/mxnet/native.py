"""Native MXNet (mxnet_native): Gluon data parallelism over N contexts of one process; each
global batch split over the contexts (split_and_load), gradients summed by a gluon.Trainer's
kvstore (option kvstore), one step with 1/B; mx.nd.waitall() ends every step. Across nodes:
a dist_sync kvstore (runners/mxnet/dist_launch.py). Differs from seed 000 (MXNet 0.10.1): the
Gluon API instead of Symbol/Module. docs/runners/mxnet_native.md, "Notes from the code"."""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from contract.reasons import code
from contract.result import join
from models import ModelSpec, get_spec
from models import gluon_common as gc
from runners.common import Invalid, Spec, Unavailable, finite, main
from runners.converge import Batch, Recipe, Splits, load_splits, stepwise, train_to_accuracy
from runners.mxnet import common as mxc
from runners.mxnet import dist_launch
from runners.mxnet.data import describe_pipeline, record_iter, stream
from runners.real_data import RealData, describe, open_for_model


def make_trainer(spec: Spec, net: gluon.Block, optimizer: str, params: dict[str, Any],
                 dist_kv: Any = None) -> gluon.Trainer:
    """A gluon.Trainer with the configured kvstore; on several nodes over the worker's
    dist kvstore `dist_kv`, the servers only summing (update_on_kvstore=False)."""
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
    pushes a gradient, then a barrier (docs/runners/mxnet_native.md)."""
    if kv is None:
        return
    trainer._init_kvstore()  # what Trainer.step does first, done before the step
    trainer._init_params()
    mx.nd.waitall()
    kv._barrier()


def split_to_contexts(array: Any, ctxs: list[mx.Context], dtype: str = "float32",
                      even: bool = True) -> list[Any]:
    """Slices of a host array along the batch axis (equal unless `even` False), each copied to
    its context."""
    return gluon.utils.split_and_load(mx.nd.array(array, dtype=dtype), ctxs, even_split=even)


def real_feed(batches: Iterator[mx.io.DataBatch], ctxs: list[mx.Context], dtype: str,
              labels: list[int]) -> Iterator[tuple[list[Any], list[Any]]]:
    """Each global batch of the ImageRecordIter (its NDArrays, x NCHW float32, y float32 class
    ids) split over the contexts (cast there for fp16); the first batch's labels are appended
    to `labels`, as the record's evidence of what trained."""
    for batch in batches:
        x, y = batch.data[0], batch.label[0]
        if not labels:
            labels.extend(int(v) for v in y.asnumpy())
        xs = gluon.utils.split_and_load(x, ctxs, even_split=True)
        if dtype != "float32":
            xs = [s.astype(dtype) for s in xs]
        yield xs, gluon.utils.split_and_load(y, ctxs, even_split=True)


def add_rows(rows: dict[str, int], losses: list[Any]) -> dict[str, int]:
    """`rows` plus the rows of each loss array, keyed by its context."""
    for loss in losses:
        rows[str(loss.context)] = rows.get(str(loss.context), 0) + int(loss.shape[0])
    return rows


def read_placement(losses: list[Any], net: gluon.Block) -> dict[str, Any]:
    """Where a step ran, read from MXNet's arrays: the context of each slice's loss (computed
    by the forward on that slice) with its rows, and the parameter copies per context."""
    copies = Counter(str(d.context) for p in net.collect_params().values() for d in p.list_data())
    return {"placement": add_rows({}, losses), "parameter_copies": dict(copies),
            "placement_source": code("mxnet.ndarray_context_rows")}


def train_step(net: gluon.Block, trainer: gluon.Trainer, loss_fn: gluon.loss.Loss,
               xs: list[Any], ys: list[Any], global_batch: int) -> list[Any]:
    """One synchronous step over every context; returns the per-context loss arrays."""
    with autograd.record():
        losses = [loss_fn(net(x), y) for x, y in zip(xs, ys, strict=True)]
    autograd.backward(losses)
    trainer.step(global_batch)  # kvstore sum over contexts, then gradient x 1/global_batch
    return losses


@dataclass
class GluonRun:
    """What benchmark and converge build alike: contexts, dtype, model, net and Trainer."""

    spec: Spec
    ctxs: list[mx.Context]
    devices: list[dict[str, Any]]
    dtype: str
    model_spec: ModelSpec
    net: Any = None
    trainer: Any = None
    hybridize: bool = False
    loss_fn: Any = None

    @classmethod
    def open(cls, spec: Spec) -> GluonRun:
        """This node's contexts, the global batch split over the run's, and the dtype."""
        ctxs, devices = mxc.contexts(spec)
        nodes, n = spec.num_nodes, len(ctxs)
        if n * nodes != spec.num_devices:
            raise Invalid(f"{spec.num_devices} devices do not divide over {nodes} nodes")
        spec.split_batch(n * nodes, "contexts" if nodes == 1 else f"contexts of {nodes} workers")
        dtype = {"fp32": "float32", "fp16": "float16"}[spec.precision]
        if dtype == "float16" and spec.device == "cpu":
            raise Unavailable("fp16 on CPU contexts: MXNet 1.9 has no float16 convolution "
                              "kernels for the CPU; run fp16 on GPUs")
        return cls(spec, ctxs, devices, dtype, get_spec(spec.model))

    def build(self) -> gluon.HybridBlock:
        """The model, Xavier initialised on every context (cast for fp16)."""
        self.net = mxc.gluon_model(self.spec.model, self.ctxs, hybridize=False)
        if self.dtype == "float16":
            self.net.cast("float16")  # fp32 master weights are kept by multi_precision below
        return self.net

    def compile(self, sgd: dict[str, Any], dist_kv: Any = None) -> None:
        """Option hybridize (a static graph, static memory and shapes, or the imperative net),
        then the SGD Trainer over the kvstore and the loss."""
        self.hybridize = bool(self.spec.options["hybridize"])
        if self.hybridize:
            self.net.hybridize(static_alloc=True, static_shape=True)
        self.trainer = make_trainer(self.spec, self.net, "sgd", {
            **sgd, "multi_precision": self.dtype == "float16"}, dist_kv=dist_kv)
        self.loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def fields(self, replicas: int) -> dict[str, Any]:
        """The record's fields of the model and its Trainer, read after the steps."""
        kv = self.trainer._kvstore
        return {"replicas": replicas, "framework": mxc.framework_versions(),
                "devices": self.devices, "layout": "channels_first", "dtype": self.dtype,
                "api": "gluon", "hybridize": self.hybridize,
                "kvstore": kv.type if kv is not None else
                f"none (kvstore {self.spec.options['kvstore']!r} skipped: one context)",
                "params": gc.count_params_gluon(self.net),
                "flops_per_sample": gc.count_flops_gluon(self.net,
                                                         mxc.input_shape_nchw(self.model_spec))}


def benchmark(spec: Spec) -> dict[str, Any]:
    return dist_launch.across_nodes(spec, train)


class BenchmarkInput:
    """The benchmark's batches on one worker: its rows of the synthetic global batch, resident on
    the contexts, or its share of the records through the ImageRecordIter; and their record."""

    def __init__(self, run: GluonRun, data: RealData | None, rank: int) -> None:
        spec = run.spec
        self.run, self.data, self.rank, self.nodes = run, data, rank, spec.num_nodes
        self.local = spec.global_batch_size // self.nodes  # this worker's rows of each batch
        self.size = run.model_spec.input_shape[0]
        self.labels: list[int] = []
        self.it = None if data is None else record_iter(
            data, self.size, self.local, spec.device, part_index=rank, num_parts=self.nodes)

    def feed(self) -> Iterator[tuple[list[Any], list[Any]]]:
        run = self.run
        if self.it is not None:
            return real_feed(stream(self.it), run.ctxs, run.dtype, self.labels)
        x, y = mxc.synthetic_arrays(run.model_spec, run.spec.global_batch_size)
        rows = slice(self.rank * self.local, (self.rank + 1) * self.local)
        return itertools.repeat((split_to_contexts(x[rows], run.ctxs, run.dtype),
                                 split_to_contexts(y[rows], run.ctxs)))

    def record(self) -> dict[str, Any]:
        if self.data is None:
            return {"data_placement": "one synthetic slice per context, copied once before "
                                      "timing" if self.nodes == 1 else
                    code("mxnet.synthetic_worker_rows")}
        placement = (code("mxnet.real_split_and_load") if self.nodes == 1 else
                     code("mxnet.real_worker_share"))
        pipeline = describe_pipeline(self.data, self.size, self.run.spec.device)
        return {"data_placement": placement, **describe(self.data, self.size),
                "first_batch_labels": self.labels, "input_pipeline": f"{pipeline}; {placement}"}


def train(spec: Spec, ps: dist_launch.PsLite | None = None) -> dict[str, Any]:
    """The benchmark; `ps`: this node's ps-lite roles on a multi-node run."""
    run = GluonRun.open(spec)
    global_batch = spec.global_batch_size
    # a real-data run opens its dataset first: a bad folder is unavailable before the net
    data = open_for_model(spec, run.model_spec) if spec.data == "real" else None
    # the workers meet in the kvstore: from here on every worker must reach each collective
    kv = ps.kvstore(dist_launch.kvstore_type(spec)) if ps is not None else None
    source = BenchmarkInput(run, data, kv.rank if kv is not None else 0)
    run.build()
    run.compile({"learning_rate": 0.01, "momentum": 0.9}, dist_kv=kv)
    feed = source.feed()
    # on N nodes each step's loss is this worker's share of the global mean
    window, steps, last = mxc.timed_context_steps(
        spec, lambda: train_step(run.net, run.trainer, run.loss_fn, *next(feed), global_batch),
        run.trainer, global_batch)
    out = join(window.summary(global_batch, steps * global_batch),
               {"loss_kind": "global mean cross-entropy of each step's batch"},
               run.fields(len(run.ctxs) * spec.num_nodes), read_placement(last, run.net),
               source.record())
    if ps is not None:
        gathered, losses = dist_launch.gather_workers(ps, run.trainer, out, window.losses,
                                                      source.labels)
        out.update(gathered, first_loss=finite(losses[0]), last_loss=finite(losses[-1]))
    return out


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step on the probe model through the benchmark's path (hybridize, Trainer,
    kvstore, resident slices); weights saved. Several nodes: each worker steps on its rows."""
    return dist_launch.across_nodes(spec, equivalence_step)


def equivalence_step(spec: Spec, ps: dist_launch.PsLite | None = None) -> dict[str, Any]:
    ctxs, devices = mxc.contexts(spec)
    weights, x, y, lr = spec.equivalence_inputs()
    n, nodes = len(ctxs), spec.num_nodes
    spec.split_batch(n * nodes, "contexts" if nodes == 1 else f"contexts of {nodes} workers",
                     rows=len(x))
    kv = ps.kvstore(dist_launch.kvstore_type(spec)) if ps is not None else None
    local = len(x) // nodes
    rows = slice(kv.rank * local, (kv.rank + 1) * local) if kv is not None else slice(None)
    hybridize = bool(spec.options["hybridize"])
    xs = split_to_contexts(x[rows].transpose(0, 3, 1, 2), ctxs)  # inputs come NHWC
    ys = split_to_contexts(y[rows].astype("float32"), ctxs)
    net = mxc.gluon_model("probe", ctxs, weights, xs, hybridize)  # forward on xs: no gradient
    trainer = make_trainer(spec, net, "sgd", {"learning_rate": lr}, dist_kv=kv)
    broadcast_before_first_push(trainer, kv)
    losses = train_step(net, trainer, gluon.loss.SoftmaxCrossEntropyLoss(), xs, ys, len(x))
    loss = mxc.mean_loss(losses, len(x))  # on N nodes: this worker's share of the mean
    mx.nd.waitall()
    if ps is None or ps.place.rank == 0:  # every worker holds the same weights
        spec.save_equivalence_output(gc.get_canonical_weights(net))
    out = {"replicas": n * nodes, "framework": mxc.framework_versions(), "devices": devices,
           "loss": loss, "hybridize": hybridize, **read_placement(losses, net),
           "kvstore": trainer._kvstore.type if trainer._kvstore is not None else "none"}
    if ps is not None:
        gathered, (out["loss"],) = dist_launch.gather_workers(ps, trainer, out, [loss], [])
        out.update(gathered)
    return out


class ConvergeSteps:
    """mxnet_native's converge adapter over a built GluonRun: the step (split_and_load with
    even_split=False, one Trainer step over the batch's global rows), evaluation, BatchNorm read.
    On several nodes (`ps`) the epoch's losses, the held-out counts and the BatchNorm checks
    are summed or gathered through the kvstore, so every worker stops at the same epoch."""

    def __init__(self, run: GluonRun, ps: dist_launch.PsLite | None = None) -> None:
        self.run, self.ps = run, ps
        self.rows: dict[str, int] = {}
        self.last: list[Any] = []
        self.applied: list[float] = []
        self.first = True
        self.epoch_steps = stepwise(self.step, self.mean_loss)

    def gather(self, obj: Any) -> list[Any]:
        """Every worker's `obj` in kv.rank order (a collective); [obj] on one node."""
        return [obj] if self.ps is None else self.ps.allgather(obj)

    def train_epoch(self, epoch: int, batches: list[Batch], lr_at: Callable[[int], float]
                    ) -> float:
        self.rows.clear()
        self.first = True
        return self.epoch_steps(epoch, batches, lr_at)

    def step(self, b: Batch, lr: float, epoch: int) -> Any:
        run = self.run
        xs = split_to_contexts(b.x.transpose(0, 3, 1, 2), run.ctxs, run.dtype, even=False)
        ys = split_to_contexts(b.y, run.ctxs, even=False)
        run.trainer.set_learning_rate(lr)
        if self.first:
            self.applied.append(float(run.trainer.learning_rate))
            self.first = False
        losses = train_step(run.net, run.trainer, run.loss_fn, xs, ys, b.global_rows)
        loss = mx.nd.add_n(*[part.sum().astype("float32").as_in_context(run.ctxs[0])
                             for part in losses]) / b.global_rows
        add_rows(self.rows, losses)
        self.last = losses
        return loss

    def mean_loss(self, losses: list[Any]) -> float:
        """The epoch's mean of each step's global mean loss (the workers' shares summed)."""
        mx.nd.waitall()  # the epoch's steps have run (MXNet's engine is asynchronous)
        if self.ps is None:
            return float(np.mean([s.asscalar() for s in losses]))
        shares = self.gather([float(s.asscalar()) for s in losses])
        return float(np.mean(np.sum(np.array(shares, dtype=np.float64), axis=0)))

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> float:
        """Inference mode (BatchNorm's moving statistics): the held-out split over the
        contexts, each predicting its share with its own parameters, as Gluon's test(); on
        several nodes over the workers first (kv.rank's numpy.array_split share), the correct
        predictions summed through the kvstore."""
        if self.ps is None:
            return float((self.predict(x) == y).mean())
        kv = self.ps.kv
        part = np.array_split(np.arange(len(y)), kv.num_workers)[kv.rank]
        counts = self.gather([int((self.predict(x[part]) == y[part]).sum()), len(part)])
        return sum(c for c, _ in counts) / sum(n for _, n in counts)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """The predicted class of each image, its share predicted on each context."""
        xs = split_to_contexts(x.transpose(0, 3, 1, 2), self.run.ctxs, self.run.dtype, even=False)
        predicted = [self.run.net(s).argmax(axis=1).asnumpy() for s in xs]
        return np.concatenate(predicted).astype(np.int64)

    def moving_stats(self) -> tuple[bool, str]:
        """(all finite, the first that is not) of every context's BatchNorm moving statistics;
        on several nodes every worker's, gathered."""
        mine = self.local_moving_stats()
        if self.ps is None:
            return mine
        bad = [f"worker {i}: {detail}" for i, (finite, detail) in
               enumerate(self.gather(list(mine))) if not finite]
        return (not bad, "; ".join(bad) if bad else
                f"{mine[1]}, on each of {self.ps.kv.num_workers} workers")

    def local_moving_stats(self) -> tuple[bool, str]:
        for name, param in self.run.net.collect_params().items():
            if not name.endswith(("running_mean", "running_var")):
                continue
            for data in param.list_data():
                values = data.asnumpy()
                if not np.isfinite(values).all():
                    return False, (f"{name} on {data.context}: "
                                   f"{int((~np.isfinite(values)).sum())} of {values.size} "
                                   "not finite")
        return True, "every context's BatchNorm running_mean and running_var is finite"

    def record(self) -> dict[str, Any]:
        """The converge record's evidence of the steps, read after training."""
        opt, one = self.run.trainer._optimizer, self.ps is None
        return {
            "loss_kind": code("mxnet.converge_loss") if one else
            code("mxnet.dist_converge_loss"),
            "data_placement": code("mxnet.converge_split_and_load") if one else
            code("mxnet.dist_converge_share"),
            "placement": dict(self.rows),
            "parameter_copies": read_placement(self.last, self.run.net)["parameter_copies"],
            "placement_source": code("mxnet.converge_context_rows"),
            "moving_stats_source": code("mxnet.batchnorm_list_data"),
            "evaluation": code("mxnet.converge_evaluation") if one else
            code("mxnet.dist_converge_evaluation"),
            "optimizer": {"name": type(opt).__name__.lower(), "momentum": opt.momentum,
                          "wd": opt.wd, "steps": opt.num_update,
                          "epoch_start_lr": self.applied,
                          "source": code("mxnet.trainer_optimizer_source")}}


def converge(spec: Spec) -> dict[str, Any]:
    """Mode converge: the benchmark's model, kvstore and dtype trained with the recipe's SGD;
    the initial weights drawn once from the recipe's seed and copied to every context. Across
    nodes each worker trains its share of every global batch over the dist_sync kvstore
    (converge_on)."""
    return dist_launch.across_nodes(spec, converge_on)


def converge_on(spec: Spec, ps: dist_launch.PsLite | None = None) -> dict[str, Any]:
    """One node's converge run; with `ps`, this node's worker of a dist_sync kvstore, as MXNet
    1.x's example/image-classification/common/fit.py with kv dist_sync: worker kv.rank feeds
    its share of each global batch (runners.converge.epoch_batches), the servers sum the
    workers' gradients, trainer.step(global rows) makes them the global mean's (Module's
    rescale_grad 1/(batch x num_workers)), the rate the recipe's for the global batch, worker
    0's initial weights broadcast by the kvstore's init. Differs: the servers only sum, each
    worker updates (update_on_kvstore=False); one permutation of the whole split cut by rank,
    not a part of the records per worker; the held-out counts summed over the workers."""
    recipe = Recipe.of(spec)
    if recipe.optimizer != "sgd":
        raise Unavailable(f"optimizer {recipe.optimizer!r}: mxnet_native trains with SGD")
    run = GluonRun.open(spec)
    splits = load_splits(spec)
    check_splits(splits, run.model_spec, recipe, len(run.ctxs) * spec.num_nodes)
    # the workers meet in the kvstore: from here on every worker must reach each collective
    kv = ps.kvstore(dist_launch.kvstore_type(spec)) if ps is not None else None
    mx.random.seed(recipe.seed)
    initial = weights_digest(run.build())
    run.compile({"learning_rate": recipe.lr(0, 0, 1), "momentum": recipe.momentum,
                 "wd": recipe.weight_decay}, dist_kv=kv)
    steps = ConvergeSteps(run, ps)
    if kv is not None:
        broadcast_before_first_push(run.trainer, kv)
        initial = broadcast_digests(steps, initial, weights_digest(run.net))
    result = train_to_accuracy(spec, steps.train_epoch, steps.evaluate, steps.moving_stats,
                               kv.rank if kv else 0, kv.num_workers if kv else 1, splits)
    out = join(result, steps.record(), run.fields(len(run.ctxs) * spec.num_nodes),
               {"initial_weights": initial})
    if ps is not None:
        gathered, _ = dist_launch.gather_workers(ps, run.trainer, out, [], [])
        out.update(gathered, placement_source=code("mxnet.dist_converge_placement"))
    return out


def broadcast_digests(steps: ConvergeSteps, seeded: dict[str, Any], after: dict[str, Any]
                      ) -> dict[str, Any]:
    """initial_weights across nodes: each worker's digest of its seeded weights and of those
    the kvstore's init broadcast from worker 0, gathered; sha256 worker 0's broadcast one."""
    rows = steps.gather({"seeded": seeded["sha256"], "broadcast": after["sha256"],
                         "contexts_identical": after["contexts_identical"]})
    return {"sha256": rows[0]["broadcast"],
            "contexts_identical": all(r["contexts_identical"] for r in rows),
            "workers_identical": len({r["broadcast"] for r in rows}) == 1,
            "workers": rows, "source": code("mxnet.dist_initial_weights")}


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
    fewer rows than contexts (MXNet 1.9 cannot copy an empty slice to a context)."""
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


if __name__ == "__main__":
    main(benchmark, equivalence, converge)
