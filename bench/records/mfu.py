"""Model FLOPs utilisation: the training FLOP/s a run achieved over the devices' measured peak,
and the rules a measured peak is judged by (its trials' agreement, a peak implausibly low).

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


# The matmul probe's trials agree when the third-best is within 5% of the best: a peak, not
# one lucky or one slowed trial (docs/RESULTS.md, "A peak that is a peak").
AGREE = 0.05
# A peak under 1/20 of the machine's best on its device type and precision is no peak of that
# device: the widest gap between two agreeing, uncontended probes on one host was 10x (MXNet's
# dot 28 against TensorFlow's 282 GFLOP/s), the loaded ones that slipped through were 40-46x.
IMPLAUSIBLY_LOW = 20
# what a record keeps of each peak its MFU was taken against
PEAK_FIELDS = ("status", "reason", "peak_flops", "device_type", "precision", "dtype", "family",
               "framework", "framework_version", "device_name", "n", "measured_at",
               "cache_path", "spread", "not_cached", "implausible")


def spread(trials: list[float]) -> float:
    """How far the third-best trial fell below the best, as a share of the best (1.0 when
    there is no positive trial)."""
    best = sorted(trials, reverse=True)[:3]
    return (best[0] - best[-1]) / best[0] if best and best[0] > 0 else 1.0


def implausibly_low(peak: dict[str, Any], best: dict[str, Any] | None) -> str | None:
    """Why an ok peak is no peak of its device (under 1/IMPLAUSIBLY_LOW of the machine's
    best, `best`, on its device type and precision), or None."""
    best = best or {}
    own, top = peak.get("peak_flops"), best.get("peak_flops")
    if peak.get("status") != "ok" or not own or not top or own * IMPLAUSIBLY_LOW >= top:
        return None
    return (f"{own / 1e9:.3g} GFLOP/s is under 1/{IMPLAUSIBLY_LOW} of the machine's best "
            f"({best.get('family')}'s {top / 1e9:.3g} GFLOP/s): measured under load, or "
            "without the device's fast kernels")


def peak_fields(peak: dict[str, Any]) -> dict[str, Any]:
    """What a record keeps of a peak its MFU was taken against."""
    return {k: peak.get(k) for k in PEAK_FIELDS}
