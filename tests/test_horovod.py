"""The Horovod family: the source build's C++17 patch (fast), and the horovod runner for real on
CPU (slow): a few steps at 1 and 2 gloo ranks through the CLI, as a user runs them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from bench.records.store import check_record
from bench.run.envs import ensure_env
from contract.reasons import sentence
from models import get_spec
from tests.helpers.cli import REPO
from tests.helpers.equivalence import make_inputs, step
from tests.helpers.sweeps import SAMPLED, SAMPLED_STEPS, smoke_sweep


def load_build_script() -> ModuleType:
    """envs/horovod_build.py as a module, without running the build (it is a plain script)."""
    spec = importlib.util.spec_from_file_location("horovod_build", REPO / "envs/horovod_build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cmake_patch_raises_cxx_standard_to_17() -> None:
    build = load_build_script()
    text = "project(horovod CXX)\nset(CMAKE_CXX_STANDARD 14)\nset(CMAKE_CXX_STANDARD_REQUIRED ON)\n"
    patched = build.patch_cxx_standard(text)
    assert patched == text.replace("STANDARD 14)", "STANDARD 17)")
    nested = 'if(NOT Pytorch_VERSION VERSION_LESS "1.5.0")\n    set(CMAKE_CXX_STANDARD 14)\nendif()'
    assert "    set(CMAKE_CXX_STANDARD 17)\n" in build.patch_cxx_standard(nested)


def test_cmake_patch_fails_loudly_without_the_line() -> None:
    build = load_build_script()
    with pytest.raises(build.BuildError, match="CMAKE_CXX_STANDARD 14"):
        build.patch_cxx_standard("set(CMAKE_CXX_STANDARD 17)\n", "CMakeLists.txt")


def test_build_reason_names_the_first_compiler_error() -> None:
    build = load_build_script()
    log = ["[ 50%] Building CXX object x.o",
           "/tmp/h/horovod/torch/mpi_ops_v2.cc:12:3: error: 'optional' is not a member of 'std'",
           "/tmp/h/horovod/torch/mpi_ops_v2.cc:40:1: error: later error",
           "error: subprocess-exited-with-error"]
    assert build.first_error(log).endswith("error: 'optional' is not a member of 'std'")


@pytest.fixture(scope="module")
def horovod_python() -> str:
    """The Horovod environment's interpreter, built (from source, minutes) on first use."""
    return str(ensure_env("horovod", "cpu").python)


# the runs check the runner's mechanics (ranks, placement, fp16 all-reduce), not the model;
# the golden-checked one times SAMPLED steps (tests/helpers/sweeps.py)
MECHANICS = "models=[small_cnn]"


@pytest.mark.slow
@pytest.mark.framework("horovod")
def test_horovod_at_one_and_two_ranks(tmp_path: Path, horovod_python: str) -> None:
    records = smoke_sweep(tmp_path, "runners=[horovod]", MECHANICS, *SAMPLED)
    small_cnn = get_spec("small_cnn")
    assert sorted(records) == [1, 2]
    for n, rec in records.items():
        assert check_record(rec) == []
        log = Path(rec["log_path"]).read_text()[-3000:]
        assert rec["status"] == "ok", f"{rec['reason']}\n{log}"
        assert rec["virtual_devices"] is True
        assert rec["samples"] == SAMPLED_STEPS * 8 * n
        assert rec["images_per_sec"] > 0
        result = rec["result"]
        # DistributedOptimizer.step() runs the step hooks twice (its own and SGD's): counted once
        assert result["replicas"] == n and result["steps_per_rank"] == [SAMPLED_STEPS] * n
        # read back from Horovod: hvd.size() ranks, each one's device and the rows it stepped on
        assert rec["placement"] == {f"rank{i}:cpu": SAMPLED_STEPS * 8 for i in range(n)}
        assert f"hvd.size()={n}, controller gloo" in sentence(result["placement_source"])
        assert len(rec["environment"]["devices"]) == n
        assert result["rank_threads"]["processes"] == n
        assert [t["rank"] for t in result["rank_threads"]["per_rank"]] == list(range(n))
        assert result["layout"] == "channels_first" and result["fp16_allreduce"] is False
        assert result["controller"] == "gloo"
        assert rec["environment"]["framework"]["horovod"] == "0.28.1"
        assert result["params"] == small_cnn.params == 60_746
        assert result["flops_per_sample"] == small_cnn.flops_per_sample == 11_288_576


@pytest.mark.slow
@pytest.mark.framework("horovod")
def test_horovod_fp16_allreduce(tmp_path: Path, horovod_python: str) -> None:
    """Gradients compressed to float16 for the all-reduce still train at 2 ranks."""
    records = smoke_sweep(tmp_path, "runners=[horovod]", "devices=[2]", MECHANICS,
                          "runner_options.horovod.fp16_allreduce=true")
    rec = records[2]
    assert rec["status"] == "ok", rec["reason"]
    assert rec["result"]["fp16_allreduce"] is True and rec["samples"] == 3 * 16


@pytest.mark.slow
@pytest.mark.framework("horovod")
def test_fp16_allreduce_step_equals_one_device_at_float16_precision(tmp_path: Path,
                                                                      horovod_python: str
                                                                      ) -> None:
    """The benchmark's step with fp16_allreduce at 2 ranks against 1 rank (where Horovod
    reduces nothing): the same update up to float16 rounding of the exchanged gradients
    (2^-11 relative each, twice: the cast and the float16 sum), and not exactly the same, so the
    compressed all-reduce did run. A summed or unsynchronised gradient is off by far more."""
    inputs = tmp_path / "inputs.npz"
    make_inputs(inputs)
    options = {"fp16_allreduce": True}
    one = step("horovod", 1, inputs, tmp_path, horovod_python, options)
    two = step("horovod", 2, inputs, tmp_path, horovod_python, options)
    with np.load(inputs) as data:
        initial = {k[2:]: data[k] for k in data.files if k.startswith("w:")}
    largest_difference = 0.0
    for name in initial:
        update = np.abs(one[name] - initial[name]).max()
        assert update > 1e-3, f"{name} did not move"
        difference = np.abs(two[name] - one[name]).max()
        assert difference <= 2 * 2.0 ** -10 * update + 1e-6, (name, difference, update)
        largest_difference = max(largest_difference, difference)
    assert largest_difference > 1e-6, "2 ranks matched 1 exactly: nothing was rounded to fp16"
