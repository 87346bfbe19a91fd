"""A child that reports what its spec's options say, through runners.common.main: one field
`field` with the JSON value `value` beside a valid timed window (tests/test_result_fields.py)."""

from __future__ import annotations

import json
from typing import Any

from runners.common import Spec, StepTimer, main


def benchmark(spec: Spec) -> dict[str, Any]:
    timer = StepTimer()
    timer.start()
    timer.tick()
    result = {**timer.summary(spec.global_batch_size, spec.global_batch_size),
              "first_loss": 1.0, "last_loss": 1.0, "placement": {"cpu:0": 1}}
    if spec.options.get("field"):
        result[spec.options["field"]] = json.loads(spec.options["value"])
    return result


if __name__ == "__main__":
    main(benchmark)
