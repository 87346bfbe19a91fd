"""How far a figure can be trusted: bootstrap intervals over repeats, the throughput estimators
side by side, and the flags for stalls and a warm-up that had not settled.

Plain Python (the parent's statistics; no framework, no numpy needed)."""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any

BOOTSTRAP_SAMPLES = 2000
CONFIDENCE = 0.95
# The estimators of one run's throughput disagree by more than this when some steps stalled.
ESTIMATOR_TOLERANCE = 0.02
# The first of WARMUP_WINDOWS equal slices of the timed steps is "much slower" than the rest
# below this fraction of their median rate: the warm-up had not reached steady state.
WARMUP_WINDOWS = 5
STEADY_RATIO = 0.9
# Under 2 x WARMUP_WINDOWS steps (at least SHORT_WINDOW_STEPS), a slice is one step, so one
# step's noise: the first step is "much slower" below SHORT_STEADY_RATIO of the median rate of
# the others (it took over twice their median: a compile or a cold cache, not a busy host).
SHORT_WINDOW_STEPS = 3
SHORT_STEADY_RATIO = 0.5


def quantile(sorted_values: list[float], q: float) -> float:
    """Linear-interpolated quantile of already sorted values."""
    pos = q * (len(sorted_values) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def bootstrap_ci(values: Sequence[float], stat: Callable[[Sequence[float]], float] =
                 statistics.median, samples: int = BOOTSTRAP_SAMPLES,
                 level: float = CONFIDENCE, seed: int = 0) -> tuple[float | None, float | None]:
    """Percentile bootstrap interval of stat(values); (None, None) under two values."""
    if len(values) < 2:
        return None, None
    rng = random.Random(seed)
    stats = sorted(stat(rng.choices(values, k=len(values))) for _ in range(samples))
    tail = (1 - level) / 2
    return quantile(stats, tail), quantile(stats, 1 - tail)


def ratio_ci(numerator: Sequence[float], denominator: Sequence[float],
             samples: int = BOOTSTRAP_SAMPLES, level: float = CONFIDENCE,
             seed: int = 0) -> tuple[float | None, float | None]:
    """Bootstrap interval of median(numerator) / median(denominator), each resampled on its
    own (independent runs); (None, None) unless both sides have two values or more."""
    if len(numerator) < 2 or len(denominator) < 2:
        return None, None
    rng = random.Random(seed)
    ratios = sorted(statistics.median(rng.choices(numerator, k=len(numerator)))
                    / statistics.median(rng.choices(denominator, k=len(denominator)))
                    for _ in range(samples))
    tail = (1 - level) / 2
    return quantile(ratios, tail), quantile(ratios, 1 - tail)


def coefficient_of_variation(values: Sequence[float]) -> float | None:
    """Sample standard deviation over the mean; None under two values."""
    if len(values) < 2 or not statistics.fmean(values):
        return None
    return statistics.stdev(values) / statistics.fmean(values)


def estimators(step_times: Sequence[float], batch: int) -> dict[str, Any]:
    """One run's throughput three ways. total_over_time is the headline (every image over the
    whole window). The mean of per-step rates weights a fast step like a slow one, so it runs
    above the headline when some steps stall; the harmonic mean of per-step rates equals the
    headline when every step has the same batch, and is kept as the check of that."""
    times = [t for t in step_times if t > 0]
    if not times:
        return {"total_over_time": None, "mean_step_rate": None, "harmonic_mean_rate": None,
                "estimators_disagree": None}
    rates = [batch / t for t in times]
    total = batch * len(times) / sum(times)
    mean_rate = statistics.fmean(rates)
    harmonic = statistics.harmonic_mean(rates)
    spread = max(abs(mean_rate - total), abs(harmonic - total)) / total
    return {"total_over_time": total, "mean_step_rate": mean_rate,
            "harmonic_mean_rate": harmonic, "estimators_disagree": spread > ESTIMATOR_TOLERANCE}


def warmup_not_steady(step_times: Sequence[float], windows: int = WARMUP_WINDOWS,
                      ratio: float = STEADY_RATIO) -> bool | None:
    """True when the first of `windows` equal slices of the timed steps ran below `ratio` of
    the median rate of the other slices; under 2 x `windows` steps, when the first step ran
    below SHORT_STEADY_RATIO of the median rate of the other steps; None under
    SHORT_WINDOW_STEPS steps or with a step time not above 0."""
    times = list(step_times)
    if len(times) < SHORT_WINDOW_STEPS:
        return None
    if len(times) < 2 * windows:
        windows, ratio = len(times), SHORT_STEADY_RATIO
    size = len(times) // windows
    if min(times) <= 0:
        return None
    rates = [size / sum(times[i * size:(i + 1) * size]) for i in range(windows)]
    return rates[0] < ratio * statistics.median(rates[1:])


# -- impossible and implausible figures (docs/RESULTS.md "Impossible and implausible results")

# How far a speedup may exceed the device count before it is flagged impossible: each device's
# share of the batch can fit a faster cache level and give slight superlinearity; more than
# this on N devices is a baseline that ran slow or runs that did different work.
SUPERLINEAR_ALLOWANCE = 0.05
# The flags of a 1-device row that make it no baseline: its figure is not the device's own.
BASELINE_DOUBTS = ("contended", "unstable")


def speedup_impossible(spd: float | None, num_devices: int,
                       baseline_devices: int = 1) -> bool | None:
    """True when a speedup exceeds the device ratio by more than SUPERLINEAR_ALLOWANCE (its
    efficiency is over 100% by as much); None without a speedup."""
    if spd is None:
        return None
    return spd > num_devices / baseline_devices * (1 + SUPERLINEAR_ALLOWANCE)


def baseline_doubts(baseline: dict[str, Any]) -> list[str]:
    """The flags of BASELINE_DOUBTS that are on in a 1-device summary row."""
    return [key for key in BASELINE_DOUBTS if baseline.get(key)]


def compute_bound(row: dict[str, Any]) -> float | None:
    """The most samples/sec the measured peak allows (the devices' peak, x devices unless
    they share one host, over the training FLOPs per sample: bench/records/mfu.py): images/sec
    over MFU, which is that ratio; None without an MFU."""
    mfu, ips = row.get("mfu"), row.get("images_per_sec")
    return ips / mfu if mfu and ips is not None else None


def doubts(row: dict[str, Any]) -> dict[str, str]:
    """A summary row's flagged figures, each with why in a sentence: `speedup` (impossible),
    `baseline` (a contended or unstable 1-device run under its speedup), `throughput` (above
    the compute bound: MFU over 100%). Empty when nothing is flagged."""
    out = {}
    n, spd = row.get("num_devices"), row.get("speedup")
    if row.get("speedup_impossible") and spd is not None:
        out["speedup"] = (
            f"speedup {spd:.2f}x on {n} devices (efficiency {spd / n:.0%}) is above the "
            f"device count by more than {SUPERLINEAR_ALLOWANCE:.0%}: impossible, so no result; "
            "the 1-device baseline ran slower than the device can, or the runs did different "
            "work")
    if row.get("baseline_flags"):
        out["baseline"] = (
            f"its 1-device baseline was {' and '.join(str(row['baseline_flags']).split())}: "
            "the speedup and efficiency divide by a figure that is not the device's own")
    bound = compute_bound(row)
    if row.get("over_peak") and bound is not None:
        out["throughput"] = (
            f"{row['images_per_sec']:.1f} samples/s is above the compute bound of "
            f"{bound:.1f} (the devices' measured matmul peak over the training FLOPs per sample; "
            f"MFU "
            f"{row['mfu']:.0%}): the peak or the FLOP count is wrong")
    return out
