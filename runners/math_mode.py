"""What "fp32" means on a GPU: `fp32` is IEEE float32 in every framework (TF32 off), `tf32` float32
storage with TF32 convolutions and matmuls. `apply(precision, device)` sets each imported
framework, `read_back()` reads the settings for the record. Why: docs/runners/shared.md."""

from __future__ import annotations

import os
import sys
from typing import Any

from contract.launch_env import STRICT, TF32, _want


class MathModeUnavailable(RuntimeError):
    """tf32 asked for where there are no TF32 tensor cores."""


def apply(precision: str, device: str) -> None:
    """Set the float32 math of every imported framework for this precision."""
    want = _want(precision)
    if want is None:
        return
    if want == TF32 and device != "gpu":
        raise MathModeUnavailable("tf32 is NVIDIA GPU tensor-core math (Ampere and newer); "
                                  "a CPU computes float32 in IEEE: use fp32")
    for name, set_math in (("torch", _torch), ("jax", _jax), ("tensorflow", _tf)):
        if name in sys.modules:
            set_math(want, device)


def _torch(want: str, device: str) -> None:
    import torch

    if want == TF32 and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(0)
        if major < 8:
            raise MathModeUnavailable(f"tf32: {torch.cuda.get_device_name(0)} (compute "
                                      f"capability {major}.{minor}) has no TF32 tensor cores")
    if hasattr(torch.backends.cudnn, "conv"):  # torch 2.9+: mixing in the old flags is an error
        torch.backends.cuda.matmul.fp32_precision = want
        torch.backends.cudnn.conv.fp32_precision = want
    else:
        torch.backends.cuda.matmul.allow_tf32 = want == TF32
        torch.backends.cudnn.allow_tf32 = want == TF32


def _jax(want: str, device: str) -> None:
    import jax

    if want == TF32 and device == "gpu":
        for dev in jax.devices("gpu")[:1]:
            capability = getattr(dev, "compute_capability", None)
            if capability and float(capability) < 8.0:
                raise MathModeUnavailable(f"tf32: {dev.device_kind} (compute capability "
                                          f"{capability}) has no TF32 tensor cores")
    # the default precision of dot_general and conv_general_dilated on float32 operands
    jax.config.update("jax_default_matmul_precision",
                      "tensorfloat32" if want == TF32 else "highest")


def _tf(want: str, device: str) -> None:
    import tensorflow as tf

    tf.config.experimental.enable_tensor_float_32_execution(want == TF32)


def read_back() -> dict[str, Any] | None:
    """The float32 math each imported framework is set to now, as it reports it."""
    found: dict[str, Any] = {}
    if "torch" in sys.modules:
        import torch

        if hasattr(torch.backends.cudnn, "conv"):
            # "none": not set, so the global default (IEEE for matmuls, TF32 for cuDNN convs)
            found["torch"] = {
                "matmul": torch.backends.cuda.matmul.fp32_precision,
                "conv": torch.backends.cudnn.conv.fp32_precision,
                "source": "torch.backends.cuda.matmul.fp32_precision, "
                          "torch.backends.cudnn.conv.fp32_precision"}
        else:
            found["torch"] = {
                "matmul": TF32 if torch.backends.cuda.matmul.allow_tf32 else STRICT,
                "conv": TF32 if torch.backends.cudnn.allow_tf32 else STRICT,
                "source": "torch.backends.cuda.matmul.allow_tf32, "
                          "torch.backends.cudnn.allow_tf32"}
    if "jax" in sys.modules:
        import jax

        setting = jax.config.jax_default_matmul_precision
        found["jax"] = {
            "matmul_and_conv": {None: "default", "highest": STRICT, "float32": STRICT,
                                "tensorfloat32": TF32, "high": TF32}.get(setting, str(setting)),
            "source": f"jax.config.jax_default_matmul_precision={setting!r}"}
    if "tensorflow" in sys.modules:
        import tensorflow as tf

        enabled = tf.config.experimental.tensor_float_32_execution_enabled()
        found["tensorflow"] = {"matmul_and_conv": TF32 if enabled else STRICT,
                               "source": "tf.config.experimental."
                                         "tensor_float_32_execution_enabled()"}
    if not found:
        return None
    found["NVIDIA_TF32_OVERRIDE"] = os.environ.get("NVIDIA_TF32_OVERRIDE")
    return found
