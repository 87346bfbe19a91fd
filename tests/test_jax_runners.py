"""The JAX-family runners for real on CPU: a few steps at 1 and 2 virtual CPU devices (XLA host
platform) through the CLI, as a user runs them, bf16 on 2, and the BatchNorm semantics their
docstrings state (statistics over the global batch, not per device)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.records import check_record
from bench.registry import RUNNERS
from runners.jax_common import CPU_KIND, _with_device_count
from tests.conftest import run_check_script, smoke_sweep

JAX_RUNNERS = sorted(n for n, r in RUNNERS.items() if r.family == "jax")

# Runs in the jax interpreter: one BatchNorm step, in Flax under jit with a sharded batch and in
# Keras under DataParallel, on 2 devices whose halves of the batch have different moments.
BN_CHECK = r"""
import json
import numpy as np
from runners.keras_jax import batch_sharding, make_distribution

keras, distribution, _ = make_distribution({"num_devices": 2, "device": "cpu"})
import flax.linen as nn
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

rng = np.random.default_rng(0)
x = np.concatenate([rng.normal(0, 1, (4, 3)), rng.normal(5, 2, (4, 3))]).astype(np.float32)
mesh = Mesh(np.array(jax.devices()), ("data",))
bn = nn.BatchNorm(use_running_average=False, momentum=0.0, epsilon=0.0)
variables = jax.device_put(bn.init(jax.random.key(0), x), NamedSharding(mesh, P()))
xs = jax.device_put(x, NamedSharding(mesh, P("data")))
_, updates = jax.jit(lambda v, x: bn.apply(v, x, mutable=["batch_stats"]))(variables, xs)
layer = keras.layers.BatchNormalization(momentum=0.0, epsilon=0.0, center=False, scale=False)
inputs = keras.Input((3,))
model = keras.Model(inputs, layer(inputs))
model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse")
model.train_on_batch(x, np.zeros_like(x))
print("RESULT " + json.dumps({
    "rows_per_device": [s.data.shape[0] for s in xs.addressable_shards],
    "keras_rows_per_device": batch_sharding(distribution, x.shape).shard_shape(x.shape)[0],
    "flax_var": np.asarray(updates["batch_stats"]["var"]).tolist(),
    "keras_var": np.asarray(layer.moving_variance.value).tolist(),
    "global_var": x.var(0).tolist(),
    "per_device_var": ((x[:4].var(0) + x[4:].var(0)) / 2).tolist()}))
"""



def test_jax_family_is_registered() -> None:
    assert JAX_RUNNERS == ["jax_native", "keras_jax"]
    assert all(RUNNERS[n].precisions == ("fp32", "bf16") for n in JAX_RUNNERS)


def test_device_count_flag_is_appended_or_replaced() -> None:
    assert _with_device_count("", 2) == "--xla_force_host_platform_device_count=2"
    assert _with_device_count("--xla_dump_to=/tmp/x", 4) == (
        "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=4")
    assert _with_device_count("--xla_force_host_platform_device_count=8 --a=1", 2) == (
        "--a=1 --xla_force_host_platform_device_count=2")


def check_ok(rec: dict, n: int) -> dict:
    """The common checks of an ok record at n virtual devices; its runner's result."""
    assert check_record(rec) == []
    log = Path(rec["log_path"]).read_text()[-3000:]
    assert rec["status"] == "ok", f"{rec['reason']}\n{log}"
    assert rec["virtual_devices"] is True
    assert rec["samples"] == 3 * 8 * n
    assert rec["images_per_sec"] > 0
    result = rec["result"]
    assert result["replicas"] == n
    assert result["layout"] == "channels_last"
    assert result["framework"]["jax"] == "0.10.2"
    assert [d["kind"] for d in result["devices"]] == [CPU_KIND] * n
    assert [d["id"] for d in result["devices"]] == list(range(n))
    assert result["shardings"]["per_device_batch"] == 8
    assert result["params"] == 1_656_250 and result["flops_per_sample"] == 469_195_840
    return result


@pytest.mark.parametrize("runner", JAX_RUNNERS)
@pytest.mark.slow
@pytest.mark.framework("jax")
def test_runner_at_one_and_two_devices(runner: str, tmp_path: Path, jax_python: str) -> None:
    records = smoke_sweep(tmp_path / runner, f"runners=[{runner}]")
    assert sorted(records) == [1, 2]
    for n, rec in records.items():
        result = check_ok(rec, n)
        if runner == "jax_native":
            assert result["framework"]["flax"] == "0.12.8"
            assert result["shardings"]["batch"] == f"NamedSharding(mesh={{data: {n}}}, " \
                                                   "spec=P('data',))"
            # XLA's SPMD partitioner adds the all-reduces only when there is more than 1 device
            assert (result["collectives"]["all-reduce"] > 0) == (n > 1)
        else:
            assert result["framework"]["keras"] == "3.15.1"
            assert result["shardings"]["mesh"] == {"batch": n}
            assert result["dtype_policy"] == "float32"


@pytest.mark.slow
@pytest.mark.framework("jax")
def test_jax_native_bf16(tmp_path: Path, jax_python: str) -> None:
    rec = smoke_sweep(tmp_path, "runners=[jax_native]", "devices=[2]", "precision=bf16")[2]
    result = check_ok(rec, 2)
    assert rec["precision"] == "bf16"
    assert result["dtype"] == "bfloat16 compute, float32 params"


@pytest.mark.slow
@pytest.mark.framework("jax")
def test_batchnorm_statistics_are_over_the_global_batch(jax_python: str) -> None:
    """Under global-view jit (jax_native) and Keras DataParallel (keras_jax) a BatchNorm on a
    batch sharded over 2 devices takes the moments of the whole batch (XLA all-reduces them),
    not the mean of per-device moments as MirroredStrategy or DDP would."""
    r = run_check_script(jax_python, BN_CHECK, env={"XLA_FLAGS": ""}, timeout=300)
    assert r["rows_per_device"] == [4, 4] and r["keras_rows_per_device"] == 4
    assert r["flax_var"] == pytest.approx(r["global_var"], rel=1e-5)
    assert r["keras_var"] == pytest.approx(r["global_var"], rel=1e-5)
    assert r["flax_var"] != pytest.approx(r["per_device_var"], rel=0.1)
