"""Thread settings (runners/threads.py): the per-family policy the parent applies to a child's
environment, what a run records of the threads it used, and, for real, that MXNet with the
policy keeps more than one core busy where its default keeps one."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bench.catalog.registry import RUNNERS
from bench.plan.runs import RunSpec
from bench.run import launch
from bench.run.launch import child_env
from contract import launch_env
from contract.launch_env import POLICY_VAR, thread_env
from runners.threads import observed
from tests.helpers.sweeps import smoke_sweep


def env_for(runner: str, n: int, device: str = "cpu", environ: dict | None = None,
            cores: int = 4) -> dict[str, str]:
    info = RUNNERS[runner]
    return thread_env(info.family, runner, info.launcher, device, n, environ or {}, cores)


def run_spec(runner: str, n: int, device: str = "cpu") -> RunSpec:
    info = RUNNERS[runner]
    return RunSpec(run_id="r", sweep_id="s", runner=runner, family=info.family,
                   module=info.module, model="probe", num_devices=n, device=device,
                   virtual_devices=device == "cpu", scaling="weak", batch_size_per_device=8,
                   global_batch_size=8 * n, data="synthetic", precision="fp32",
                   warmup_steps=1, measure_steps=1, repeat=0, timeout_s=60,
                   launcher=info.launcher)


@pytest.mark.parametrize(("n", "expected"), [(1, "4"), (2, "2"), (4, "1"), (8, "1")])
def test_mxnet_gets_the_physical_cores_shared_by_its_contexts(n: int, expected: str) -> None:
    """One OpenMP thread per physical core (MXNet's perf guide), shared by the engine's one
    worker per CPU context; never fewer than one."""
    env = env_for("mxnet_native", n)
    assert env["OMP_NUM_THREADS"] == expected
    assert "MXNet perf.md" in env[POLICY_VAR]


def test_keras_mxnet_is_one_context_whatever_n() -> None:
    """keras-mxnet binds every cpu(i) to cpu(0): one engine worker uses all the cores."""
    assert env_for("keras_mxnet", 1)["OMP_NUM_THREADS"] == "4"
    assert env_for("keras_mxnet", 2)["OMP_NUM_THREADS"] == "4"


@pytest.mark.parametrize("runner", ["torch_ddp", "keras_torch", "horovod"])
def test_per_rank_launchers_share_the_cores_between_ranks(runner: str) -> None:
    assert env_for(runner, 1)["OMP_NUM_THREADS"] == "4"
    assert env_for(runner, 2)["OMP_NUM_THREADS"] == "2"
    assert "torchrun" in env_for(runner, 2)[POLICY_VAR]


@pytest.mark.parametrize("runner", ["tf_mirrored", "tf_native", "jax_native", "keras_jax"])
def test_tf_and_jax_keep_their_defaults(runner: str) -> None:
    env = env_for(runner, 2)
    assert env == {POLICY_VAR: "nothing set (framework defaults)"}


@pytest.mark.parametrize("runner", ["mxnet_native", "torch_ddp"])
def test_gpu_runs_keep_the_framework_defaults(runner: str) -> None:
    assert "OMP_NUM_THREADS" not in env_for(runner, 2, device="gpu")


def test_a_variable_the_user_set_is_never_overridden() -> None:
    env = env_for("mxnet_native", 1, environ={"OMP_NUM_THREADS": "3"})
    assert "OMP_NUM_THREADS" not in env
    assert "the user's OMP_NUM_THREADS kept" in env[POLICY_VAR]


@pytest.mark.parametrize("value", ["off", "OFF", "0", "false", "none"])
def test_policy_off_leaves_bare_defaults(value: str) -> None:
    assert env_for("mxnet_native", 1, environ={POLICY_VAR: value}) == {}


def test_child_env_applies_the_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(POLICY_VAR, raising=False)
    monkeypatch.setattr(launch_env, "physical_cores", lambda: 6)
    monkeypatch.setattr(launch, "busy_cpus", lambda: 0.0)  # a quiet host
    assert child_env(run_spec("mxnet_native", 2))["OMP_NUM_THREADS"] == "3"
    assert child_env(run_spec("torch_ddp", 3))["OMP_NUM_THREADS"] == "2"
    assert "OMP_NUM_THREADS" not in child_env(run_spec("tf_mirrored", 2))
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert child_env(run_spec("mxnet_native", 2))["OMP_NUM_THREADS"] == "5"
    monkeypatch.setenv(POLICY_VAR, "off")
    monkeypatch.delenv("OMP_NUM_THREADS")
    env = child_env(run_spec("mxnet_native", 1))
    assert "OMP_NUM_THREADS" not in env and env[POLICY_VAR] == "off"


@pytest.mark.parametrize(("busy", "cores", "expected"), [
    (0.0, 4, "4"), (0.4, 4, "4"), (1.0, 4, "3"), (2.6, 4, "1"), (7.0, 4, "1")])
def test_a_rank_is_sized_to_the_cores_left_free_at_launch(busy: float, cores: int,
                                                          expected: str,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """Issue 41: one torch rank with 2 OpenMP threads on a host whose other core was busy ran
    10x slower than with 1; the policy takes the cores other processes left free (whole cores,
    at least one) and the note says what it saw."""
    monkeypatch.setattr(launch_env.os, "cpu_count", lambda: cores)  # one thread per core
    info = RUNNERS["torch_ddp"]
    env = thread_env(info.family, "torch_ddp", info.launcher, "cpu", 1, {}, cores, busy)
    assert env["OMP_NUM_THREADS"] == expected
    assert f"at launch {busy:g} logical CPUs were busy: sized to {expected} of {cores} cores" \
        in env[POLICY_VAR]
    whole = thread_env(info.family, "torch_ddp", info.launcher, "cpu", 1,
                       {POLICY_VAR: launch_env.ALL_CORES}, cores, busy)
    assert whole["OMP_NUM_THREADS"] == str(cores) and "at launch" not in whole[POLICY_VAR]


def test_busy_cpus_sees_a_process_that_holds_a_core() -> None:
    """/proc/stat read over a short window counts a busy loop beside the test as one CPU."""
    import subprocess

    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        busy = launch_env.busy_cpus(0.5)
    finally:
        hog.kill()
        hog.wait()
    assert busy is not None and 0.8 <= busy <= (os.cpu_count() or 1) + 0.01, busy


def test_cpu_lists_and_physical_cores() -> None:
    assert launch_env._count_cpu_list("0\n") == 1
    assert launch_env._count_cpu_list("0,64") == 2
    assert launch_env._count_cpu_list("0-3,8") == 5
    assert 1 <= launch_env.physical_cores() <= (os.cpu_count() or 1)


def test_observed_reads_the_environment_and_imports_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv(POLICY_VAR, "OMP_NUM_THREADS=2 (test)")
    before = set(sys.modules)
    got = observed()
    assert got["env"]["OMP_NUM_THREADS"] == "2" and got["policy"] == "OMP_NUM_THREADS=2 (test)"
    assert got["physical_cores"] >= 1
    assert not {"tensorflow", "torch", "mxnet", "jax"} & (set(sys.modules) - before)


def test_observed_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """A framework module that does not answer as expected is recorded, not raised."""
    monkeypatch.setitem(sys.modules, "torch", object())
    got = observed()
    assert "error" in got["torch"]


@pytest.mark.slow
@pytest.mark.framework("mxnet")
def test_mxnet_with_the_policy_computes_on_more_than_one_core(
        tmp_path: Path, mxnet_python: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """mxnet_native at 1 device, with the policy and with MXNet's default (policy off).

    MXNet 1.9 halves omp_get_num_procs() on x86 (it assumes 2 hyper-threads per core): on a
    host without SMT its default is one OpenMP thread, and one thread does all the compute.
    With the policy the OpenMP count is the physical cores and a second thread computes as
    much as the first. That split of the process's CPU time between its threads holds however
    busy the host is; the record's busy cores (telemetry) exceed one only when no other
    process takes the cores, so that is asserted only when the host had them to give."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    # every core, whatever the other test worker holds at launch
    monkeypatch.setenv(POLICY_VAR, launch_env.ALL_CORES)
    cores = launch_env.physical_cores()
    if cores < 2:
        pytest.skip(f"{cores} physical core: nothing to spread over")
    sets = ("runners=[mxnet_native]", "devices=[1]", "batch_size_per_device=32",
            "measure_steps=12", "telemetry.interval_s=0.1")
    policy = smoke_sweep(tmp_path / "policy", *sets)[1]
    assert policy["status"] == "ok", policy["reason"]
    used = policy["result"]["threads"]
    assert used["env"]["OMP_NUM_THREADS"] == str(cores)
    assert used["mxnet"]["openmp_max_threads"] == cores
    assert used["mxnet"]["mkldnn"] is True
    first, second = used["busiest_threads_cpu_s"][:2]
    assert second > 0.5 * first, f"one thread did the compute: {used['busiest_threads_cpu_s']}"
    host = policy["telemetry"]["host"]
    busy = host["run_cpu_cores_mean"]
    others = host["cpu_util_mean_pct"] / 100 * (os.cpu_count() or 1) - busy
    if others < 0.5:  # the cores were the run's to take
        assert busy > 1.1, f"{busy:.2f} busy cores with {cores} OpenMP threads"

    monkeypatch.setenv(POLICY_VAR, "off")  # the CLI and its child inherit it
    default = smoke_sweep(tmp_path / "default", *sets)[1]
    assert default["status"] == "ok", default["reason"]
    bare = default["result"]["threads"]
    assert "OMP_NUM_THREADS" not in bare["env"] and bare["policy"] == "off"
    siblings = Path("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list")
    if siblings.exists() and launch_env._count_cpu_list(siblings.read_text()) == 1:
        # no SMT: MXNet's halving leaves half the cores without an OpenMP thread
        assert bare["mxnet"]["openmp_max_threads"] == len(os.sched_getaffinity(0)) // 2
        if cores == 2:
            first, second = bare["busiest_threads_cpu_s"][:2]
            assert second < 0.5 * first, bare["busiest_threads_cpu_s"]
