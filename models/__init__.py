"""Models: one folder per model, each a framework-free `spec.py` plus one builder per framework
(`keras_builder.py`, `torch_builder.py`, `flax_builder.py`, `gluon_builder.py`,
`tfv1_builder.py`). A new model is a new folder; a user's own model is a `models:` entry of the
sweep file (models/custom.py).

This package imports no framework (stdlib only); builders are imported only in child processes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class ModelSpec:
    """What every framework's builder of a model must agree on."""

    name: str
    input_shape: tuple[int, ...]  # image: H, W, C; tokens: (sequence length,)
    num_classes: int  # image: classes; tokens: the vocabulary (next-token logits)
    params: int  # total parameter count, BatchNorm moving statistics included
    trainable_params: int
    flops_per_sample: int  # forward pass, 2 x multiply-adds of conv and dense layers
    description: str
    # Canonical weight names and shapes (Keras layout) for models whose weights are exchanged
    # between frameworks (the probe); empty for the others.
    weights: tuple[tuple[str, tuple[int, ...]], ...] = ()
    # "image": a float image in, class logits out; "tokens": int token ids (batch, seq) in,
    # next-token logits (batch, seq, vocab) out, trained on the inputs shifted by one.
    input_kind: str = "image"
    # "cnn" (the 2017 convolutional models), "transformer" or "custom" (a user's model): the
    # runners say which they take (RunnerInfo.workloads).
    workload: str = "cnn"
    # How flops_per_sample was counted, shown beside MFU.
    flops_source: str = "2 x multiply-adds of the conv and dense layers (forward)"
    # The transformer's dimensions (models/transformer.py), None for the others.
    transformer: Any = None
    # A user's model: its entry's build ("module:function"), "" for the built-in models.
    build: str = ""

    @property
    def tokens_per_sample(self) -> int | None:
        """Tokens one sample trains on (its sequence length), None for images."""
        return self.input_shape[0] if self.input_kind == "tokens" else None


def cnn_spec(name: str, input_shape: tuple[int, int, int], num_classes: int, *,
             trainable_params: int, bn_channels: int, flops_per_sample: int,
             description: str) -> ModelSpec:
    """The ModelSpec of a built-in CNN (an image in, class logits out): params counts the
    trainable parameters plus BatchNorm's moving mean and variance of each of its `bn_channels`
    channels, as Keras' count_params() does (torch's parameters() leaves them out)."""
    return ModelSpec(name=name, input_shape=input_shape, num_classes=num_classes,
                     params=trainable_params + 2 * bn_channels,
                     trainable_params=trainable_params, flops_per_sample=flops_per_sample,
                     description=description)


def available_models() -> list[str]:
    """Names of the sub-folders of models/ that hold a spec.py, sorted."""
    return sorted(p.parent.name for p in HERE.glob("*/spec.py"))


def get_spec(name: str) -> ModelSpec:
    """The module-level SPEC of models/<name>/spec.py; KeyError for an unknown name."""
    known = available_models()
    if name not in known:
        raise KeyError(f"unknown model {name!r}; known models: {', '.join(known)} "
                       f"(a model is a folder models/<name>/ with a spec.py)")
    return importlib.import_module(f"models.{name}.spec").SPEC


def load_builder(name: str, framework: str) -> Callable[..., Any]:
    """The `build` function of models/<name>/<framework>_builder.py (child processes only)."""
    return importlib.import_module(f"models.{name}.{framework}_builder").build


# The builder a framework's runner asks for, by the framework a user's model is written in
# (a `models:` entry's framework): a jax model is a flax.linen Module, tf and keras models are
# Keras models, an mxnet one a Gluon block.
BUILDER_KIND = {"torch": "torch", "jax": "flax", "keras": "keras", "tf": "keras",
                "mxnet": "gluon"}


def spec_of(run: Any) -> ModelSpec:
    """The ModelSpec of a run (a runners.common.Spec): its built-in model's, or its
    `custom_model` entry's (models/custom.py; parameters and FLOPs 0 until the framework
    counts them in the run)."""
    entry = getattr(run, "custom_model", None)
    if entry:
        from models.custom import model_spec
        return model_spec(entry)
    return with_layers(get_spec(run.model), getattr(run, "model_layers", None))


def with_layers(model: ModelSpec, layers: int | None) -> ModelSpec:
    """The variant of a built-in GPT with `layers` blocks (the run's `model_layers`, capacity
    mode's scale: depth): its TransformerShape with the layers replaced, so every framework's
    builder builds it and its parameter and FLOP counts follow; the model itself for None.
    ValueError for a model that is no built-in GPT."""
    if layers is None:
        return model
    shape = model.transformer
    if shape is None or shape.kind != "gpt":
        raise ValueError(f"model_layers: {model.name} is not a GPT of models/ (depth variants: "
                         "the built-in gpt models)")
    if layers < 1:
        raise ValueError(f"model_layers: {layers} is not allowed; allowed: an integer >= 1")
    from models.transformer import transformer_spec  # it imports this module
    return transformer_spec(model.name, replace(shape, layers=layers),
                            f"{model.description}; here with {layers} layers (model_layers)")


def build_for(run: Any, kind: str, **kwargs: Any) -> Any:
    """The run's model object from the `kind` builder ("torch", "flax", "keras", "gluon",
    "tfv1"): the built-in model's builder called with its spec (spec_of: the run's depth variant
    where it sets model_layers) and kwargs (data_format...), or
    the user's build function called with the entry's args (kwargs the runner would give a
    built-in builder are not passed to it: the user's model has its own layout)."""
    entry = getattr(run, "custom_model", None)
    if entry:
        from models.custom import build, wrong_kind
        if BUILDER_KIND[entry["framework"]] != kind:
            raise wrong_kind(entry, kind)
        return build(entry)
    return load_builder(run.model, kind)(spec_of(run), **kwargs)


def model_fields(model_spec: ModelSpec, params: Callable[[], int], cnn_flops: Callable[[], int],
                 described: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A run's model fields, one rule for every framework: parameters and forward FLOPs per
    sample with how they were counted, the tokens a sample trains on (None for images) and the
    workload. A user's model: all from the framework's describe() (`described`); a built-in
    transformer: the framework's `params()` and the spec's standard count; a built-in CNN: the
    framework's `params()` and its conv and dense layers' count (`cnn_flops()`)."""
    if model_spec.workload == "custom":
        d = described()
        count, flops, source = d["params"], d["flops_per_sample"], d["flops_source"]
    elif model_spec.workload == "transformer":
        count, flops, source = params(), model_spec.flops_per_sample, model_spec.flops_source
    else:
        count, flops, source = params(), cnn_flops(), model_spec.flops_source
    return {"params": int(count), "flops_per_sample": int(flops), "flops_source": source,
            "tokens_per_sample": model_spec.tokens_per_sample, "workload": model_spec.workload}
