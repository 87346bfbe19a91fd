"""runners/tf/placement.py against TensorFlow itself: the placement it reads is where TF put
the ops, not where anybody asked for them."""

from __future__ import annotations

import pytest

from tests.helpers.cli import run_child

pytestmark = [pytest.mark.slow, pytest.mark.framework("tf")]


def test_placement_is_read_from_tensorflows_partition_graphs(tf_python: str) -> None:
    out = run_child(tf_python, "tests/children/tf_placement_read.py")
    cpu = "/job:localhost/replica:0/task:0/device:CPU:"
    # MirroredStrategy runs the step's compute on both replicas
    assert set(out["mirrored"]) == {cpu + "0", cpu + "1"}
    assert all(n > 3 for n in out["mirrored"].values()), out["mirrored"]
    # a function whose only compute is on /cpu:1 shows that device alone
    assert set(out["one"]) == {cpu + "1"}
    assert out["graph"] == {cpu + "1": 1}


def test_each_op_is_counted_once(tf_python: str) -> None:
    """Eager run metadata lists a function's partition graphs twice (alone and under the
    function): three matmuls are three compute ops, not six."""
    out = run_child(tf_python, "tests/children/tf_placement_count.py")
    assert out == {"/job:localhost/replica:0/task:0/device:CPU:0": 3}
