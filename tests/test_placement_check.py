"""The parent's placement check (bench/records/placement_check.py): distinct devices as each
framework
names them, and each device's share of the work where the runner knows it. Fast: no
framework."""

from __future__ import annotations

import pytest

from bench.records.placement_check import check_placement, check_work, normalise_device

TF0 = "/job:localhost/replica:0/task:0/device:CPU:0"
TF1 = "/job:localhost/replica:0/task:0/device:CPU:1"


@pytest.mark.parametrize(("name", "normal"), [
    (TF1, "cpu:1"), ("/device:CPU:1", "cpu:1"), ("/cpu:1", "cpu:1"), ("CPU:1", "cpu:1"),
    ("/job:localhost/replica:0/task:0/device:GPU:3", "gpu:3"),
    ("/job:worker/replica:0/task:1/device:CPU:0", "worker/task:1/cpu:0"),
    ("cpu(1)", "cpu:1"), ("gpu(0)", "gpu:0"),
    ("TFRT_CPU_1", "cpu:1"), ("CpuDevice(id=1)", "cpu:1"), ("cuda:2", "gpu:2"),
    ("cpu:2048 (process 1)", "process1/cpu:2048"),
    ("rank1:cpu", "rank1/cpu"), ("rank0:cuda:1", "rank0/gpu:1"),
    ("toy:shard0", "toy:shard0"),
])
def test_every_framework_spelling_names_one_device(name: str, normal: str) -> None:
    assert normalise_device(name) == normal


def test_two_names_of_one_device_are_one_device() -> None:
    """Two keys, one device: a 2-device run that only used CPU:1 does not pass."""
    shown, problems = check_placement({"placement": {TF1: 10, "/cpu:1": 5}}, 2)
    assert shown["devices"] == ["cpu:1"]
    assert problems and "did not spread over the 2 devices" in problems[0]
    assert "2 names for 1 devices" in problems[0]
    shown, problems = check_placement({"placement": {TF0: 10, TF1: 5}}, 2)
    assert shown == {"devices": ["cpu:0", "cpu:1"]} and problems == []


def test_framework_collapsed_devices_pass_with_its_note() -> None:
    result = {"placement": {"cpu(0)": 16}, "placement_collapsed": "keras-mxnet binds cpu(0)"}
    assert check_placement(result, 2)[1] == []


def test_the_template_forward_pass_on_one_device_is_invalid() -> None:
    """The 38/19 split issue 24 found (kuza55 at 2 devices: the template's whole-batch forward
    pass on CPU:0 beside its tower) fails the check with the counts in the reason; one tower
    each passes. The expected side may use short names, the measured side TF's."""
    expected = {"/cpu:0": 19, "/cpu:1": 19}
    bad = {"placement": {TF0: 900, TF1: 450},
           "forward_convs_per_device": {TF0: 38, TF1: 19},
           "expected_work": {"forward_convs_per_device": expected}}
    shown, problems = check_placement(bad, 2)
    assert len(problems) == 1
    assert "forward_convs_per_device is not the original's" in problems[0]
    assert "cpu:0 38 (expected 19)" in problems[0] and "cpu:1 19 (expected 19)" in problems[0]
    assert shown["work"]["forward_convs_per_device"] == {
        "measured": {"cpu:0": 38, "cpu:1": 19}, "expected": {"cpu:0": 19, "cpu:1": 19}}
    good = {**bad, "forward_convs_per_device": {TF0: 19, TF1: 19}}
    assert check_placement(good, 2)[1] == []


def test_work_on_a_device_that_should_have_none_is_invalid() -> None:
    result = {"forward_convs_per_device": {TF0: 19, TF1: 19, "/cpu:2": 1},
              "expected_work": {"forward_convs_per_device": {TF0: 19, TF1: 19}}}
    _, problems = check_work(result)
    assert problems and "cpu:2 1 (expected 0)" in problems[0]


def test_a_range_allows_what_the_frameworks_optimiser_may_merge() -> None:
    """avolkov1's gradient copies: between one and N per conv layer on each device."""
    expected = {"backward_convs_per_device": {TF0: [19, 38], TF1: [19, 38]}}
    for got in (19, 38):
        result = {"backward_convs_per_device": {TF0: got, TF1: got},
                  "expected_work": expected}
        assert check_work(result)[1] == []
    _, problems = check_work({"backward_convs_per_device": {TF0: 57, TF1: 19},
                              "expected_work": expected})
    assert problems and "cpu:0 57 (expected 19..38)" in problems[0]


@pytest.mark.parametrize("result", [
    {"expected_work": {"forward_convs_per_device": {TF0: 1}}},
    {"expected_work": {"forward_convs_per_device": {TF0: 1}},
     "forward_convs_per_device": {TF0: "19"}},
    {"expected_work": ["forward_convs_per_device"]},
])
def test_unreadable_work_counts_are_a_problem_not_a_pass(result: dict) -> None:
    assert check_work(result)[1]


def test_results_without_expected_work_are_checked_for_devices_only() -> None:
    assert check_work({"placement": {TF0: 1}}) == ({}, [])
