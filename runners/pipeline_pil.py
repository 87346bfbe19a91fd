"""Pipeline mode, the naive baseline: one Python process decodes (Pillow), crops and flips
(numpy) and stacks every image of every batch in turn, with no workers and no prefetch (the
loop seed 000 measured against MXNet's; docs/runners/shared.md). Needs no framework.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import PIL

from runners.common import Spec, main
from runners.real_data import describe, pil_batches, pipeline_data, time_pipeline


def benchmark(spec: Spec) -> dict[str, Any]:
    data, size, batch = pipeline_data(spec, checked=False)
    batches = pil_batches(data.files, size, data.augmentation, batch)
    return {**time_pipeline(spec, batches, batch), **describe(data, size),
            "pipeline": "one Python process: Pillow decode, numpy crop/flip, np.stack; "
                        "no workers, no prefetch",
            "framework": {"pillow": PIL.__version__, "numpy": np.__version__}}


if __name__ == "__main__":
    main(benchmark)
