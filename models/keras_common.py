"""Keras helpers for the Keras builders, the child runners and the parity test.

Imports keras: never import this module from the parent process.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import keras
import numpy as np

from models import ModelSpec, model_fields


def channel_axis(data_format: str) -> int:
    """The channel axis (for BatchNormalization and Concatenate) of a data format."""
    if data_format not in ("channels_last", "channels_first"):
        raise ValueError(f"data_format must be channels_last or channels_first: {data_format!r}")
    return -1 if data_format == "channels_last" else 1


def input_layer(shape_hwc: tuple[int, int, int], data_format: str) -> keras.KerasTensor:
    """The model input named "image": (H, W, C) for channels_last, (C, H, W) for channels_first."""
    h, w, c = shape_hwc
    shape = (h, w, c) if channel_axis(data_format) == -1 else (c, h, w)
    return keras.Input(shape, name="image")


def _leaf_layers(model: keras.Model) -> Iterator[keras.layers.Layer]:
    """The model's layers, nested models expanded."""
    for layer in model.layers:
        if isinstance(layer, keras.Model):
            yield from _leaf_layers(layer)
        else:
            yield layer


def count_params_keras(model: keras.Model) -> int:
    """Every weight, trainable or not (BatchNorm moving statistics included)."""
    return int(sum(np.prod(w.shape) for w in model.weights))


def count_trainable_keras(model: keras.Model) -> int:
    """Trainable weights only."""
    return int(sum(np.prod(w.shape) for w in model.trainable_weights))


def count_flops_keras(model: keras.Model) -> int:
    """Forward FLOPs per sample: 2 x multiply-adds of Conv2D and Dense layers (bias ignored)."""
    flops = 0
    for layer in _leaf_layers(model):
        if isinstance(layer, keras.layers.Conv2D):
            kh, kw, cin, cout = layer.kernel.shape
            out = layer.output.shape
            hw = out[1] * out[2] if layer.data_format == "channels_last" else out[2] * out[3]
            flops += 2 * kh * kw * cin * cout * hw
        elif isinstance(layer, keras.layers.Dense):
            cin, cout = layer.kernel.shape
            flops += 2 * cin * cout
    return int(flops)


def _named_variables(model: keras.Model) -> Iterator[tuple[str, keras.Variable]]:
    """("<layer name>/<variable name>", variable) for every weight, e.g. "conv/kernel"."""
    for layer in _leaf_layers(model):
        for var in layer.weights:
            yield f"{layer.name}/{var.name.split('/')[-1]}", var


def get_canonical_weights(model: keras.Model) -> dict[str, np.ndarray]:
    """Weights as {"<layer>/<kernel|bias>": array} (Keras layout: HWIO kernels)."""
    return {key: np.array(var.numpy()) for key, var in _named_variables(model)}


def set_canonical_weights(model: keras.Model, weights: dict[str, np.ndarray]) -> None:
    """Assign weights named as get_canonical_weights names them; each must match one variable."""
    unused = set(weights)
    for key, var in _named_variables(model):
        if key in weights:
            value = np.asarray(weights[key])
            if tuple(value.shape) != tuple(var.shape):
                raise ValueError(f"{key}: shape {value.shape}, model has {tuple(var.shape)}")
            var.assign(value.astype(var.dtype))
            unused.discard(key)
    if unused:
        raise KeyError(f"weights not in the model: {sorted(unused)}")


FLOPS_SOURCES = {
    "jax": "XLA cost analysis of the jitted forward (Keras stateless_call, inference, a batch "
           "of 1): a dot or a conv 2 x its multiply-adds, plus the element-wise ops",
    "torch": "torch.utils.flop_counter.FlopCounterMode over the Keras model's forward "
             "(inference, a batch of 1): matmuls, convs and attention, 2 x multiply-adds",
    "tensorflow": "TensorFlow profiler float_operation over the traced forward (tf.function, "
                  "inference, a batch of 1): the ops with registered FLOP statistics",
}


def sample_shape(model: keras.Model, model_spec: ModelSpec, batch: int
                 ) -> tuple[tuple[int, ...], str]:
    """(shape, dtype) of a batch of the model's input: its own keras.Input where it has one
    (a functional model, in its own layout), else the spec's (token ids int32 (B, T), images
    float32 (B, H, W, C))."""
    try:
        inputs = model.inputs  # a functional or Sequential model's keras.Input
    except (AttributeError, ValueError):
        inputs = None
    if inputs and len(inputs) == 1 and all(d is not None for d in inputs[0].shape[1:]):
        return (batch, *inputs[0].shape[1:]), str(inputs[0].dtype)
    if model_spec.input_kind == "tokens":
        return (batch, *model_spec.input_shape), "int32"
    return (batch, *model_spec.input_shape), "float32"


