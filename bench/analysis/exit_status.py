"""The sweep's exit status from its runs' statuses (`run --fail-on`, docs/CI.md): 3 when a
run ended with one of the chosen statuses, naming the runs, else 0; the baseline gate
(gate.py) decides 4 after it. Standard library only: the command line reads it before parsing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from bench.errors import ConfigError

RUNS_FAILED_EXIT = 3
FAIL_ON_DEFAULT = ("failed", "timeout", "oom", "invalid")
FAIL_ON_CHOICES = (*FAIL_ON_DEFAULT, "cancelled", "unavailable")


def parse_fail_on(text: str) -> tuple[str, ...]:
    """--fail-on's statuses (comma-separated, or none); a ConfigError naming what is allowed."""
    words = tuple(w.strip() for w in text.split(","))
    if words == ("none",):
        return ()
    bad = [w for w in words if w not in FAIL_ON_CHOICES]
    if bad or len(set(words)) != len(words):
        raise ConfigError(f"--fail-on: {text!r} is not allowed; allowed: none, or one or more "
                          f"of {', '.join(FAIL_ON_CHOICES)} separated by commas, each once "
                          f"(default {','.join(FAIL_ON_DEFAULT)})")
    return words


def runs_exit(records: Sequence[dict[str, Any]], fail_on: Sequence[str]) -> tuple[int, str]:
    """The sweep's exit status from its records' statuses: RUNS_FAILED_EXIT when any run's
    status is one of `fail_on`, naming them; 0 otherwise. The line says which decided."""
    tally = Counter(str(r.get("status")) for r in records)
    shown = ", ".join(f"{n} {s}" for s, n in sorted(tally.items(), key=lambda t: -t[1]))
    rule = f"--fail-on {','.join(fail_on) or 'none'}"
    failing = sorted(str(r.get("run_id")) for r in records if r.get("status") in fail_on)
    if not failing:
        return 0, f"runs: {shown or 'none recorded'}; none counts as a failure ({rule})"
    named = "; ".join(failing[:5]) + (f"; and {len(failing) - 5} more" if len(failing) > 5
                                     else "")
    return RUNS_FAILED_EXIT, f"runs: {shown}; failing ({rule}): {named}"
