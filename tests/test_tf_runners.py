"""Every TensorFlow-family runner for real on CPU: a few steps at 1 and 2 virtual devices
through the CLI, as a user runs it. (tf_mirrored's fuller sweep is in test_tf_mirrored.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.catalog.registry import RUNNERS
from bench.records.store import check_record
from tests.helpers.sweeps import SAMPLED, SAMPLED_STEPS, by_runner, smoke_runs
from tests.helpers.tensorpack import check_towers

pytestmark = [pytest.mark.slow, pytest.mark.framework("tf")]
TF_RUNNERS = sorted(n for n, r in RUNNERS.items() if r.family == "tf" and n != "tf_mirrored")
# Runners that need something from outside the project to run; without it they must say so.
NEEDS = {"tf_cnn_benchmarks": "TF_CNN_BENCHMARKS_DIR"}
TOWERS = ("keras_tf_kuza55", "keras_tf_multi_gpu_model", "keras_tf_avolkov1")
# the towers run small_cnn (a Keras builder; its 2 convolutions per tower); tf_native and
# tensorpack build MiniGoogLeNet in TF1 (small_cnn has no tfv1 builder): one sweep per model
MODELS = {"small_cnn": [r for r in TF_RUNNERS if r in TOWERS]}
MODELS["minigooglenet"] = [r for r in TF_RUNNERS if r not in TOWERS]
CONVS = {"small_cnn": 2, "minigooglenet": 19}
# timed steps and their sets by model: small_cnn's golden-checked records need SAMPLED
STEPS = {"small_cnn": (SAMPLED_STEPS, SAMPLED), "minigooglenet": (3, ())}


@pytest.fixture(scope="module")
def tf_sweep(tmp_path_factory: pytest.TempPathFactory, tf_python: str
             ) -> dict[str, dict[int, dict]]:
    """Every runner of TF_RUNNERS at 1 and 2 virtual devices, the smoke config shortened (one
    sweep per model, several runners each, as a user runs them); records by runner and devices
    (a runner whose NEEDS variable is set is left out: its real runs have their own file)."""
    records: dict[str, dict[int, dict]] = {}
    for model, runners in MODELS.items():
        chosen = [r for r in runners if not (NEEDS.get(r) and os.environ.get(NEEDS[r]))]
        out = tmp_path_factory.mktemp("tf-runners") / model
        records.update(by_runner(smoke_runs(out, f"runners=[{','.join(chosen)}]",
                                            f"models=[{model}]", *STEPS[model][1])))
    return records


@pytest.mark.parametrize("runner", TF_RUNNERS)
def test_runner_at_one_and_two_devices(runner: str, tf_sweep: dict) -> None:
    if NEEDS.get(runner) and os.environ.get(NEEDS[runner]):
        pytest.skip(f"{runner} has no MiniGoogLeNet; with {NEEDS[runner]} set, its real runs "
                    "are tested on ResNet-50 in its own test file")
    records = tf_sweep[runner]
    assert sorted(records) == [1, 2]
    missing = NEEDS.get(runner)
    for n, rec in records.items():
        assert check_record(rec) == []
        if missing and not os.environ.get(missing):
            assert rec["status"] == "unavailable" and missing in rec["reason"], rec["reason"]
            continue
        log = Path(rec["log_path"]).read_text()[-3000:]
        assert rec["status"] == "ok", f"{rec['reason']}\n{log}"
        assert rec["virtual_devices"] is True
        assert rec["samples"] == STEPS[rec["model"]][0] * 8 * n
        assert rec["images_per_sec"] > 0
        assert len(rec["environment"]["devices"]) == n
        assert len(rec["placement_check"]["devices"]) == n  # distinct, as TF names them
        if runner in TOWERS:  # one tower's convolutions on each device, from the trace
            work = rec["placement_check"]["work"]["forward_convs_per_device"]
            assert work["measured"] == work["expected"] == \
                {f"cpu:{i}": CONVS[rec["model"]] for i in range(n)}, work
            assert rec["result"]["departs_from_original"] == []


def test_tensorpack_replicated_with_staging_input_on_distinct_devices(tf_sweep: dict) -> None:
    """tensorpack's registry defaults (replicated, staging), read from the sweep above (the
    same runs; its other trainers: tests/test_tensorpack.py)."""
    for n, rec in tf_sweep["tensorpack"].items():
        result = rec["result"]
        assert result["trainer"] == "SyncMultiGPUTrainerReplicated"
        assert result["input"] == "StagingInput(QueueInput)"
        assert result["allreduce"] == "gpu"  # tensorpack's own choice below 8 GPUs on TF 2
        assert result["gradient_packer"].startswith("not used"), result["gradient_packer"]
        check_towers(result, n)


def test_tf_native_fused_batchnorm_is_keras_batchnorm(tf_python: str) -> None:
    """FusedBatchNormV3 in place of Keras 3's BatchNormalization: the same outputs, gradients
    and moving statistics (training and inference), in both layouts; the swapped ResNet-50 has
    the spec's parameters under the same canonical names."""
    from models import get_spec
    from tests.helpers.cli import run_child

    out = run_child(tf_python, "tests/children/tf_fused_batchnorm.py")
    assert out["diffs"], out
    for fmt, diffs in out["diffs"].items():
        assert max(diffs) < 1e-5, (fmt, diffs)
    assert out["swapped"] == out["fused_layers"] == 53
    assert out["params"] == get_spec("resnet50").params
    assert out["same_names"]


