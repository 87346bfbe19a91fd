"""Keras on CNTK: registered so sweeps can name it, always recorded as unavailable here.

Seed 003 measured Keras with the CNTK backend scaling near-ideally across GPUs. It cannot run
on this project's machines: CNTK 2.7 (its last release, 2019) ships wheels only for CPython
2.7, 3.5 and 3.6 (`pip install cntk==2.7` finds no distribution for Python 3.10+), and the
multi-backend Keras that drove it (keras 2.2.x, `KERAS_BACKEND=cntk`) is unmaintained.

What a user with such a Python would need to run the strategy seed 003 describes:
- a Python 3.6 environment with `cntk-gpu==2.7` (CUDA 10, cuDNN 7) or `cntk==2.7`, `keras==2.2.4`
  and numpy < 1.17, with `KERAS_BACKEND=cntk`;
- CNTK's data parallelism, which is MPI-based: one process per GPU started with
  `mpiexec -n N python train.py`, the learner wrapped in
  `cntk.train.distributed.data_parallel_distributed_learner` (1-bit SGD optional), and
  `cntk.train.distributed.Communicator.finalize()` at the end; Keras' CNTK backend has no
  multi-GPU API of its own, so the Keras model's learner must be wrapped by hand;
- channels_first images, as the CNTK backend expects.

Until the project has a machine and environment that can really run it, the parent records
every keras_cntk run as `unavailable` with the reason in bench/catalog/registry.py (the runner never
starts), and this module, if a user starts it with an interpreter of their own, says the same.
"""

from __future__ import annotations

from typing import Any

from runners.common import Spec, Unavailable, main

REASON = ("CNTK 2.7 has wheels only for Python 2.7/3.5/3.6 (none for this Python); keras_cntk "
          "needs a Python 3.6 env with cntk 2.7, keras 2.2.4 and MPI (see "
          "runners/cntk/keras_cntk.py)")


def benchmark(spec: Spec) -> dict[str, Any]:
    raise Unavailable(REASON)


if __name__ == "__main__":
    main(benchmark, benchmark)
