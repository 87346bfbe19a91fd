"""Pipeline mode for `tf_data`: runners/tf/data.py's pipeline on its own, no model, on the host
(GPUs hidden), each timed batch read back as numpy."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import tensorflow as tf

from models import get_spec
from runners.common import Spec, main
from runners.real_data import describe, open_dataset, time_pipeline
from runners.tf import data as tf_data


def benchmark(spec: Spec) -> dict[str, Any]:
    data = open_dataset(replace(spec, data="real"))  # a pipeline run always reads real data
    # the pipeline runs on the host; keep TF from taking every GPU's memory at start-up
    tf.config.set_visible_devices([], "GPU")
    size, batch = get_spec(spec.model).input_shape[0], spec.global_batch_size
    ds = tf_data.make_dataset(data, size, batch)  # NHWC: a pipeline run has no options
    batches = iter(ds)

    def count(b: Any) -> int:
        x, y = b[0].numpy(), b[1].numpy()
        if len(y) != len(x):
            raise ValueError(f"a batch of {len(x)} images with {len(y)} labels")
        return len(x)

    return {
        **time_pipeline(spec, batches, batch, count),
        **describe(data, size),
        "pipeline": tf_data.describe_pipeline(data, batch),
        "framework": {"tensorflow": tf.__version__, "numpy": np.__version__},  # no Keras
    }


if __name__ == "__main__":
    main(benchmark)
