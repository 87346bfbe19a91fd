"""Pipeline mode for `keras_pydataset`: runners/keras_data.py's JpegSequence read through the
PyDataset adapter model.fit builds on jax, each batch device_put; timed per batch."""

from __future__ import annotations

from typing import Any

from runners.common import Spec, main
from runners.jax.common import framework_versions, ready_rows, setup_devices
from runners.real_data import describe, pipeline_data, time_pipeline


def fit_adapter(sequence: Any) -> Any:
    """The data adapter model.fit builds for a PyDataset. Keras 3 has no public enqueuer, so
    this is keras.src, a private module: when a Keras release moves it, fail loudly rather than
    time some other path."""
    import keras

    try:
        from keras.src.trainers.data_adapters import get_data_adapter
        from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter
    except ImportError as exc:
        raise RuntimeError(f"keras {keras.__version__} no longer has the private "
                           f"keras.src.trainers.data_adapters fit uses ({exc}); update "
                           "runners/jax/keras_pipeline.py") from exc
    adapter = get_data_adapter(sequence, shuffle=False)
    if not isinstance(adapter, PyDatasetAdapter):
        raise RuntimeError(f"keras {keras.__version__} adapts a PyDataset with "
                           f"{type(adapter).__name__}, not PyDatasetAdapter; update "
                           "runners/jax/keras_pipeline.py")
    return adapter


def benchmark(spec: Spec) -> dict[str, Any]:
    devices, described = setup_devices(spec)
    import jax

    from runners.jax.keras_fit import import_keras

    keras = import_keras()
    from runners.keras_data import describe_keras, jpeg_sequence

    data, size, batch = pipeline_data(spec)
    steps = spec.warmup_steps + spec.measure_steps
    adapter = fit_adapter(jpeg_sequence(data, size, batch, steps))
    adapter.on_epoch_begin()  # starts the enqueuer's workers, as fit does at each epoch
    batches = (jax.device_put(b, devices[0]) for b in adapter.get_jax_iterator())

    try:
        result = time_pipeline(spec, batches, batch, ready_rows)
    finally:
        adapter.on_epoch_end()  # stops the workers
    return {**result, **describe(data, size),
            "pipeline": describe_keras(data) + "; each batch jax.device_put to the device",
            "devices": described, "framework": {**framework_versions(), "keras": keras.__version__}}


if __name__ == "__main__":
    main(benchmark)
