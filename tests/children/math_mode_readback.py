"""runners.math_mode after importing the framework named in argv[1] (torch, jax or tensorflow):
the math it reports once fp32 is applied on CPU, and tf32 refused there. Prints one line
"RESULT <json>"."""

import importlib
import json
import sys

importlib.import_module(sys.argv[1])
from runners import math_mode  # noqa: E402 (after the framework, as a runner imports them)

math_mode.apply("fp32", "cpu")
strict = math_mode.read_back()
try:
    math_mode.apply("tf32", "cpu")
    refused = None
except math_mode.MathModeUnavailable as exc:
    refused = str(exc)
print("RESULT " + json.dumps({"strict": strict, "refused": refused}))
