"""The run's TensorFlow devices, without Keras: N virtual CPU devices or N GPUs for a
MirroredStrategy (setup_devices); several nodes: MultiWorkerMirroredStrategy over
SlurmClusterResolver (multi_worker_strategy), ports and CPU GPU count changed and recorded.
Child processes only. docs/runners/tf_family.md, "Notes from the code"."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from contract.reasons import code
from runners import memory
from runners.common import Invalid, Spec, Unavailable, node_identity, process_rank
from runners.tf.placement import all_gather_json, collective_ops


def setup_devices(spec: Spec) -> tuple[list[str], list[dict[str, Any]]]:
    """The run's N devices as TF device names: N virtual CPU devices (device: cpu), or the
    first N GPUs (device: gpu). Call before anything else touches TensorFlow's devices."""
    n = spec.num_devices
    if spec.device == "cpu":
        cpus = tf.config.list_physical_devices("CPU")
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
        names = [f"/cpu:{i}" for i in range(n)]
        memory.baseline(code("memory.baseline_tf_devices"))
        return names, [{"name": name, "kind": "virtual CPU device"} for name in names]
    gpus = tf.config.list_physical_devices("GPU")
    if len(gpus) < n:
        raise Unavailable(f"needs {n} GPUs; TensorFlow sees {len(gpus)}")
    for gpu in gpus[:n]:
        tf.config.experimental.set_memory_growth(gpu, True)
    names = [f"/gpu:{i}" for i in range(n)]
    memory.baseline(code("memory.baseline_tf_devices"))
    return names, [{"name": name,
                    "kind": tf.config.experimental.get_device_details(gpu).get("device_name")}
                   for name, gpu in zip(names, gpus[:n], strict=True)]


def cross_device_ops_used(strategy: tf.distribute.Strategy) -> str:
    """The all-reduce class MirroredStrategy uses (for auto: the one it chose itself)."""
    ops = getattr(strategy.extended, "_cross_device_ops", None)
    return type(ops).__name__ if ops is not None else "default"


def session_config(spec: Spec) -> tf.compat.v1.ConfigProto:
    """The tf.compat.v1 Session config of the graph-mode runners: soft placement, GPU memory
    growth, inter-op threads >= 2N+2, and on CPU N CPU devices."""
    n = spec.num_devices
    config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    config.gpu_options.allow_growth = True
    config.inter_op_parallelism_threads = max(os.cpu_count() or 1, 2 * n + 2)
    if spec.device == "cpu":
        config.device_count["CPU"] = n
    return config


# ---- multi-node: MultiWorkerMirroredStrategy over SlurmClusterResolver's cluster ----------

CPU_GPUS_NOTE = code("tf.slurm_resolver_cpu_gpus")


class SlurmResolver(tf.distribute.cluster_resolver.SlurmClusterResolver):
    """TensorFlow's SlurmClusterResolver, ports from MGBENCH_MASTER_PORT, with distinct ports
    where two tasks share an address and 0 GPUs on CPU, both recorded in `multi_node`."""

    def __init__(self, port_base: int, gpus: int) -> None:
        # gpus 0 cannot be given to TF's resolver (see CPU_GPUS_NOTE): 1 stands in, unused
        super().__init__(port_base=port_base, gpus_per_node=max(gpus, 1),
                         gpus_per_task=max(gpus, 1), auto_set_gpu=False)
        self.gpus = gpus
        self.resolved: dict[str, list[str]] = {}
        self.adjustments: list[dict[str, str]] = []

    def cluster_spec(self) -> tf.train.ClusterSpec:
        spec = super().cluster_spec()
        self.resolved = {job: list(tasks) for job, tasks in spec.as_dict().items()}
        adjusted, self.adjustments = distinct_ports(self.resolved, self._port_base)
        return tf.train.ClusterSpec(adjusted) if self.adjustments else spec

    def num_accelerators(self, task_type: str | None = None, task_id: int | None = None,
                         config_proto: Any = None) -> dict[str, int]:
        if self.gpus == 0:
            return {}
        return super().num_accelerators(task_type, task_id, config_proto)


