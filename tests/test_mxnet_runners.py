"""The MXNet-family runners for real on CPU: a few steps at 1 and 2 MXNet CPU contexts through
the CLI, as a user runs them, and the runs that cannot happen on CPU saying why."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from bench.catalog.registry import RUNNERS
from bench.records.store import check_record
from tests.helpers.equivalence import make_inputs, step
from tests.helpers.sweeps import by_runner, smoke_runs, smoke_sweep

pytestmark = [pytest.mark.slow, pytest.mark.framework("mxnet")]
MXNET_RUNNERS = sorted(n for n, r in RUNNERS.items() if r.family == "mxnet")


def test_mxnet_family_is_registered() -> None:
    assert MXNET_RUNNERS == ["keras_mxnet", "mxnet_native"]


@pytest.fixture(scope="module")
def mxnet_sweep(tmp_path_factory: pytest.TempPathFactory, mxnet_python: str
                ) -> dict[str, dict[int, dict]]:
    """The smoke config shortened, every runner of MXNET_RUNNERS in one sweep at 1 and 2
    contexts; records by runner and devices."""
    out = tmp_path_factory.mktemp("mxnet-runners")
    return by_runner(smoke_runs(out, f"runners=[{','.join(MXNET_RUNNERS)}]"))


@pytest.mark.parametrize("runner", MXNET_RUNNERS)
def test_runner_at_one_and_two_devices(runner: str, mxnet_sweep: dict) -> None:
    records = mxnet_sweep[runner]
    assert sorted(records) == [1, 2]
    for n, rec in records.items():
        assert check_record(rec) == []
        log = Path(rec["log_path"]).read_text()[-3000:]
        assert rec["status"] == "ok", f"{rec['reason']}\n{log}"
        assert rec["virtual_devices"] is True
        assert rec["samples"] == 3 * 8 * n
        assert rec["images_per_sec"] > 0
        result = rec["result"]
        assert result["replicas"] == n
        assert result["layout"] == "channels_first"
        assert result["framework"]["mxnet"] == "1.9.1"
        assert result["params"] == 1_656_250 and result["flops_per_sample"] == 469_195_840
        # where the timed steps ran, read from MXNet, and the threads the run used
        assert result["threads"]["mxnet"]["openmp"] is True
        assert "OMP_NUM_THREADS" in result["threads"]["env"]
        assert rec["placement"] == PLACEMENT[runner][n], rec["placement"]
        assert bool(result.get("placement_collapsed")) == (runner == "keras_mxnet" and n == 2)


# rows of the global batch per context: mxnet_native one slice per context; keras-mxnet binds
# every cpu(i) to cpu(0), so its N executors' slices all land there
PLACEMENT = {"mxnet_native": {1: {"cpu(0)": 8}, 2: {"cpu(0)": 8, "cpu(1)": 8}},
             "keras_mxnet": {1: {"cpu(0)": 8}, 2: {"cpu(0)": 16}}}


def test_keras_mxnet_collapses_cpu_contexts(mxnet_sweep: dict) -> None:
    """Two executors, one slice each, both on cpu(0): the record shows it and says why (the
    2-context run of the sweep above)."""
    rec = mxnet_sweep["keras_mxnet"][2]
    assert rec["status"] == "ok", rec["reason"]
    result = rec["result"]
    assert result["placement_executors"] == [["cpu(0)", 8], ["cpu(0)", 8]]
    assert "maps every 'cpu(i)' to mx.cpu()" in result["placement_collapsed"]


@pytest.fixture(scope="module")
def options_sweep(tmp_path_factory: pytest.TempPathFactory, mxnet_python: str
                  ) -> dict[str, dict[int, dict]]:
    """Both runners at 2 contexts in one sweep, each with its other options (mxnet_native:
    kvstore local, not hybridised; keras_mxnet: fit on arrays); records by runner and devices."""
    out = tmp_path_factory.mktemp("mxnet-options")
    return by_runner(smoke_runs(out, f"runners=[{','.join(MXNET_RUNNERS)}]", "devices=[2]",
                                "runner_options.mxnet_native.kvstore=local",
                                "runner_options.mxnet_native.hybridize=false",
                                "runner_options.keras_mxnet.input=arrays"))


def test_mxnet_native_options(options_sweep: dict) -> None:
    """kvstore local and an imperative (not hybridised) net both train at 2 contexts."""
    rec = options_sweep["mxnet_native"][2]
    assert rec["status"] == "ok", rec["reason"]
    assert rec["result"]["kvstore"] == "local" and rec["result"]["hybridize"] is False
    assert rec["placement"] == {"cpu(0)": 8, "cpu(1)": 8}
    assert rec["result"]["parameter_copies"]["cpu(0)"] == rec["result"]["parameter_copies"][
        "cpu(1)"] > 0


def test_keras_mxnet_fit_on_arrays(options_sweep: dict) -> None:
    rec = options_sweep["keras_mxnet"][2]
    assert rec["status"] == "ok", rec["reason"]
    assert rec["result"]["input"] == "arrays" and rec["samples"] == 3 * 16


def test_what_cpu_contexts_cannot_do_is_unavailable(tmp_path: Path, mxnet_python: str) -> None:
    """fp16 and the nccl kvstore need GPUs: unavailable records with the reason, no crash."""
    fp16 = smoke_sweep(tmp_path / "fp16", "runners=[mxnet_native]", "devices=[1]", "precision=fp16")
    assert fp16[1]["status"] == "unavailable" and "fp16" in fp16[1]["reason"]
    nccl = smoke_sweep(tmp_path / "nccl", "runners=[mxnet_native]", "devices=[2]",
                 "runner_options.mxnet_native.kvstore=nccl")
    assert nccl[2]["status"] == "unavailable" and "nccl" in nccl[2]["reason"]


def test_keras_mxnet_sums_gradients_over_contexts(tmp_path: Path, mxnet_python: str) -> None:
    """keras-mxnet as is (gradient_reduce: sum) steps N times as far at N contexts: the reason
    the runner's default divides the learning rate by N (equivalence test)."""
    make_inputs(tmp_path / "inputs.npz")
    with np.load(tmp_path / "inputs.npz") as data:
        initial = {k[2:]: data[k] for k in data.files if k.startswith("w:")}
    moved = {n: step("keras_mxnet", n, tmp_path / "inputs.npz", tmp_path, mxnet_python,
                     {"gradient_reduce": "sum"}) for n in (1, 2)}
    for name, w0 in initial.items():
        np.testing.assert_allclose(moved[2][name] - w0, 2 * (moved[1][name] - w0), rtol=1e-3,
                                   atol=1e-6, err_msg=name)