def sample_batch(model: keras.Model, model_spec: ModelSpec, batch: int) -> np.ndarray:
    """A batch of the model's input: token ids in [0, vocab), or random images."""
    shape, dtype = sample_shape(model, model_spec, batch)
    rng = np.random.default_rng(0)
    if "int" in dtype:
        return rng.integers(0, model_spec.num_classes, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _flops_jax(model: keras.Model, shape: tuple[int, ...], dtype: str) -> int:
    """XLA's cost analysis of the forward, traced on abstract values (no device memory and no
    sharding: the count is the whole batch's, whatever distribution holds the variables)."""
    import jax

    def struct(v: Any) -> Any:
        return jax.ShapeDtypeStruct(tuple(v.shape), v.dtype)

    def forward(trainable: Any, non_trainable: Any, x: Any) -> Any:
        return model.stateless_call(trainable, non_trainable, x, training=False)[0]

    lowered = jax.jit(forward).lower([struct(v) for v in model.trainable_variables],
                                     [struct(v) for v in model.non_trainable_variables],
                                     jax.ShapeDtypeStruct(shape, dtype))
    cost = lowered.compile().cost_analysis()
    if isinstance(cost, (list, tuple)):  # older jax: one dict per program
        cost = cost[0]
    return int(cost["flops"])


def _flops_torch(model: keras.Model, x: np.ndarray) -> int:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from models.torch_common import cpu_attention_flops

    inputs = keras.ops.convert_to_tensor(x)
    with torch.no_grad(), FlopCounterMode(display=False,
                                          custom_mapping=cpu_attention_flops()) as counter:
        model(inputs, training=False)
    return int(counter.get_total_flops())


def _flops_tensorflow(model: keras.Model, shape: tuple[int, ...], dtype: str) -> int:
    import tensorflow as tf

    forward = tf.function(lambda x: model(x, training=False))
    graph = forward.get_concrete_function(tf.TensorSpec(shape, dtype)).graph
    options = (tf.compat.v1.profiler.ProfileOptionBuilder(
        tf.compat.v1.profiler.ProfileOptionBuilder.float_operation()).with_empty_output().build())
    info = tf.compat.v1.profiler.profile(graph=graph, run_meta=tf.compat.v1.RunMetadata(),
                                         cmd="op", options=options)
    return int(info.total_float_ops)


def describe(model: Any, model_spec: ModelSpec) -> dict[str, Any]:
    """What Keras and its backend say of a Keras model (a built-in's or a user's): params
    (every weight, as count_params_keras; the model is built by a forward pass first),
    trainable_params, flops_per_sample (forward, one sample) counted by the backend framework
    (FLOPS_SOURCES: XLA cost analysis on jax, FlopCounterMode on torch, the TF profiler on
    tensorflow; count_flops_keras counts Conv2D and Dense only, so not an arbitrary model's),
    flops_source, and output_shape for a batch of 2. CustomModelError when `model` is not a
    keras.Model or its forward pass fails on the declared input."""
    from models.custom import CustomModelError, not_a_model_of

    if not isinstance(model, keras.Model):
        raise not_a_model_of(model_spec, model, "a keras.Model")
    backend = keras.backend.backend()
    if backend not in FLOPS_SOURCES:
        raise CustomModelError(f"models: {model_spec.name}: no FLOP counter for the Keras "
                               f"backend {backend}")
    what = "token ids" if model_spec.input_kind == "tokens" else "images"
    try:
        out = model(sample_batch(model, model_spec, 2), training=False)
        shape, dtype = sample_shape(model, model_spec, 1)
        if backend == "jax":
            flops = _flops_jax(model, shape, dtype)
        elif backend == "torch":
            flops = _flops_torch(model, sample_batch(model, model_spec, 1))
        else:
            flops = _flops_tensorflow(model, shape, dtype)
    except Exception as exc:  # a user's forward pass: say which and why, in one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise CustomModelError(f"models: {model_spec.name}: the forward pass of a batch of "
                               f"{what} failed: {type(exc).__name__}: {first}") from exc
    if isinstance(out, (list, tuple, dict)) or not hasattr(out, "shape"):
        raise CustomModelError(f"models: {model_spec.name}: the model returned "
                               f"{type(out).__module__}.{type(out).__qualname__}, not a "
                               "tensor of logits")
    return {"params": count_params_keras(model), "trainable_params": count_trainable_keras(model),
            "flops_per_sample": flops, "flops_source": f"{backend}: {FLOPS_SOURCES[backend]}",
            "output_shape": [int(d) for d in out.shape]}


def build_run_model(run: Any, model_spec: ModelSpec, **kwargs: Any
                    ) -> tuple[keras.Model, dict[str, Any] | None]:
    """(the run's Keras model, its description or None): models.build_for(run, "keras",
    **kwargs) (a built-in given kwargs such as data_format; a user's model built from its
    entry), a user's model checked to be a keras.Model whose output for a batch of 2 is the
    entry's logits, and described (describe: built by that forward pass, its FLOPs counted).
    CustomModelError when a user's model is wrong (the runner makes it Invalid)."""
    from models import build_for
    from models.custom import check_output, not_a_model

    model = build_for(run, "keras", **kwargs)
    entry = getattr(run, "custom_model", None)
    if not entry:
        return model, None
    if not isinstance(model, keras.Model):
        raise not_a_model(entry, model, "a keras.Model")
    described = describe(model, model_spec)
    check_output(entry, model_spec, tuple(described["output_shape"]), 2)
    return model, described


def model_record(model: keras.Model, model_spec: ModelSpec,
                 described: dict[str, Any] | None = None) -> dict[str, Any]:
    """The result's model fields (models.model_fields): params counted by Keras; a built-in
    CNN's FLOPs over its Conv2D and Dense layers, a built-in transformer's the spec's standard
    count, a user's model's by the backend (`described`, or describe)."""
    return model_fields(model_spec, lambda: count_params_keras(model),
                        lambda: count_flops_keras(model),
                        lambda: described or describe(model, model_spec))


def loss_for(model_spec: ModelSpec) -> Any:
    """The loss fit trains on: the built-in CNNs end in a float32 softmax (cross-entropy on
    probabilities, as before); the transformers and a user's model return logits, class logits
    (B, classes) or next-token logits (B, T, V) with targets (B, T): Keras' sparse
    cross-entropy from logits, the mean over every row (every B x T position)."""
    if model_spec.workload == "cnn":
        return "sparse_categorical_crossentropy"
    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def has_batchnorm(model: keras.Model) -> bool:
    """Whether any layer of the model (nested models included) is a BatchNormalization."""
    return any(isinstance(layer, keras.layers.BatchNormalization)
               for layer in model._flatten_layers(include_self=False))
