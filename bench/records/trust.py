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
    the median rate of the other slices; None with too few steps to tell."""
    times = list(step_times)
    if len(times) < 2 * windows:
        return None
    size = len(times) // windows
    rates = [size / sum(times[i * size:(i + 1) * size]) for i in range(windows)]
    return rates[0] < ratio * statistics.median(rates[1:])