def _tf_native_equivalence(tmp_path: Path, tf_python: str, n: int, options: dict) -> dict:
    import numpy as np

    from bench.plan.runs import RunSpec
    from bench.run.launch import launch
    from models import get_spec

    inputs, out = tmp_path / "in.npz", tmp_path / f"out-n{n}-{len(options)}.npz"
    if not inputs.exists():
        rng = np.random.default_rng(7)
        probe = get_spec("probe")
        weights = {f"w:{k}": (rng.standard_normal(s) * 0.3).astype(np.float32)
                   for k, s in probe.weights}
        np.savez(inputs, x=rng.standard_normal((8, *probe.input_shape)).astype(np.float32),
                 y=rng.integers(0, probe.num_classes, 8).astype(np.int32), **weights)
    info = RUNNERS["tf_native"]
    spec = RunSpec(
        run_id=f"tfn-n{n}-{len(options)}", sweep_id="tfn", runner="tf_native", family="tf",
        module=info.module, model="probe", num_devices=n, device="cpu", virtual_devices=True,
        scaling="strong", batch_size_per_device=8 // n, global_batch_size=8, data="synthetic",
        precision="fp32", warmup_steps=0, measure_steps=1, repeat=0, timeout_s=300,
        options={**{k: o.default for k, o in info.options.items()}, **options},
        mode="equivalence", launcher=info.launcher,
        equivalence={"inputs": str(inputs), "output": str(out), "learning_rate": 0.5})
    rec = launch(spec, tf_python, tmp_path, {})
    if out.exists():
        with np.load(out) as data:
            rec["weights"] = {k: data[k] for k in data.files}
    return rec


@pytest.mark.parametrize("onednn", ["0", "1"], ids=["onednn-off", "onednn-on"])
def test_tf_native_xla(onednn: str, tmp_path: Path, tf_python: str,
                       monkeypatch: pytest.MonkeyPatch) -> None:
    """xla=true compiles the same step: at 1 device it gives the weights of the plain step; at
    2 virtual CPU devices XLA runs the replicas on one device that cannot reach the other's
    variables, and the run says so (invalid, TF's words), never a pass. The plain step's ops
    are counted by kind (runners/tf/op_kinds.py), with oneDNN off and on (its op names, as on
    AVX-512 hosts), so either kind of host passes."""
    import numpy as np

    from runners.tf.op_kinds import CONV_BACKPROP_FILTER, CONV_FORWARD, count_kinds

    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", onednn)
    plain = _tf_native_equivalence(tmp_path, tf_python, 1, {})
    xla = _tf_native_equivalence(tmp_path, tf_python, 1, {"xla": True})
    assert plain["status"] == xla["status"] == "ok", (plain["reason"], xla["reason"])
    assert xla["placement"] and all(v > 0 for v in xla["placement"].values())
    # the step's own ops, once: the probe's one convolution (which Grappler fuses with its
    # bias and ReLU) and its kernel's gradient
    by_type = plain["result"]["compute_ops_by_type"]
    assert any(op.startswith("_Mkl") for op in by_type) is (onednn == "1"), by_type
    kinds = count_kinds(by_type)
    assert kinds[CONV_FORWARD] == 1 and kinds[CONV_BACKPROP_FILTER] == 1, by_type
    assert plain["weights"], plain
    for name, value in plain["weights"].items():
        np.testing.assert_allclose(xla["weights"][name], value, rtol=1e-5, atol=1e-6)
    two = _tf_native_equivalence(tmp_path, tf_python, 2, {"xla": True})
    assert two["status"] == "invalid", two
    assert "Trying to access resource" in two["reason"], two["reason"]
