"""Fixtures and pytest hooks only: framework interpreters (built on first use, cached outside
the repo), the local SLURM cluster, the real-data and digits datasets. What test modules share
besides fixtures lives in tests/helpers/."""

from __future__ import annotations

import compileall
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import golden_records  # noqa: E402  (after the repo is on the path)
from tests.helpers.cli import run_cli
from tests.helpers.slurm import SLURM_TOOL, STATE_DIR

# The suite's sweeps share the CPUs, so their matmul probes are never kept (bench/run/peak.py):
# timed for 0.5 s, not 3, they cost a third of the time and key their own cache entries.
os.environ.setdefault("MGBENCH_PEAK_SECONDS", "0.5")
_RECORDS_BEFORE = pytest.StashKey[dict]()
SLURM_GROUP = "slurm"
_CAPTURED = golden_records.captured_tests()


@pytest.fixture(scope="session", autouse=True)
def repo_bytecode() -> None:
    """The repository's modules compiled once into their __pycache__ (ignored by git): every
    command the tests start then reads bytecode, where under PYTHONDONTWRITEBYTECODE it would
    compile each module again on every start (half of a short command's CPU)."""
    root = Path(__file__).resolve().parents[1]
    for name in ("bench", "contract", "runners", "models", "tests", "tools"):
        compileall.compile_dir(root / name, quiet=1, workers=1)
    compileall.compile_file(root / "run_bench.py", quiet=1)


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Groups for pytest-xdist's `-n 2 --dist loadgroup` (the README's test command): a test
    module's tests on one worker, so that its module-scoped shared runs are made once; every
    test on the local SLURM cluster on one worker, in turn (they share its two nodes)."""
    for item in items:
        on_slurm = item.get_closest_marker("slurm") or "local_slurm" in getattr(
            item, "fixturenames", ())
        item.add_marker(pytest.mark.xdist_group(SLURM_GROUP if on_slurm else item.path.stem))


def _test_id(item: pytest.Item) -> str:
    """The test's id without the "@group" xdist appends to it under --dist loadgroup."""
    groups = [m.args[0] for m in item.iter_markers("xdist_group")]
    return item.nodeid.removesuffix(f"@{groups[0]}") if groups else item.nodeid


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item):  # noqa: ANN201  (a hook wrapper's generator)
    """Before the test's fixtures run: the records already there (tests/golden_records.py)."""
    if golden_records.in_scope(_test_id(item), (m.name for m in item.iter_markers()), _CAPTURED):
        base = item.config._tmp_path_factory.getbasetemp()  # noqa: SLF001
        item.stash[_RECORDS_BEFORE] = golden_records.snapshot(base)
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):  # noqa: ANN201
    """After the test: each record it or its fixtures wrote held to its golden record."""
    result = yield
    if _RECORDS_BEFORE in item.stash:
        base = item.config._tmp_path_factory.getbasetemp()  # noqa: SLF001
        found = golden_records.after_test(_test_id(item), base, item.stash[_RECORDS_BEFORE])
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


@pytest.fixture(scope="session")
def digits_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scikit-learn's digits written by `make-dataset --source digits` (mode converge's
    dataset: a prepared folder with splits.npz), once per session."""
    out = tmp_path_factory.mktemp("digits") / "digits"
    proc = run_cli("make-dataset", "--source", "digits", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out