def distinct_ports(cluster: dict[str, list[str]], port_base: int
                   ) -> tuple[dict[str, list[str]], list[dict[str, str]]]:
    """The cluster with port_base + global task index on every address two tasks would share,
    and one entry per changed task."""
    tasks = [(job, i, addr) for job in sorted(cluster) for i, addr in enumerate(cluster[job])]
    ips: dict[str, str] = {}

    def endpoint(addr: str) -> tuple[str, str]:
        host, port = addr.rsplit(":", 1)
        if host not in ips:
            try:
                ips[host] = socket.gethostbyname(host)
            except OSError:
                ips[host] = host
        return ips[host], port

    seen: dict[tuple[str, str], list[str]] = {}
    for _, _, addr in tasks:
        seen.setdefault(endpoint(addr), []).append(addr)
    shared = {ip for (ip, _), addrs in seen.items() if len(addrs) > 1}
    if not shared:
        return cluster, []
    out = {job: list(addrs) for job, addrs in cluster.items()}
    changes = []
    for index, (job, i, addr) in enumerate(tasks):
        ip, _ = endpoint(addr)
        if ip not in shared:
            continue
        host = addr.rsplit(":", 1)[0]
        new = f"{host}:{port_base + index}"
        if new != addr:
            others = sorted({a.rsplit(":", 1)[0] for (p, _), a_s in seen.items() if p == ip
                             for a in a_s})
            changes.append({"task": f"{job}:{i}", "resolved": addr, "used": new,
                            "why": f"{' and '.join(others)} resolve to {ip}: two gRPC servers "
                                   f"cannot share port {addr.rsplit(':', 1)[1]}; port_base + "
                                   f"global task index {index}"})
        out[job][i] = new
    return out, changes


@dataclass
class MultiWorker:
    """A multi-node run's strategy, resolver and local devices."""

    strategy: tf.distribute.MultiWorkerMirroredStrategy
    resolver: SlurmResolver
    devices: list[dict[str, Any]]
    communication: str

    def record(self, placement: dict[str, int], run_metadata: Any,
               node_extra: dict[str, Any] | None = None,
               adjustments: dict[str, str] | None = None) -> dict[str, Any]:
        """`nodes`, `multi_node` and every worker's placement and devices, gathered through TF. A
        collective: call on every worker, last. Invalid when the workers are not tasks 0..N-1 or
        two report the same device."""
        s, r = self.strategy, self.resolver
        ext = s.extended
        cluster = {job: list(tasks) for job, tasks in ext._cluster_spec.as_dict().items()}
        own = {**node_identity(), "task_type": r.task_type, "task_id": r.task_id,
               "address": cluster[r.task_type][r.task_id], "is_chief": bool(ext._is_chief),
               "worker_devices": list(ext.worker_devices), "placement": placement,
               "collective_ops": collective_ops(run_metadata), **(node_extra or {})}
        nodes = all_gather_json(s, own)
        ids = [(n["task_type"], n["task_id"]) for n in nodes]
        if ids != [("worker", i) for i in range(len(cluster["worker"]))]:
            raise Invalid(f"the workers gathered through TF are {ids}, not worker 0..."
                          f"{len(cluster['worker']) - 1} in order")
        merged: dict[str, int] = {}
        for n in nodes:
            for key, count in n["placement"].items():
                if key in merged:
                    raise Invalid(f"two workers report placement on {key!r}")
                merged[key] = count
        return {
            "nodes": nodes,
            "placement": dict(sorted(merged.items())),
            "placement_source": code("tf.worker_partition_graphs"),
            "devices": [{"name": d, "kind": "GPU" if r.gpus else "the worker's CPU device",
                         "node": n["node"]} for n in nodes for d in n["worker_devices"]],
            "multi_node": self.multi_node(cluster, own["collective_ops"], adjustments),
        }

    def multi_node(self, cluster: dict[str, list[str]], collectives: dict[str, Any],
                   adjustments: dict[str, str] | None) -> dict[str, Any]:
        """The record's `multi_node`: mechanism, cluster resolved and used, the strategy."""
        s, r = self.strategy, self.resolver
        ext = s.extended
        impl = ext._communication_options.implementation
        return {
            "mechanism": code("tf.multi_worker_mechanism"),
            "tensorflow": tf.__version__,
            "resolver": type(r).__mro__[1].__name__,
            "cluster_spec_resolved": r.resolved,
            "cluster_spec": cluster,
            "port_base": r._port_base,
            "port_adjustments": r.adjustments,
            "accelerators": ({"GPU": r.gpus} if r.gpus
                             else {"GPU": 0, "why": CPU_GPUS_NOTE}),
            "task_type": s.cluster_resolver.task_type,
            "task_id": s.cluster_resolver.task_id,
            "num_workers": ext._num_workers,
            "num_replicas_in_sync": s.num_replicas_in_sync,
            "worker_devices": list(ext.worker_devices),
            "runner_adjustments": adjustments or {},
            "communication_requested": self.communication,
            "communication_implementation": getattr(impl, "name", str(impl)),
            "collective_ops": collectives,
            "master": {k: os.environ.get(k) for k in (
                "MGBENCH_MASTER_ADDR", "MGBENCH_MASTER_PORT", "MGBENCH_NUM_NODES",
                "SLURM_STEP_NODELIST", "SLURM_STEP_TASKS_PER_NODE")},
            "source": code("tf.cluster_source")}


