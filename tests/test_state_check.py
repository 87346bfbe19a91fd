"""The parent's check of a run's model-state split (bench/records/state_check.py) and the
catalog's expected_shards, on records as the runners write them."""

from __future__ import annotations

from typing import Any

from bench.records.state_check import check_state_split
from contract.catalog import Option, RunnerInfo, expected_shards

MB = 2**20
WHOLE = {"params": 40 * MB, "grads": 40 * MB, "optimizer": 40 * MB}


def record(per_device: list[dict[str, int]], whole: dict[str, int] | None = None
           ) -> dict[str, Any]:
    return {"state_bytes_per_device": {f"rank{i}:cpu": d for i, d in enumerate(per_device)},
            "state_bytes_global": whole or WHOLE}


def test_replicas_pass_for_plain_data_parallelism() -> None:
    view, problems = check_state_split(record([WHOLE, WHOLE]), (), 2)
    assert problems == []
    assert view["parts"]["params"] == {"global": 40 * MB, "max_per_device": 40 * MB,
                                       "expected": "replica"}


def test_zero1_splits_only_the_optimizer_state() -> None:
    half = {"params": 40 * MB, "grads": 40 * MB, "optimizer": 20 * MB}
    assert check_state_split(record([half, half]), ("optimizer",), 2)[1] == []


def test_a_sharded_strategy_holding_full_replicas_is_named_with_its_bytes() -> None:
    _, problems = check_state_split(record([WHOLE, WHOLE]), ("params", "grads", "optimizer"), 2)
    assert len(problems) == 3
    assert problems[0].startswith("params should be sharded over 2 devices")
    assert "rank0:cpu holds 40.00 MiB" in problems[0] and "rank1:cpu holds 40.00 MiB" in problems[0]


def test_shards_that_do_not_cover_the_whole_are_named() -> None:
    quarter = {"params": 10 * MB, "grads": 10 * MB, "optimizer": 10 * MB}
    _, problems = check_state_split(record([quarter, quarter]), ("optimizer",), 2)
    assert any("add up to 20.00 MiB, less than the whole 40.00 MiB" in p for p in problems)
    # params and grads were expected whole on each device
    assert any(p.startswith("params should be a full replica") for p in problems)


def test_padding_within_the_slack_passes_and_beyond_it_fails() -> None:
    padded = {"params": 21 * MB, "grads": 21 * MB, "optimizer": 21 * MB}
    assert check_state_split(record([padded, padded]), ("params", "grads", "optimizer"), 2
                             )[1] == []
    lopsided = [{"params": 30 * MB, "grads": 20 * MB, "optimizer": 20 * MB},
                {"params": 10 * MB, "grads": 20 * MB, "optimizer": 20 * MB}]
    _, problems = check_state_split(record(lopsided), ("params", "grads", "optimizer"), 2)
    assert problems == ["params should be sharded over 2 devices (at most 22.80 MiB each of "
                        "40.00 MiB) but rank0:cpu holds 30.00 MiB"]


def test_a_part_not_held_when_read_is_not_judged() -> None:
    freed = {"params": 20 * MB, "grads": 0, "optimizer": 20 * MB}
    view, problems = check_state_split(record([freed, freed], {**WHOLE, "grads": 0}),
                                       ("params", "grads", "optimizer"), 2)
    assert problems == []
    assert view["parts"]["grads"]["judged"].startswith("no")


def test_a_sharded_run_without_its_state_is_not_shown_split() -> None:
    _, problems = check_state_split({}, ("optimizer",), 2)
    assert problems and "reports no state_bytes_per_device" in problems[0]
    assert check_state_split({}, (), 2) == (None, [])
    assert check_state_split({}, ("optimizer",), 1) == (None, [])


def test_a_device_missing_or_a_bad_count_is_a_problem() -> None:
    _, problems = check_state_split(record([WHOLE]), (), 2)
    assert problems == ["state_bytes_per_device names 1 devices, the run has 2"]
    _, problems = check_state_split(record([WHOLE, {**WHOLE, "grads": "x"}]), (), 2)
    assert problems == ["grads: not a byte count (global 41943040, devices rank1:cpu)"]


def test_expected_shards_follow_the_option() -> None:
    info = RunnerInfo("ds", "torch", "m", "d", options={"stage": Option(int, 2, (1, 2, 3))},
                      shards={"option": "stage", "values": {1: ("optimizer",),
                                                            2: ("optimizer", "grads"),
                                                            3: ("params", "grads", "optimizer")}})
    assert expected_shards(info, {}) == ("optimizer", "grads")
    assert expected_shards(info, {"stage": 3}) == ("params", "grads", "optimizer")
    assert expected_shards(RunnerInfo("ddp", "torch", "m", "d"), {}) == ()


def test_whole_parameter_partitions_get_their_granularity() -> None:
    """ZeroRedundancyOptimizer assigns whole parameters: one large one puts most of the state
    on one rank, which passes only with the granularity the framework reports."""
    lopsided = [{"params": 40 * MB, "grads": 40 * MB, "optimizer": 36 * MB},
                {"params": 40 * MB, "grads": 40 * MB, "optimizer": 4 * MB}]
    rec = record(lopsided)
    assert check_state_split(rec, ("optimizer",), 2)[1] != []
    rec["state_granularity_bytes"] = {"optimizer": 36 * MB}
    assert check_state_split(rec, ("optimizer",), 2)[1] == []
