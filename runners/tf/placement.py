"""Where a TensorFlow step's work ran, read back from TensorFlow (issue 13's `placement`): the
compute ops in each device's partition graph of a RunMetadata; several workers gathered by a
TF collective. Child processes only. docs/runners/tf_family.md, "Notes from the code"."""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.eager import context

from contract.reasons import code
from runners.tf.op_kinds import op_kind

BOOKKEEPING_OPS = frozenset({
    "Const", "HostConst", "_EagerConst", "_Arg", "_Retval", "_DeviceArg", "_DeviceRetval",
    "_Send", "_Recv", "_HostSend", "_HostRecv", "NoOp", "Identity", "IdentityN", "Placeholder",
    "PlaceholderWithDefault", "VarHandleOp", "VariableV2", "ReadVariableOp", "StopGradient",
})
# the full device name TF reports is kept; only the short forms some graphs carry normalised
_SHORT = re.compile(r"^/?(device:)?(?P<kind>[A-Za-z_]+):(?P<index>\d+)$")


def device_key(name: str) -> str:
    """The device as TensorFlow names it in a partition graph."""
    m = _SHORT.match(name)
    if m:
        return f"/job:localhost/replica:0/task:0/device:{m['kind'].upper()}:{m['index']}"
    return name


def partition_graphs(run_metadata: Any) -> list[Any]:
    """Every per-device partition graph in a RunMetadata, once (eager run metadata lists a
    function's partitions twice: a graph with the same nodes is kept once)."""
    graphs, seen = [], set()
    candidates = list(run_metadata.partition_graphs)
    for fg in run_metadata.function_graphs:
        candidates.extend(fg.partition_graphs)
    for graph in candidates:
        key = tuple((n.name, n.op, n.device, tuple(n.input)) for n in graph.node)
        if key not in seen:
            seen.add(key)
            graphs.append(graph)
    return graphs


def compute_ops_by_device(run_metadata: Any) -> dict[str, int]:
    """Compute ops per device in the partition graphs TF ran: the step's placement."""
    counts: Counter[str] = Counter()
    for graph in partition_graphs(run_metadata):
        for node in graph.node:
            if node.device and node.op not in BOOKKEEPING_OPS:
                counts[device_key(node.device)] += 1
    return dict(sorted(counts.items()))


_TRACER_STREAM = re.compile(r"/(stream:[^/]*|memcpy)/?$")


def _executor_device(name: str) -> str | None:
    """The device of a step-stats entry the executor wrote; None for the GPU tracer's per-stream
    and memcpy entries, which list the same kernels again."""
    name = name.split(" ")[0]
    return None if _TRACER_STREAM.search(name) else device_key(name)


def executed_kinds_by_device(run_metadata: Any) -> dict[str, dict[str, int]]:
    """{device: {op kind: nodes executed}} from a FULL_TRACE step's RunMetadata, each node's op
    type classified by runners/tf/op_kinds.op_kind."""
    op_of: dict[tuple[str, str], str] = {}
    for graph in partition_graphs(run_metadata):
        for node in graph.node:
            op_of[(device_key(node.device), node.name)] = node.op
    out: dict[str, Counter[str]] = {}
    for dev in run_metadata.step_stats.dev_stats:
        device = _executor_device(dev.device)
        if device is None:
            continue
        for stats in dev.node_stats:
            op = op_of.get((device, stats.node_name))
            if op is None:
                label = stats.timeline_label.partition("=")[2].strip()
                op = label.split("(")[0].strip()
            kind = op_kind(op)
            if kind:
                out.setdefault(device, Counter())[kind] += 1
    return {d: dict(sorted(c.items())) for d, c in sorted(out.items())}


