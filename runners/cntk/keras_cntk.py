"""Keras on CNTK (seed 003): registered so sweeps can name it, always recorded unavailable here
(CNTK 2.7 ships wheels only for Python <= 3.6); this module, if started anyway, says the same.
What running it would need: docs/runners/keras_cntk.md."""

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
