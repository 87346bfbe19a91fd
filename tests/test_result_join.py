"""A runner's result parts are joined by contract.result.join: a field given by two parts fails
at once, naming it; and runners.converge.stepwise runs a runner's step over an epoch's batches
with the recipe's rate per step."""

from __future__ import annotations

import numpy as np
import pytest

from contract.result import FieldClash, join
from runners.converge import Batch, stepwise


def test_join_keeps_every_field_of_disjoint_parts() -> None:
    assert join({"a": 1}, {"b": [2]}, {}) == {"a": 1, "b": [2]}


def test_a_field_given_twice_fails_naming_it() -> None:
    with pytest.raises(FieldClash, match=r"\['images_per_sec'\]"):
        join({"images_per_sec": 1.0, "x": 1}, {"y": 2}, {"images_per_sec": 2.0})


def test_stepwise_gives_each_step_its_rate_and_averages_the_losses() -> None:
    seen: list[tuple[int, float, int]] = []

    def step(batch: Batch, lr: float, epoch: int) -> float:
        seen.append((int(batch.x[0, 0]), lr, epoch))
        return float(batch.x[0, 0])

    batches = [Batch(np.full((1, 1), i, np.float32), np.zeros(1, np.int64), 1) for i in (1, 3)]
    loss = stepwise(step)(4, batches, lambda i: 0.5 * (i + 1))
    assert seen == [(1, 0.5, 4), (3, 1.0, 4)] and loss == 2.0
