"""How mode converge scores a configuration's repeats, as MLPerf Training does
(mlcommons/training_policies, training_rules.adoc, "Benchmark Results" and "Reference
Convergence Points"): the time to target of 5 or more runs is the mean with the fastest and
slowest dropped, one run short of the target counting as the slowest (two or more: no score);
fewer runs give the median with its interval, as before. Epochs to target of an N-device
configuration are tested against the 1-device one's with a one-sided Mann-Whitney U test
(bench/analysis/rank_test.py), a run short of the target counting as max_epochs + 1 epochs.
What differs from MLPerf: its check asks whether a submission converges significantly *faster*
than the reference (a t-test); ours asks whether more devices needed significantly *more*
epochs, rank-based, as integer epoch counts with ties and unreached runs are not normal.
Energy to target is the telemetry's GPU energy (NVML) of the same runs, scored alike.

Stdlib only."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.analysis.rank_test import LEVEL, one_sided_u_test

MLPERF_MIN_RUNS = 5
MLPERF_MEAN, MEDIAN, NO_SCORE = "MLPerf mean", "median", "none"
MORE_EPOCHS = "MORE-EPOCHS"
SEEDS_REPEAT = "SEEDS-REPEAT"


@dataclass(frozen=True)
class Score:
    """A configuration's headline over its runs: value (None when there is none), kind
    (MLPERF_MEAN, MEDIAN or NO_SCORE), the runs scored, the indices of the runs the value
    used, and why there is none."""

    value: float | None
    kind: str
    runs: int
    kept: tuple[int, ...]
    why: str | None = None

    def words(self) -> str:
        """'MLPerf mean of 3 of 5, fastest and slowest dropped', 'median of 2', ..."""
        if self.kind == MLPERF_MEAN:
            return (f"MLPerf mean of {len(self.kept)} of {self.runs}, fastest and slowest "
                    "dropped")
        if self.kind == MEDIAN:
            return f"median of {len(self.kept)}"
        return self.why or "no score"


def score(values: Sequence[float | None]) -> Score:
    """The headline of runs' values (time or energy to target; None: the run did not reach
    the target). From MLPERF_MIN_RUNS runs: the mean less the lowest and highest, a single
    unreached run counting as the highest, two or more making no score (MLPerf: invalid).
    Fewer: the median of the reached runs."""
    reached = sorted((i for i, v in enumerate(values) if v is not None), key=values.__getitem__)
    missing = len(values) - len(reached)
    if len(values) < MLPERF_MIN_RUNS:
        kept = tuple(reached)
        value = statistics.median([values[i] for i in kept]) if kept else None
        return Score(value, MEDIAN if kept else NO_SCORE, len(values), kept,
                     None if kept else "no run reached the target")
    if missing > 1:
        return Score(None, NO_SCORE, len(values), (),
                     f"{missing} of {len(values)} runs did not reach the target (MLPerf: a "
                     "result with more than one such run is invalid)")
    kept = tuple(reached[1:] if missing else reached[1:-1])
    return Score(statistics.fmean(values[i] for i in kept), MLPERF_MEAN, len(values), kept)


def energy_to_target(runs: Sequence[Mapping[str, Any]], time: Score) -> tuple[float | None, str]:
    """The GPUs' energy to target (J) of the runs `time` kept, by its rule (the mean or the
    median), from each record's telemetry.energy_j (NVML power over the converge window, which
    ends at the evaluation that reached the target); None and why where a run has none."""
    energies = [((r.get("telemetry") or {}).get("energy_j")) for r in runs]
    kept = [energies[i] for i in time.kept]
    if not kept:
        return None, "no run reached the target"
    if any(not isinstance(e, (int, float)) for e in kept):
        tele = next((r.get("telemetry") for r in runs if r.get("telemetry")), None) or {}
        why = tele.get("note") or (tele.get("nvml") or {}).get("reason") or "no telemetry"
        return None, f"not measured ({why})"
    value = statistics.fmean(kept) if time.kind == MLPERF_MEAN else statistics.median(kept)
    return value, "measured"


def run_seed(rec: Mapping[str, Any]) -> Any:
    """The seed the run trained with: the child's resolved recipe (result.converge, the seed
    train_to_accuracy and the runner's framework RNG used), else the spec's."""
    used = ((rec.get("result") or {}).get("converge") or {}).get("seed")
    return used if used is not None else (rec.get("converge") or {}).get("seed")


def epochs_needed(runs: Sequence[Mapping[str, Any]], max_epochs: int) -> list[int]:
    """Epochs to target per run, a run that did not reach it counting as max_epochs + 1: more
    than any run that did, tied with every other run that did not."""
    return [r["epochs_to_target"] if isinstance(r.get("epochs_to_target"), int)
            else max_epochs + 1 for r in runs]


def more_epochs_test(epochs: list[int], baseline: list[int]) -> dict[str, Any]:
    """Whether `epochs` (an N-device configuration's) are significantly more than `baseline`
    (the 1-device one's): the one-sided Mann-Whitney U test at LEVEL, its figures."""
    test = one_sided_u_test([float(e) for e in epochs], [float(e) for e in baseline])
    return {"epochs": epochs, "baseline_epochs": baseline, "u": test.u, "p": test.p,
            "min_p": test.min_p, "level": LEVEL, "method": test.method,
            "testable": test.testable, "more": test.significant}


def epochs_test_words(test: Mapping[str, Any]) -> str:
    """The test in words: both samples, p against the level, the verdict."""
    test_name = f"one-sided Mann-Whitney U, {test['method']}"
    both = (f"{','.join(map(str, test['epochs']))} vs 1 device's "
            f"{','.join(map(str, test['baseline_epochs']))}")
    if not test["testable"]:
        return (f"{both}: too few runs to test at {test['level']:g} ({test_name}: the "
                f"smallest p these sizes allow is {test['min_p']:.3f})")
    verdict = ("significantly more epochs" if test["more"]
               else "not significantly more epochs")
    sign = "<=" if test["more"] else ">"
    return f"{both}: {verdict} ({test_name}, p={test['p']:.3f} {sign} {test['level']:g})"
