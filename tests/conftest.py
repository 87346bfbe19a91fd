"""Shared fixtures: framework interpreters (built on first use, cached outside the repo)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests import golden_records  # noqa: E402  (after the repo is on the path)

_RECORDS_BEFORE = pytest.StashKey[dict]()
_CAPTURED = golden_records.captured_tests()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):  # noqa: ANN201  (a hook wrapper's generator)
    """Before the test's fixtures run: the records already there (tests/golden_records.py)."""
    if golden_records.in_scope(item.nodeid, (m.name for m in item.iter_markers()), _CAPTURED):
        base = item.config._tmp_path_factory.getbasetemp()  # noqa: SLF001
        item.stash[_RECORDS_BEFORE] = golden_records.snapshot(base)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):  # noqa: ANN201
    """After the test: each record it or its fixtures wrote held to its golden record."""
    result = yield
    if _RECORDS_BEFORE in item.stash:
        base = item.config._tmp_path_factory.getbasetemp()  # noqa: SLF001
        found = golden_records.after_test(item.nodeid, base, item.stash[_RECORDS_BEFORE])
        if found:
            pytest.fail("records differ from tests/golden/records/:\n" + "\n".join(found),
                        pytrace=False)
    return result


def _family_python(family: str) -> str:
    """The family's CPU interpreter, creating its environment if needed.

    A missing environment is a test failure, not a skip: CI must exercise the frameworks.
    Set MGBENCH_SKIP_FRAMEWORKS=1 to skip these tests on a machine that cannot build them."""
    if os.environ.get("MGBENCH_SKIP_FRAMEWORKS") == "1":
        pytest.skip("MGBENCH_SKIP_FRAMEWORKS=1")
    from bench.run.envs import ensure_env

    return str(ensure_env(family, "cpu").python)


@pytest.fixture(scope="session")
def tf_python() -> str:
    return _family_python("tf")


@pytest.fixture(scope="session")
def mxnet_python() -> str:
    return _family_python("mxnet")


@pytest.fixture(scope="session")
def torch_python() -> str:
    return _family_python("torch")


@pytest.fixture(scope="session")
def jax_python() -> str:
    return _family_python("jax")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite tests/golden/ (tests/test_golden_plans.py) instead of "
                          "comparing the plans with it")


SLURM_TOOL = REPO / "tools" / "local_slurm.sh"
STATE_DIR = Path(os.environ.get("MGBENCH_SLURM_DIR", "/tmp/mgbench-slurm"))


@pytest.fixture(scope="session")
def local_slurm() -> dict[str, str]:
    """The environment for SLURM's commands (SLURM_CONF) with the local 2-node cluster up
    (tools/local_slurm.sh, docs/SLURM.md). Skips only where it cannot start: not root, or no
    SLURM and no apt-get to install it; any other failure to start fails the test. A cluster
    this fixture started is stopped at the session's end; one already up is left as it was."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("the local SLURM cluster needs root (SlurmUser=root, apt-get)")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        pytest.skip("SLURM is not installed and there is no apt-get to install it")
    env = {**os.environ, "SLURM_CONF": str(STATE_DIR / "slurm.conf")}
    tool = str(SLURM_TOOL)
    was_up = subprocess.run([tool, "status"], capture_output=True, env=env).returncode == 0
    proc = subprocess.run([tool, "up"], capture_output=True, text=True, timeout=600, env=env)
    if proc.returncode != 0:
        pytest.fail(f"tools/local_slurm.sh up failed:\n{proc.stdout}{proc.stderr}")
    yield env
    if not was_up:
        subprocess.run([tool, "down"], capture_output=True, timeout=120, env=env)



def run_cli(*args: str, timeout: float = 900, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    """Run `python run_bench.py ARGS` as a user would, from the repo root."""
    return subprocess.run([sys.executable, str(REPO / "run_bench.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def run_check_script(python: str, script: str, *args: str, env: dict[str, str] | None = None,
                     timeout: float = 900) -> dict:
    """Run a check script in a framework interpreter from the repo root; the JSON of its one
    "RESULT <json>" output line (the test process itself never imports the framework)."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run([python, "-c", script, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=full_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def smoke_sweep(out: Path, *sets: str) -> dict[int, dict]:
    """The CPU smoke config through the CLI, shortened (2 warm-up + 3 timed steps, 8 images
    per device) and with `--set` overrides; its records by device count."""
    from bench.records.store import load_records

    args = ["--config", "configs/cpu-smoke.yaml", "--set", "warmup_steps=2",
            "--set", "measure_steps=3", "--set", "batch_size_per_device=8", "--out", str(out)]
    for s in sets:
        args += ["--set", s]
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {r["num_devices"]: r for r in load_records(out)}


@pytest.fixture(scope="session")
def real_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small prepared dataset for real-data runs: 10 classes, 48 JPEGs of 40 x 40 (so
    MiniGoogLeNet's 32 x 32 crops move), every format prepare-data writes."""
    from bench.data.datasets import make_dataset
    from bench.data.prepare import prepare_data

    root = tmp_path_factory.mktemp("real-data")
    make_dataset(root / "src", classes=10, images=48, size=40, seed=0)
    prepare_data(root / "src", root / "prepared", resize=40, quality=90, shards=2, workers=1)
    return root / "prepared"


def real_sweep(out: Path, dataset: Path, *sets: str) -> dict[int, dict]:
    """smoke_sweep on real data from `dataset` (augmentation crop-flip, 1 loader worker unless
    a --set says otherwise); its records by device count."""
    return smoke_sweep(out, "data=real", f"dataset.path={dataset}", "dataset.workers=1", *sets)


@pytest.fixture(scope="session")
def digits_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scikit-learn's digits written by `make-dataset --source digits` (mode converge's
    dataset: a prepared folder with splits.npz), once per session."""
    out = tmp_path_factory.mktemp("digits") / "digits"
    proc = run_cli("make-dataset", "--source", "digits", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def converge_sweep(out: Path, dataset: Path, *sets: str) -> list[dict]:
    """configs/converge-digits.yaml through the CLI on `dataset` with `sets` (KEY=VALUE);
    its records (mode converge: runners/converge.py)."""
    from bench.records.store import load_records

    args = ["--config", "configs/converge-digits.yaml", "--out", str(out),
            "--set", f"dataset.path={dataset}"]
    for s in sets:
        args += ["--set", s]
    proc = run_cli(*args)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return load_records(out)


def assert_stopped_at_target(rec: dict, target: float) -> None:
    """A converge record that reached `target`: stopped at its first epoch at the target, the
    time to target that epoch's wall time, evaluations included."""
    assert rec["best_accuracy"] >= target, rec["curve"]
    epoch = rec["epochs_to_target"]
    assert epoch == len(rec["curve"]) and rec["target_reason"] is None  # stopped at the target
    point = rec["curve"][epoch - 1]
    assert point["accuracy"] >= target
    assert all(p["accuracy"] < target for p in rec["curve"][:epoch - 1])
    assert rec["time_to_target_s"] == point["wall_s"] > 0
    assert rec["time_to_target_s"] >= rec["train_time_s"] > 0  # evaluations included
