"""Plan expansion: the matrix, batch semantics, stable run ids."""

from __future__ import annotations

from bench.plan.config import validate
from bench.plan.runs import expand


def cfg(**changes: object):
    base = {"runners": ["tf_mirrored"], "models": ["minigooglenet", "resnet50"],
            "devices": [1, 2, 4], "batch_size_per_device": [16, 32], "precision": ["fp32", "bf16"],
            "repeats": 2, "runner_options": {"tf_mirrored": {"xla": True, "python": "/x/py"}}}
    base.update(changes)
    return validate(base)


def test_matrix_size_and_uniqueness() -> None:
    runs = expand(cfg(), "s1")
    assert len(runs) == 1 * 2 * 3 * 2 * 2 * 2
    assert len({r.run_id for r in runs}) == len(runs)
    assert all(r.sweep_id == "s1" for r in runs)


def test_weak_scaling_multiplies_batch() -> None:
    runs = expand(cfg(), "s")
    assert {r.num_devices for r in runs} == {1, 2, 4}
    for r in runs:
        assert r.global_batch_size == r.batch_size_per_device * r.num_devices
        assert r.scaling == "weak" and r.virtual_devices and r.device == "cpu"


def test_strong_scaling_splits_batch() -> None:
    runs = expand(cfg(batch_size_per_device=None, global_batch_size=64, scaling="strong"), "s")
    assert {r.num_devices for r in runs} == {1, 2, 4}
    for r in runs:
        assert r.global_batch_size == 64
        assert r.batch_size_per_device == 64 // r.num_devices


def test_runner_options_and_interpreter_split() -> None:
    r = expand(cfg(), "s")[0]
    assert r.options == {"xla": True, "steps_per_execution": 1, "data_format": "channels_last",
                         "cross_device_ops": "auto", "loader": "framework"}
    assert r.python == "/x/py" and r.module == "runners.tf.mirrored" and r.family == "tf"


def test_run_ids_are_stable_across_sweeps() -> None:
    assert [r.run_id for r in expand(cfg(), "a")] == [r.run_id for r in expand(cfg(), "b")]


def test_gpu_runs_are_not_virtual() -> None:
    assert not any(r.virtual_devices for r in expand(cfg(device="gpu"), "s"))


def test_group_key_ignores_device_count_and_repeat() -> None:
    runs = expand(cfg(models=["minigooglenet"], batch_size_per_device=32, precision="fp32"), "s")
    assert len({r.group_key for r in runs}) == 1


def test_repeats_interleave_across_runners() -> None:
    """Every configuration's first repeat runs before any second one, so drift of the machine
    spreads over the runners being compared."""
    cfg = validate({"runners": ["tf_mirrored", "tf_native"], "models": ["minigooglenet"],
                    "devices": [1], "batch_size_per_device": 8, "repeats": 2})
    order = [(r.repeat, r.runner) for r in expand(cfg, "s")]
    assert order == [(0, "tf_mirrored"), (0, "tf_native"), (1, "tf_mirrored"),
                     (1, "tf_native")]
