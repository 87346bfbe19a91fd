"""A user's own model: a `models:` entry of the sweep file (README, "Your own model"), carried to
the child as the run's `custom_model` (the entry with its path made absolute):

    {"name": "mynet", "framework": "torch", "build": "mynets:make_model",
     "path": "/home/me/code/mynets", "args": {"width": 64},
     "input": {"kind": "image", "shape": [3, 32, 32], "classes": 10}}
    (or "input": {"kind": "tokens", "seq_len": 512, "vocab": 32000})

An image `shape` is one sample as the framework takes it: C, H, W for torch and mxnet, H, W, C
for jax, keras and tf. The harness gives the model its own data, loss (cross-entropy; next-token
cross-entropy for tokens) and optimizer; parameters and FLOPs are counted by the framework in
the run (models.<framework>_common.describe).

Stdlib only: the parent validates entries with it, the child builds them.
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from models import ModelSpec

FRAMEWORKS = ("torch", "jax", "keras", "tf", "mxnet")
CHANNELS_FIRST = ("torch", "mxnet")  # an image shape is C, H, W for these


class CustomModelError(RuntimeError):
    """A `models:` entry that cannot be built: one line saying why."""


def model_spec(entry: dict[str, Any]) -> ModelSpec:
    """The entry as a ModelSpec (input_shape H, W, C for images; (seq_len,) for tokens);
    params and flops_per_sample are 0: the framework counts them in the run."""
    inp = entry["input"]
    where = f"{entry['build']} in {entry['path']}"
    common = dict(name=entry["name"], params=0, trainable_params=0, flops_per_sample=0,
                  workload="custom", flops_source="counted by the framework in the run",
                  build=entry["build"])
    if inp["kind"] == "tokens":
        return ModelSpec(input_shape=(int(inp["seq_len"]),), num_classes=int(inp["vocab"]),
                         description=f"{entry['name']}: your {entry['framework']} model "
                                     f"({where}), tokens", input_kind="tokens", **common)
    shape = tuple(int(v) for v in inp["shape"])
    hwc = (*shape[1:], shape[0]) if entry["framework"] in CHANNELS_FIRST and len(shape) == 3 \
        else shape
    return ModelSpec(input_shape=hwc, num_classes=int(inp["classes"]),
                     description=f"{entry['name']}: your {entry['framework']} model ({where})",
                     **common)


def load(entry: dict[str, Any]) -> Callable[..., Any]:
    """The entry's build function, its folder first on sys.path; CustomModelError when the
    module or the function is not there."""
    module_name, _, func_name = entry["build"].partition(":")
    path = entry["path"]
    if path not in sys.path:
        sys.path.insert(0, path)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name.split(".")[0]) \
                and module_name.split(".")[0] == exc.name.split(".")[0]:
            raise CustomModelError(f"models: {entry['name']}: module {module_name!r} not found "
                                   f"in {path}") from None
        raise CustomModelError(f"models: {entry['name']}: importing {module_name} failed: "
                               f"{exc}{where(exc, path)}") from None
    except Exception as exc:  # a syntax error, or what the module raises as it is imported
        raise CustomModelError(f"models: {entry['name']}: importing {module_name} failed: "
                               f"{type(exc).__name__}: {_first(exc)}{where(exc, path)}"
                               ) from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise CustomModelError(f"models: {entry['name']}: function {func_name!r} not found in "
                               f"module {module_name} ({getattr(module, '__file__', path)})")
    return func


def build(entry: dict[str, Any]) -> Any:
    """The user's model object: the build function called with the entry's args; what it
    raises becomes a CustomModelError of one line (the run is invalid, not failed)."""
    func, args = load(entry), entry.get("args") or {}
    try:
        return func(**args)
    except Exception as exc:
        raise CustomModelError(f"models: {entry['name']}: {entry['build']}(**{args}) raised "
                               f"{type(exc).__name__}: {_first(exc)}"
                               f"{where(exc, entry['path'])}") from None


def _first(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:300] if lines else ""


def where(exc: BaseException, folder: str) -> str:
    """' (file.py, line N)': the user's line an exception comes from (the innermost frame in
    the model's folder; a SyntaxError's own place, which its message names already); '' when
    no frame of the folder is on the traceback."""
    if isinstance(exc, SyntaxError):
        return ""  # str(SyntaxError) ends in "(file.py, line N)"
    root = os.path.realpath(folder)
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if os.path.realpath(f.filename).startswith(root + os.sep)]
    if not frames:
        return ""
    return f" ({os.path.relpath(frames[-1].filename, root)}, line {frames[-1].lineno})"


def wrong_kind(entry: dict[str, Any], kind: str) -> CustomModelError:
    return CustomModelError(f"models: {entry['name']} is a {entry['framework']} model; this "
                            f"runner builds {kind} models")


def not_a_model_of(spec: ModelSpec, got: Any, expected: str) -> CustomModelError:
    """not_a_model for a describe(), which has the run's ModelSpec (its build) but no entry."""
    return not_a_model({"name": spec.name, "build": spec.build or "?"}, got, expected)


def not_a_model(entry: dict[str, Any], got: Any, expected: str) -> CustomModelError:
    """The build function returned something other than the framework's model object."""
    return CustomModelError(f"models: {entry['name']}: {entry['build']} returned "
                            f"{type(got).__module__}.{type(got).__qualname__}, not {expected}")


def expected_output(spec: ModelSpec, batch: int) -> tuple[int, ...]:
    """The logits' shape for a batch: (batch, classes), or (batch, seq_len, vocab)."""
    if spec.input_kind == "tokens":
        return (batch, spec.input_shape[0], spec.num_classes)
    return (batch, spec.num_classes)


def check_output(entry: dict[str, Any], spec: ModelSpec, shape: tuple[int, ...],
                 batch: int) -> None:
    """CustomModelError unless the model's output is the logits the entry declares."""
    want = expected_output(spec, batch)
    if tuple(shape) != want:
        what = (f"vocab {spec.num_classes}" if spec.input_kind == "tokens"
                else f"classes {spec.num_classes}")
        raise CustomModelError(f"models: {entry['name']}: output shape {list(shape)} for a "
                               f"batch of {batch} does not match {what} (expected "
                               f"{list(want)})")
