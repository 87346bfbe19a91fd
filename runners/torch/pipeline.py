"""Pipeline mode for `torch_dataloader`: the PyTorch runners' input (runners/torch/data.py) on
its own, one rank, no model. The DataLoader over the JPEG file list with `workers` processes
(pinned memory and a non_blocking copy on a GPU; DALI instead when it is installed there and
the runner option data_loader allows it), timed per batch until the batch is on the device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from runners.common import Spec, Unavailable, main
from runners.real_data import pipeline_data, time_pipeline
from runners.torch.data import Place, open_input


def benchmark(spec: Spec) -> dict[str, Any]:
    data, size, batch = pipeline_data(spec)
    if spec.device == "gpu" and not torch.cuda.is_available():
        raise Unavailable(f"device gpu: torch {torch.__version__} sees no CUDA GPU")
    device = torch.device("cuda", 0) if spec.device == "gpu" else torch.device("cpu")
    feed = open_input(spec, data, size, batch, Place(device=device))

    def batches() -> Any:
        while True:
            yield feed.next()

    def count(b: tuple[torch.Tensor, torch.Tensor]) -> int:
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the copy to the device has finished
        return int(b[0].shape[0])

    result = time_pipeline(spec, batches(), batch, count)
    feed.close()
    record = feed.record()
    del record["data_placement"]  # a training run's field: no model here
    return {**result, **record, "pipeline": feed.description,
            "framework": {"torch": torch.__version__, "numpy": np.__version__}}


if __name__ == "__main__":
    main(benchmark)
