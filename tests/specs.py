"""Specs for tests and their child scripts (framework interpreters import this too: no pytest)."""

from __future__ import annotations

from typing import Any

from bench.plan.runs import RunSpec
from contract.spec import spec_for


def run_spec(**fields: Any) -> RunSpec:
    """A spec as the parent makes it (the runner's options resolved over its catalog defaults),
    with placeholder identity fields under `fields`."""
    return RunSpec(**spec_for(**fields).to_dict())
