"""What a tensorpack record's result says about its towers: one per device, each on its own
device, the devices TensorFlow ran the step on (test_tensorpack.py, test_tf_runners.py)."""

from __future__ import annotations

from contract.reasons import sentence
from models import get_spec


def short(devices: list[str]) -> set[str]:
    """Device names without the job/replica/task prefix: {"CPU:0", "CPU:1"}."""
    return {d.split("/device:")[-1] for d in devices}


def check_towers(result: dict, n: int) -> None:
    """One tower per device, each on its own device, and the devices really ran a step."""
    spec = get_spec("minigooglenet")
    assert result["replicas"] == n
    assert len(result["tower_devices"]) == n
    assert len(set(result["tower_devices"])) == n, result["tower_devices"]
    # where TF ran the first step's compute ops, read from its partition graphs
    assert short(result["placement"]) == short(result["tower_devices"])
    assert all(v > 0 for v in result["placement"].values())
    assert "partition graphs" in sentence(result["placement_source"])
    if n == 2:
        assert short(result["tower_devices"]) == {"CPU:0", "CPU:1"}
    assert result["params"] == spec.params
    assert result["trainable_params"] == spec.trainable_params
