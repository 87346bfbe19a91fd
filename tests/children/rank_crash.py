"""A child for launcher tests under torchrun: rank 1 crashes at once while rank 0 waits, as a
rank blocked in a collective on a peer that died would; the launcher must end the run. Option
`die`: "raise" (an exception, reported by runners.common) or "sigkill" (rank 1 kills itself
after two lines of output, as the kernel's out-of-memory killer would)."""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from runners.common import Spec, main, process_rank


def benchmark(spec: Spec) -> dict[str, Any]:
    if process_rank() == 1:
        if spec.options.get("die") == "sigkill":
            print("rank 1 says hello", flush=True)
            print("rank 1 is about to die", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError("rank 1 crashed on purpose")
    time.sleep(spec.timeout_s)  # a hang if nobody ends this rank
    raise RuntimeError("rank 0 was not stopped after rank 1 crashed")


if __name__ == "__main__":
    main(benchmark)