def multi_worker_strategy(spec: Spec, communication: str = "auto",
                          strategy_class: type[tf.distribute.MultiWorkerMirroredStrategy]
                          = tf.distribute.MultiWorkerMirroredStrategy) -> MultiWorker:
    """MultiWorkerMirroredStrategy over the SLURM step's tasks, one worker per node; call before
    anything else touches TF's devices. Unavailable for what MWMS cannot do here; Invalid when
    what TF resolved is not this run."""
    per_node = spec.devices_per_node
    if spec.num_devices != per_node * spec.num_nodes:
        raise Invalid(f"{spec.num_devices} devices do not divide over {spec.num_nodes} nodes")
    if spec.device == "cpu" and per_node > 1:
        raise Unavailable(
            f"{per_node} CPU devices per node: MultiWorkerMirroredStrategy (TF "
            f"{tf.__version__}) runs one replica per worker on CPU (its local devices are the "
            "worker's GPUs, or else its one CPU device); run 1 device per node on CPU")
    gpus = 0
    if spec.device == "gpu":
        found = tf.config.list_physical_devices("GPU")
        if len(found) < per_node:
            raise Unavailable(f"needs {per_node} GPUs per node; TensorFlow sees {len(found)}")
        for gpu in found:
            tf.config.experimental.set_memory_growth(gpu, True)
        gpus = per_node
    port = os.environ.get("MGBENCH_MASTER_PORT", "")
    if not port.isdigit():
        raise Unavailable("a multi-node run needs MGBENCH_MASTER_PORT (the job's reserved "
                          "ports, set by bench/run/slurm_job.py)")
    try:
        resolver = SlurmResolver(int(port), gpus)
        resolver.cluster_spec()  # resolves task_type / task_id
    except RuntimeError as exc:  # "SLURM_PROCID not found in environment. Not running ..."
        raise Unavailable(f"SlurmClusterResolver: {exc}") from exc
    check_resolved(spec, resolver)
    impl = getattr(tf.distribute.experimental.CommunicationImplementation,
                   communication.upper())
    strategy = strategy_class(
        cluster_resolver=resolver,
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=impl))
    if strategy.num_replicas_in_sync != spec.num_devices:
        raise Invalid(f"MultiWorkerMirroredStrategy has {strategy.num_replicas_in_sync} "
                      f"replicas in sync; the run asked for {spec.num_devices}")
    devices = [{"name": name, "kind": "GPU" if gpus else "the worker's CPU device"}
               for name in strategy.extended.worker_devices]
    memory.baseline(code("memory.baseline_tf_multi_worker"))
    return MultiWorker(strategy, resolver, devices, communication)


XLA_CPU_COLLECTIVES = "Collectives are not yet implemented for CPU devices when compiling with XLA"


@contextlib.contextmanager
def xla_collectives_guard() -> Iterator[None]:
    """Re-raises Unavailable, with TF's words, the error XLA gives when it could not compile the
    step's cross-worker all-reduce on CPU (xla on several workers); any other error as it is."""
    try:
        yield
    except tf.errors.UnimplementedError as exc:
        said = next((line.strip() for line in str(exc).splitlines()
                     if XLA_CPU_COLLECTIVES in line), None)
        if said is None:
            raise
        raise Unavailable(f"xla on several workers on CPU: TensorFlow {tf.__version__} does not "
                          "compile the cross-worker all-reduce with XLA on CPU "
                          f"({said[:300]})") from exc


def check_resolved(spec: Spec, resolver: SlurmResolver) -> None:
    """Invalid unless SlurmClusterResolver resolved this run: one worker per node, this process's
    task id its rank, its address on this node."""
    cluster = resolver.resolved
    workers = cluster.get("worker", [])
    if set(cluster) != {"worker"} or len(workers) != spec.num_nodes:
        raise Invalid(f"SlurmClusterResolver resolved {cluster}; the run asked for "
                      f"{spec.num_nodes} workers, one per node")
    rank = process_rank()
    if resolver.task_type != "worker" or resolver.task_id != rank:
        raise Invalid(f"SlurmClusterResolver made this process {resolver.task_type}:"
                      f"{resolver.task_id} (SLURM_PROCID={os.environ.get('SLURM_PROCID')}); "
                      f"the harness made it process rank {rank}")
    node = os.environ.get("SLURMD_NODENAME")
    host = workers[resolver.task_id].rsplit(":", 1)[0]
    if node and host != node:
        raise Invalid(f"SlurmClusterResolver gave worker {resolver.task_id} the address "
                      f"{workers[resolver.task_id]}, but it runs on {node} (TF orders tasks "
                      "by sorted host name, SLURM by node list)")
