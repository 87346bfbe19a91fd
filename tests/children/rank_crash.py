"""A child for launcher tests under torchrun: rank 1 crashes at once while rank 0 waits, as a
rank blocked in a collective on a peer that died would; the launcher must end the run."""

from __future__ import annotations

import time
from typing import Any

from runners.common import Spec, main, process_rank


def benchmark(spec: Spec) -> dict[str, Any]:
    if process_rank() == 1:
        raise RuntimeError("rank 1 crashed on purpose")
    time.sleep(spec.timeout_s)  # a hang if nobody ends this rank
    raise RuntimeError("rank 0 was not stopped after rank 1 crashed")


if __name__ == "__main__":
    main(benchmark)
