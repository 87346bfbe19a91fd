"""The one-sided Mann-Whitney U test, exact, in plain Python: whether one sample's values are
stochastically larger than another's (mode converge asks it of epochs to target: did N devices
need more epochs than 1?). Exact: the p-value is the share of all ways to split the pooled
values into groups of the two sizes whose U is at least the observed one (the permutation
distribution of U, so ties, common among integer epoch counts, are handled exactly: a tie
counts one half). Splits beyond EXACT_LIMIT are drawn at random (a seeded generator) instead
of enumerated.

Stdlib only."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

LEVEL = 0.05  # one-sided
EXACT_LIMIT = 200_000  # splits enumerated; above it RESAMPLES random ones
RESAMPLES = 20_000


@dataclass(frozen=True)
class RankTest:
    """The test of `larger` against `smaller`: U (pairs where larger's value is the greater,
    ties one half), its p-value, the smallest p-value these sample sizes allow (a test that
    cannot reach LEVEL is not testable), and how p was found (exact or resampled)."""

    u: float
    p: float
    min_p: float
    method: str

    @property
    def testable(self) -> bool:
        return self.min_p <= LEVEL

    @property
    def significant(self) -> bool:
        return self.testable and self.p <= LEVEL


def u_statistic(larger: list[float], smaller: list[float]) -> float:
    """Mann-Whitney U of `larger` over `smaller`: pairs (x, y) with x > y, plus half the ties."""
    return sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in larger for y in smaller)


def midranks(values: list[float]) -> list[float]:
    """Each value's rank among `values` from 1, tied values sharing their ranks' mean."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for i in order[start:end + 1]:
            ranks[i] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def one_sided_u_test(larger: list[float], smaller: list[float]) -> RankTest:
    """Whether `larger` tends to exceed `smaller`: p = P(U >= observed U) over the splits of
    the pooled values into groups of len(larger) and len(smaller) (U of a group is its
    midrank sum less n(n+1)/2, so the splits are compared by their rank sums)."""
    if not larger or not smaller:
        raise ValueError("both samples need at least one value")
    pooled = [*larger, *smaller]
    ranks = midranks(pooled)
    n, total = len(larger), math.comb(len(pooled), len(larger))
    observed = sum(ranks[:n])
    if total <= EXACT_LIMIT:
        splits: Iterable[Sequence[int]] = itertools.combinations(range(len(pooled)), n)
        method, count, at_least = "exact", total, 0
    else:
        rng = random.Random(0)
        splits = (rng.sample(range(len(pooled)), n) for _ in range(RESAMPLES))
        method, count, at_least = f"{RESAMPLES} random splits", RESAMPLES + 1, 1
    for chosen in splits:
        at_least += sum(ranks[i] for i in chosen) >= observed - 1e-9
    return RankTest(u=observed - n * (n + 1) / 2, p=at_least / count, min_p=1 / total,
                    method=method)
