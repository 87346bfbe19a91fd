"""The child of `run_bench.py check-model`: build one user's model (a `models:` entry, JSON in
argv[1]) in its framework's environment, count its parameters and FLOPs with the framework and
run a batch of 2 through it; print one line `CHECK <json>`: the counts and the output shape, or
{"error": one line} (models/custom.py's messages: module not found, function not found, not a
model of that framework, output shape does not match classes/vocab).

Run as `python -m models.check_custom '<entry json>'` from the repository root (the parent sets
KERAS_BACKEND for keras and tf entries).
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

from models.custom import CustomModelError, build, check_output, model_spec

# the models.<module> whose describe(model, model_spec) counts a framework's model
DESCRIBE = {"torch": "torch_common", "jax": "flax_common", "keras": "keras_common",
            "tf": "keras_common", "mxnet": "gluon_common"}


def check(entry: dict[str, Any]) -> dict[str, Any]:
    """The entry's counts and output shape, or {"error": why} in one line."""
    spec = model_spec(entry)
    name = entry["name"]
    try:
        model = build(entry)
    except CustomModelError as exc:  # not found, or the build function raised
        return {"error": str(exc)}
    try:
        info = importlib.import_module(f"models.{DESCRIBE[entry['framework']]}").describe(
            model, spec)
        check_output(entry, spec, tuple(info["output_shape"]), 2)
    except CustomModelError as exc:
        return {"error": str(exc)}
    except Exception as exc:  # the model's forward pass raised on the declared input
        return {"error": f"models: {name}: a forward pass on the declared input "
                         f"{_declared(entry)} raised {type(exc).__name__}: {_first_line(exc)}"}
    return info


def _declared(entry: dict[str, Any]) -> str:
    inp = entry["input"]
    if inp["kind"] == "tokens":
        return f"(tokens, seq_len {inp['seq_len']})"
    return f"(image, shape {inp['shape']})"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""


def main() -> int:
    entry = json.loads(sys.argv[1])
    print("CHECK " + json.dumps(check(entry)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
