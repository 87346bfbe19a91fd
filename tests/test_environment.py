"""Environment capture: the host as the parent sees it, without a framework."""

from __future__ import annotations

import sys

import pytest

from bench.run import environment


def test_capture_has_the_host() -> None:
    env = environment.capture()
    for key in ("host", "os", "cpu_model", "cpu_cores", "memory_bytes", "python", "gpus",
                "harness_commit"):
        assert key in env
    assert env["cpu_cores"] >= 1 and env["memory_bytes"] > 2**28
    assert isinstance(env["gpus"], list)
    assert env["parent_python"] == sys.executable


def test_parent_never_imports_a_framework() -> None:
    import bench.cli  # noqa: F401  (imports the whole parent)

    for name in ("tensorflow", "keras", "torch", "jax", "mxnet"):
        assert name not in sys.modules, f"the parent imported {name}"


def test_records_name_the_lock_their_environment_came_from() -> None:
    from bench.run.envs import LOCK_PYTHON, family_env

    if f"{sys.version_info.major}.{sys.version_info.minor}" != LOCK_PYTHON:
        pytest.skip(f"the locks are resolved for Python {LOCK_PYTHON}")
    lock = environment.lock_for("tf", "cpu")
    assert lock is not None and lock["file"] == "envs/tf-cpu.lock" and lock["locked"]
    assert len(lock["sha256"]) == 64 and lock["env_key"] == family_env("tf", "cpu").key
    assert environment.lock_for("tf", "cpu", python="/my/python") is None  # the user's own
    assert environment.lock_for("harness", "cpu") is None  # the harness's interpreter
