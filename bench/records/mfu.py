"""Model FLOPs utilisation: the training FLOP/s a run achieved over the devices' measured peak.

An MFU above 100% is impossible: the peak was measured low (under load, on another CPU) or the
model's FLOPs are overcounted. The record says so (over_peak) and the tables flag it.
"""

from __future__ import annotations

from typing import Any

# A training step costs about 3 forward passes: the forward, then a backward pass that
# computes gradients for both activations and weights (2 x forward).
TRAINING_FLOPS_FACTOR = 3


def mfu(images_per_sec: float | None, forward_flops_per_sample: int | None,
        peak_flops_per_device: float | None, num_devices: int,
        shared_device: bool) -> dict[str, Any]:
    """MFU of a run with its inputs: achieved and peak FLOP/s, training FLOPs per sample."""
    per_sample = (TRAINING_FLOPS_FACTOR * forward_flops_per_sample
                  if forward_flops_per_sample is not None else None)
    achieved = (images_per_sec * per_sample
                if images_per_sec is not None and per_sample is not None else None)
    # N virtual CPU devices share one host's cores, and the probe measured all of them at once
    peak = (peak_flops_per_device * (1 if shared_device else num_devices)
            if peak_flops_per_device is not None else None)
    ratio = achieved / peak if achieved is not None and peak is not None and peak > 0 else None
    return {"mfu": ratio, "achieved_flops": achieved, "peak_flops": peak,
            "training_flops_per_sample": per_sample,
            "over_peak": ratio > 1 if ratio is not None else None}
