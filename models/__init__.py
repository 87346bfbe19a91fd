"""Models: one folder per model, each a framework-free `spec.py` plus one builder per framework
(`keras_builder.py`, later `torch_builder.py`, `flax_builder.py`). A new model is a new folder.

This package imports no framework (stdlib only); builders are imported only in child processes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class ModelSpec:
    """What every framework's builder of a model must agree on."""

    name: str
    input_shape: tuple[int, int, int]  # H, W, C
    num_classes: int
    params: int  # total parameter count, BatchNorm moving statistics included
    trainable_params: int
    flops_per_sample: int  # forward pass, 2 x multiply-adds of conv and dense layers
    description: str
    # Canonical weight names and shapes (Keras layout) for models whose weights are exchanged
    # between frameworks (the probe); empty for the others.
    weights: tuple[tuple[str, tuple[int, ...]], ...] = ()


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
