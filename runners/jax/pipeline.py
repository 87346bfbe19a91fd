"""Pipeline mode for `grain`: the JAX runners' real-data input (runners/jax/data.py) on its own,
no model. Grain over the JPEG file list (shuffle, repeat, Pillow decode and crop/flip in
`workers` spawned processes, batch), each batch jax.device_put into the batch sharding of the
run's devices one batch ahead, exactly as jax_native feeds its step; timed per batch until the
batch is on the device (block_until_ready).
"""

from __future__ import annotations

from typing import Any

from runners.common import Spec, main
from runners.jax.common import framework_versions, ready_rows, setup_devices
from runners.real_data import describe, pipeline_data, time_pipeline


def benchmark(spec: Spec) -> dict[str, Any]:
    devices, described = setup_devices(spec)

    from runners.jax.data import device_batches, grain_version
    from runners.jax.flax_step import make_shardings

    data, size, batch = pipeline_data(spec)
    _, sharding = make_shardings(devices)
    batches, line = device_batches(data, size, batch, sharding)

    try:
        result = time_pipeline(spec, batches, batch, ready_rows)
    finally:
        batches.close()
    return {**result, **describe(data, size), "pipeline": line, "devices": described,
            "framework": {**framework_versions(), **grain_version()}}


if __name__ == "__main__":
    main(benchmark)
