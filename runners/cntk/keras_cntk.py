"""Keras on CNTK: registered so sweeps can name it, always recorded as unavailable here.

Seed 003 measured Keras with the CNTK backend scaling near-ideally across GPUs. CNTK 2.7 (its
last release) ships wheels only for CPython 2.7, 3.5 and 3.6, and the multi-backend Keras that
drove it is unmaintained, so the parent records every keras_cntk run as `unavailable` (the
runner never starts), and this module, if a user starts it with an interpreter of their own,
says the same. What running it would need (Python 3.6, cntk 2.7, keras 2.2.4, MPI, CNTK's
data_parallel_distributed_learner): docs/runners/keras_cntk.md.
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
