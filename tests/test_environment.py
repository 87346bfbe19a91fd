"""Environment capture: the host as the parent sees it, without a framework."""

from __future__ import annotations

import sys

from bench import environment


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
