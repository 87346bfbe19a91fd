"""The MXNet all-reduce probe (mode allreduce): `kv.pushpull` of N per-context arrays on a
'device' kvstore, as Gluon's Trainer reduces gradients in MXNet 1.9.1; one machine only.
Differs from a Trainer: one key per call, no optimizer on the kvstore; no all-gather or
reduce-scatter (recorded unavailable). docs/runners/mxnet_native.md, "Notes from the code"."""

from __future__ import annotations

import time
from typing import Any

import mxnet as mx
import numpy as np

import contract.collectives as ar
from contract.collectives import DTYPE_BYTES, expected_sum, measure_size, probe_result, probe_sizes
from contract.reasons import code
from runners.common import Spec, Unavailable, main
from runners.mxnet.common import contexts, framework_versions


def distinct_contexts(arrays: list[Any]) -> list[str]:
    """The contexts the arrays live on, as MXNet names them, in order, once each."""
    return list(dict.fromkeys(str(a.context) for a in arrays))


class KeyAllReduce:
    """One size's all-reduce through the kvstore: key `key` initialised as the Trainer does,
    N input arrays (context i's filled with i + 1) and N outputs, one per context."""

    def __init__(self, kv: Any, key: int, ctxs: list[mx.Context], elements: int) -> None:
        self.kv, self.key = kv, key
        self.inputs = [mx.nd.full((elements,), float(i + 1), ctx=ctx, dtype="float32")
                       for i, ctx in enumerate(ctxs)]
        self.outputs = [mx.nd.full((elements,), 0.0, ctx=ctx, dtype="float32") for ctx in ctxs]
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
    kv = mx.kv.create("device")  # mxnet_native's default kvstore
    n = len(ctxs)
    rows: list[dict[str, Any]] = []
    start = time.time()
    for key, nbytes in enumerate(probe_sizes(spec.model)):
        op = KeyAllReduce(kv, key, ctxs, nbytes // DTYPE_BYTES)
        rows.append(measure_size(nbytes, n, op, op.sync, spec.warmup_steps, spec.measure_steps,
                                 ar.Around(check=lambda op=op: op.check(expected_sum(n)))))
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
        "source": code("mxnet.allreduce_probe_source"),
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
