"""Precision fp32 is IEEE float32 and tf32 is TF32 tensor-core math, in every framework: the
environment the launcher gives a GPU run, the switches each framework is set to and reports
back, and tf32 refused where there are no tensor cores."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.plan.config import ConfigError, load_config
from bench.plan.runs import expand
from bench.run.sweep import precheck
from contract.launch_env import math_env
from tests.helpers.cli import REPO, run_child, run_cli


def test_gpu_fp32_runs_get_tf32_switched_off_in_the_libraries() -> None:
    env = math_env("fp32", "gpu", {"PATH": "/bin"})
    assert env["NVIDIA_TF32_OVERRIDE"] == "0"  # cuBLAS and cuDNN refuse TF32 whatever is asked
    assert env["JAX_DEFAULT_MATMUL_PRECISION"] == "highest"
    assert env["PATH"] == "/bin"


def test_gpu_tf32_runs_drop_a_users_override_and_ask_jax_for_tf32() -> None:
    env = math_env("tf32", "gpu", {"NVIDIA_TF32_OVERRIDE": "0"})
    assert "NVIDIA_TF32_OVERRIDE" not in env
    assert env["JAX_DEFAULT_MATMUL_PRECISION"] == "tensorfloat32"


def test_half_precision_gpu_runs_keep_library_tf32_off_and_jax_default() -> None:
    env = math_env("bf16", "gpu", {})
    assert env["NVIDIA_TF32_OVERRIDE"] == "0"
    assert "JAX_DEFAULT_MATMUL_PRECISION" not in env


def test_cpu_runs_environment_is_untouched() -> None:
    assert math_env("fp32", "cpu", {"A": "1"}) == {"A": "1"}


def test_tf32_on_cpu_is_invalid_before_launch(tmp_path: Path) -> None:
    cfg_path = tmp_path / "c.yaml"
    cfg_path.write_text((REPO / "configs/cpu-smoke.yaml").read_text())
    cfg = load_config(cfg_path, ["precision=tf32", "runners=[torch_ddp]"])
    spec = expand(cfg, "x")[0]
    status, reason = precheck(spec, 0)
    assert status == "invalid" and "tf32" in reason and "use fp32" in reason


def test_tf32_is_a_config_precision_and_others_are_not(tmp_path: Path) -> None:
    proc = run_cli("--config", "configs/cpu-smoke.yaml", "--set", "precision=tf16", "--dry-run")
    assert proc.returncode == 2
    assert "tf32" in proc.stderr and "tf16" in proc.stderr
    with pytest.raises(ConfigError):
        load_config(REPO / "configs/cpu-smoke.yaml", ["precision=fp64"])


@pytest.mark.slow
@pytest.mark.parametrize("family,module,key", [
    pytest.param("torch", "torch", "torch", marks=pytest.mark.framework("torch")),
    pytest.param("jax", "jax", "jax", marks=pytest.mark.framework("jax")),
    pytest.param("tf", "tensorflow", "tensorflow", marks=pytest.mark.framework("tf")),
])
def test_each_framework_reports_ieee_float32_after_fp32_is_applied(
        family: str, module: str, key: str, request: pytest.FixtureRequest) -> None:
    python = request.getfixturevalue(f"{family}_python")
    out = run_child(python, "tests/children/math_mode_readback.py", module)
    math = out["strict"][key]
    assert all(v == "ieee" for k, v in math.items() if k != "source"), math
    assert out["refused"] and "use fp32" in out["refused"]
