"""The MXNet all-reduce probe (mode allreduce, issue 17): the kvstore's sum over one machine's
contexts, as Gluon's Trainer and the Module API reduce gradients in MXNet 1.9.1.

Contexts: one process driving spec.num_devices contexts (runners/mxnet/common.contexts):
mx.gpu(0..N-1) on GPUs, mx.cpu(0..N-1) on CPU, distinct contexts that share the host (MXNet
keeps one copy of every array per context and reduces them through the kvstore as between
GPUs; what mxnet_native trains on). Kvstore: mx.kv.create('device'), mxnet_native's default
(KVStoreLocal with CommDevice: the pushed copies are summed on the devices, peer to peer
between GPUs, then the sum is copied back to every context).
One all-reduce: `kv.pushpull(key, inputs, out=outputs)` of the key's N per-context arrays,
the call Gluon's Trainer._allreduce_grads (update_on_kvstore False) and Module's
_update_params make for each dense gradient in 1.9.1; KVStoreLocal runs it as a push (the N
arrays summed; with no optimizer set on the kvstore the sum replaces the stored value) then a
pull (the stored sum broadcast to the N outputs). The key is initialised once, as the Trainer
does, with kv.init on the first context's array. The inputs are separate from the outputs, so
every iteration sums the same values (Gluon sums in place, into the gradients; the next
backward overwrites them).
Timing: contract/collectives.measure_size: iterations pushed back to back (MXNet's engine is
asynchronous), the clock stopped once every output of the last one is readable
(NDArray.wait_to_read on each). One process times every context at once.
Evidence (read back from MXNet): replicas and world_size = kv.num_workers x the distinct
contexts the arrays were pushed from, devices = each pushed array's NDArray.context, kv.type,
kv.num_workers, kv.rank, the contexts of the pulled outputs.

Follows MXNet 1.9.1's KVStore API as its Gluon Trainer and Module use it on one machine.
Differs from what a user ran: one key per call instead of one per parameter (a Trainer
pushpulls every parameter's gradient under its own key with priority -index, so the engine
overlaps the keys; MXNet has no fusion buffer), no optimizer on the kvstore (a Module with
update_on_kvstore, the single-machine default there, also runs the update on the summed value
before the pull), and the probe's buffer sizes. Multi-node (dist_sync kvstores) is not built.
All-gather and reduce-scatter (issue 27): MXNet 1.9.1's KVStore has push, pull, pushpull,
broadcast and row_sparse_pull, no all-gather or reduce-scatter (the probe asks the kvstore
object for allgather / reducescatter methods); both are recorded unavailable with that reason.
"""

from __future__ import annotations

import time
from typing import Any

import mxnet as mx
import numpy as np

import contract.collectives as ar
from contract.collectives import DTYPE_BYTES, expected_sum, measure_size, probe_result, probe_sizes
from runners.common import Spec, Unavailable, main
from runners.mxnet.common import contexts, framework_versions

KVSTORE = "device"  # mxnet_native's default kvstore


def replica_arrays(ctxs: list[mx.Context], elements: int, fill: bool) -> list[Any]:
    """One float32 vector of `elements` per context: context i's filled with i + 1 (inputs),
    or zeros (outputs)."""
    return [mx.nd.full((elements,), float(i + 1) if fill else 0.0, ctx=ctx, dtype="float32")
            for i, ctx in enumerate(ctxs)]


def distinct_contexts(arrays: list[Any]) -> list[str]:
    """The contexts the arrays live on, as MXNet names them, in order, once each."""
    return list(dict.fromkeys(str(a.context) for a in arrays))


class KeyAllReduce:
    """One size's all-reduce through the kvstore: key `key` initialised as the Trainer does,
    N input arrays (context i's filled with i + 1) and N outputs, one per context."""

    def __init__(self, kv: Any, key: int, ctxs: list[mx.Context], elements: int) -> None:
        self.kv, self.key = kv, key
        self.inputs = replica_arrays(ctxs, elements, fill=True)
        self.outputs = replica_arrays(ctxs, elements, fill=False)
        kv.init(key, mx.nd.zeros((elements,), ctx=ctxs[0], dtype="float32"))

    def __call__(self) -> list[Any]:
        """One all-reduce, queued on MXNet's engine (returns before it is done)."""
        self.kv.pushpull(self.key, self.inputs, out=self.outputs)
        return self.outputs

    @staticmethod
    def sync(out: list[Any]) -> None:
        for array in out:
            array.wait_to_read()

    def check(self, expected: float) -> bool:
        """Outputs zeroed, one all-reduce, every output element equal to `expected`."""
        for array in self.outputs:
            array[:] = 0.0
        return all(bool(np.all(a.asnumpy() == expected)) for a in self())


def benchmark(spec: Spec) -> dict[str, Any]:
    if spec.num_nodes > 1:
        raise Unavailable("the MXNet all-reduce probe runs on one machine (a 'device' kvstore "
                          "over its contexts); dist_sync kvstores across nodes are not built")
    ctxs, devices = contexts(spec)
    kv = mx.kv.create(KVSTORE)
    n = len(ctxs)
    rows: list[dict[str, Any]] = []
    start = time.time()
    for key, nbytes in enumerate(probe_sizes(spec.model)):
        op = KeyAllReduce(kv, key, ctxs, nbytes // DTYPE_BYTES)
        rows.append(measure_size(nbytes, n, op, op.sync, spec.warmup_steps, spec.measure_steps,
                                 check=lambda op=op: op.check(expected_sum(n))))
    window = (start, time.time())
    pushed = distinct_contexts(op.inputs)
    world = kv.num_workers * len(pushed)
    evidence = {
        "replicas": world,
        "world_size": world,
        "devices": [str(a.context) for a in op.inputs],
        "kvstore_type": kv.type,
        "num_workers": kv.num_workers,
        "rank": kv.rank,
        "pushed_contexts": pushed,
        "pulled_contexts": distinct_contexts(op.outputs),
        "source": "replicas: kv.num_workers x the distinct NDArray.context of the arrays "
                  "pushed; devices: NDArray.context of each pushed array; kv.type, "
                  "kv.num_workers, kv.rank; NDArray.context of the outputs pulled (the last "
                  "size's)",
    }
    has = [m for m in ("push", "pull", "pushpull", "broadcast", "row_sparse_pull",
                       "allgather", "all_gather", "reducescatter", "reduce_scatter")
           if hasattr(kv, m)]
    collectives = {
        name: ar.unavailable_section(
            name, f"MXNet {mx.__version__}'s KVStore ({type(kv).__name__}) has no "
                  f"{name.replace('_', '-')}: its collectives are {', '.join(has)}")
        for name in (ar.ALL_GATHER, ar.REDUCE_SCATTER)
    }
    return probe_result(rows, spec.model, f"kvstore {kv.type}: pushpull over {len(pushed)} "
                        "contexts", evidence, framework_versions(), window=window,
                        collectives=collectives, devices=devices)


if __name__ == "__main__":
    main(benchmark)