class EagerPlacement:
    """Collects the partition graphs of the tf.functions instantiated between start() and stop()
    (or in a `with` block): around the step function's first call, outside the timed window."""

    def __init__(self) -> None:
        self.run_metadata: Any = None
        self._on = False

    def start(self) -> EagerPlacement:
        ctx = context.context()
        ctx.export_run_metadata()  # drop whatever an earlier collection left
        ctx.enable_run_metadata()
        self._on = True
        return self

    def __enter__(self) -> EagerPlacement:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if not self._on:
            return
        ctx = context.context()
        self.run_metadata = ctx.export_run_metadata()
        ctx.disable_run_metadata()
        self._on = False

    def result(self) -> dict[str, Any]:
        """`placement` and `placement_source` for the result (empty placement if nothing ran)."""
        self.stop()
        placement = compute_ops_by_device(self.run_metadata) if self.run_metadata else {}
        return {"placement": placement,
                "placement_source": code("tf.function_partition_graphs")}


eager_placement = EagerPlacement  # `with eager_placement() as p: <first step>`; p.result()


def graph_run_options(full_trace: bool = False) -> tuple[Any, Any]:
    """RunOptions and a RunMetadata for one `session.run` (or Keras 2's compile) that report the
    partition graphs TF ran (and, with full_trace, each executed node)."""
    options = tf.compat.v1.RunOptions(
        output_partition_graphs=True,
        trace_level=tf.compat.v1.RunOptions.FULL_TRACE if full_trace
        else tf.compat.v1.RunOptions.NO_TRACE)
    return options, tf.compat.v1.RunMetadata()


def graph_placement(run_metadata: Any) -> dict[str, Any]:
    """`placement` and `placement_source` from a graph-mode session.run's RunMetadata: the nodes
    that executed per device in a FULL_TRACE step's step stats, else its partition graphs'."""
    executed: Counter[str] = Counter()
    for dev in run_metadata.step_stats.dev_stats:
        device = _executor_device(dev.device)
        n = sum(1 for s in dev.node_stats if s.node_name not in ("_SOURCE", "_SINK"))
        if n and device:
            executed[device] += n
    if executed:
        return {"placement": dict(sorted(executed.items())),
                "placement_source": "nodes executed per device in a FULL_TRACE session.run's "
                                    "step stats"}
    return {"placement": compute_ops_by_device(run_metadata),
            "placement_source": code("tf.session_partition_graphs")}


def collective_nodes(run_metadata: Any) -> tuple[list[Any], list[str]]:
    """The collective ops' nodes in the partition graphs TF ran, and their communication_hint
    attributes (auto, ring, nccl), sorted."""
    nodes = [node for graph in partition_graphs(run_metadata) for node in graph.node
             if node.op.startswith("Collective")]
    return nodes, sorted({node.attr["communication_hint"].s.decode() for node in nodes
                          if "communication_hint" in node.attr})


def collective_ops(run_metadata: Any) -> dict[str, Any]:
    """How many collective ops of each type TF ran, and their communication hints."""
    nodes, hints = collective_nodes(run_metadata) if run_metadata is not None else ([], [])
    return {"ops": dict(sorted(Counter(node.op for node in nodes).items())),
            "communication_hints": hints}


def all_gather_json(strategy: tf.distribute.Strategy, obj: Any) -> list[Any]:
    """Every worker's JSON-able `obj`, in worker order, through strategy.gather of its padded
    JSON bytes. Every worker must call it, in the same order."""
    data = np.frombuffer(json.dumps(obj, sort_keys=True, default=str).encode(), np.uint8)

    def per_replica(value: np.ndarray) -> Any:
        return strategy.experimental_distribute_values_from_function(
            lambda ctx: tf.constant(value))

    lengths = strategy.gather(per_replica(np.array([len(data)], np.int32)), axis=0).numpy()
    row = np.zeros((1, int(lengths.max())), np.int32)
    row[0, :len(data)] = data
    rows = strategy.gather(per_replica(row), axis=0).numpy()
    local = len(strategy.extended.worker_devices)
    return [json.loads(bytes(r[:n].astype(np.uint8)).decode())
            for r, n in list(zip(rows, lengths, strict=True))[::local]]
