"""Pipeline mode for `mxnet_record_iter`: runners/mxnet/data.py's ImageRecordIter timed alone;
a batch counts once its NDArrays are readable (wait_to_read)."""

from __future__ import annotations

from typing import Any

from runners.common import Spec, main
from runners.mxnet.common import framework_versions
from runners.mxnet.data import describe_pipeline, record_iter, stream
from runners.real_data import describe, pipeline_data, time_pipeline


def count(batch: Any) -> int:
    """Wait for the batch's arrays to be written; its image count."""
    batch.data[0].wait_to_read()
    batch.label[0].wait_to_read()
    return int(batch.data[0].shape[0])


def benchmark(spec: Spec) -> dict[str, Any]:
    data, size, batch = pipeline_data(spec, checked=False)
    it = record_iter(data, size, batch, spec.device)
    return {
        **time_pipeline(spec, stream(it), batch, count),
        **describe(data, size),
        "pipeline": describe_pipeline(data, size, spec.device),
        "framework": framework_versions(),
    }


if __name__ == "__main__":
    main(benchmark)
