"""The 2017 Keras tower runners on Keras 2 (keras_tf_kuza55, keras_tf_multi_gpu_model,
keras_tf_avolkov1; runners/tf/towers.py, towers_input.py, towers_run.py): what the generic
equivalence, real-data and CLI tests do not cover. Where each strategy's ops ran is read from
TensorFlow's partition graphs, never from the device names the runner asked for. Run for real
on virtual CPU devices in the TF environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.catalog.registry import RUNNERS
from bench.plan.runs import RunSpec
from bench.run.launch import launch
from models.small_cnn.spec import FILTERS as SMALL_CNN_FILTERS
from tests.helpers.cli import run_child
from tests.helpers.equivalence import make_inputs

pytestmark = [pytest.mark.slow, pytest.mark.framework("tf")]
CPU = "/job:localhost/replica:0/task:0/device:CPU:{}"


def child_spec(runner: str, n: int, global_batch: int, *, model: str = "probe",
               mode: str = "benchmark", options: dict | None = None,
               equivalence: dict | None = None) -> RunSpec:
    info = RUNNERS[runner]
    opts = "".join(f"-{k}={v}" for k, v in (options or {}).items())
    return RunSpec(
        run_id=f"{runner}-{mode}-n{n}-gb{global_batch}{opts}", sweep_id="towers",
        runner=runner, family=info.family, module=info.module, model=model, num_devices=n,
        device="cpu", virtual_devices=True, scaling="strong",
        batch_size_per_device=global_batch // n, global_batch_size=global_batch,
        data="synthetic", precision="fp32", warmup_steps=1, measure_steps=2, repeat=0,
        timeout_s=600,
        options={**{k: o.default for k, o in info.options.items()}, **(options or {})},
        mode=mode, equivalence=equivalence)


def run(runner: str, n: int, batch: int, tmp_path: Path, python: str,
        options: dict | None = None) -> dict:
    rec = launch(child_spec(runner, n, batch, options=options), python, tmp_path, {})
    assert rec["status"] == "ok", (rec["reason"], Path(rec["log_path"]).read_text()[-3000:])
    return rec


def test_slicing_follows_each_original(tf_python: str) -> None:
    """B=10 over 3 towers: kuza55 drops the remainder ([3, 3, 3]); multi_gpu_model and avolkov1
    give the last tower the rest ([3, 3, 4]). kuza55 and multi_gpu_model 2.1 slice on each
    tower's device, 2.2 on the input's device (CPU:0), avolkov1 on the parameter device: as TF
    placed the slices. The merged output equals the template's on the rows kept."""
    out = run_child(tf_python, "tests/children/towers_slicing.py", timeout=600)
    assert out["kuza55"]["rows"] == out["kuza55"]["split"] == [3, 3, 3]
    assert out["kuza55"]["merged"] == 9
    for name in ("mgm21", "mgm22", "avolkov1"):
        assert out[name]["rows"] == out[name]["split"] == [3, 3, 4], name
        assert out[name]["merged"] == 10, name
    for name, o in out.items():
        assert o["max_diff"] < 1e-5, (name, o)
    every = [CPU.format(i) for i in range(3)]
    assert out["kuza55"]["slice_devices"] == every
    assert out["mgm21"]["slice_devices"] == every
    assert out["mgm22"]["slice_devices"] == [CPU.format(0)]
    assert out["avolkov1"]["slice_devices"] == [CPU.format(0)]


def test_kuza55_refuses_an_uneven_batch(tmp_path: Path, tf_python: str) -> None:
    rec = launch(child_spec("keras_tf_kuza55", 3, 10), tf_python, tmp_path, {})
    assert rec["status"] == "invalid", rec["reason"]
    assert "drop" in rec["reason"] and "10" in rec["reason"], rec["reason"]


@pytest.mark.parametrize("runner", ["keras_tf_multi_gpu_model", "keras_tf_avolkov1"])
def test_one_device_baseline_is_the_plain_model(runner: str, tmp_path: Path,
                                                tf_python: str) -> None:
    """At 1 device the originals refuse (multi_gpu_model) or return the serial model
    (avolkov1): the record says plain model, and TF ran it on that one device; with
    wrap_single_device the wrapper is built (its merge/slicing on /cpu:0 = device 0 here)."""
    plain = run(runner, 1, 8, tmp_path, tf_python)["result"]
    assert plain["wrapped"] is False and plain["baseline"].startswith("plain model, as ")
    assert list(plain["placement"]) == [CPU.format(0)]
    wrapped = run(runner, 1, 8, tmp_path, tf_python, {"wrap_single_device": True})["result"]
    assert wrapped["wrapped"] is True and "baseline" not in wrapped
    assert list(wrapped["placement"]) == [CPU.format(0)]
    # the wrapper adds ops (slice, concatenate) to the same step
    assert wrapped["placement"][CPU.format(0)] > plain["placement"][CPU.format(0)]


def test_kuza55_wraps_at_one_device(tmp_path: Path, tf_python: str) -> None:
    res = run("keras_tf_kuza55", 1, 8, tmp_path, tf_python)["result"]
    assert res["wrapped"] is True and res["tower_devices"] == ["/cpu:0"]


@pytest.mark.parametrize("onednn", ["0", "1"], ids=["onednn-off", "onednn-on"])
def test_each_tower_device_runs_one_towers_work(onednn: str, tf_python: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """At 2 devices every tower strategy executes, per device, one tower's forward and filter
    gradient convolutions (small_cnn's 2 each: the mechanics, on the smallest CNN with
    BatchNorm) and nothing on the template's whole batch: before Keras 2's owned-node updates
    came back, CPU:0 ran twice its tower's forward convolutions.
    The tower BatchNorm updates still run (the shared moving mean moves). Counted by op kind,
    so oneDNN's op names (TF_ENABLE_ONEDNN_OPTS=1, the default on AVX-512 hosts) count the
    same as the plain ones: both settings run on any host. avolkov1's average_gradients builds
    the merged loss's gradients once per device (twice the filter gradients in the graph) and
    TF runs both copies: through BatchNorm's learning-phase cond its common-subexpression
    elimination cannot merge them (on the probe, without BatchNorm, it does)."""
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", onednn)
    out = run_child(tf_python, "tests/children/towers_work.py", "small_cnn", timeout=600)
    convs = len(SMALL_CNN_FILTERS)  # one conv layer per filter block (models/small_cnn/spec.py)
    one_tower = {CPU.format(0): convs, CPU.format(1): convs}
    assert out, "the check script counted no strategy"
    for name, o in out.items():
        assert o["onednn_ops"] is (onednn == "1"), (name, "the setting did not reach TF")
        assert o["convs_per_tower"] == convs, name
        assert o["forward_convs_per_device"] == one_tower, (name, o)
        # SGD_MGPU's two gradient copies both run: BatchNorm's cond stops TF's CSE
        copies = 2 if name.endswith("-average") else 1
        assert o["backward_convs_per_device"] == {d: copies * n for d, n in one_tower.items()}, \
            (name, o)
        assert o["problems"] == [], (name, o["problems"])
        assert o["checked"] == ["backward_convs_per_device", "forward_convs_per_device"]
        assert o["bn_moved"] > 0, (name, "the towers' BatchNorm updates did not run")
    assert (out["keras_tf_avolkov1-average"]["conv_backprop_filter_ops_built"]
            == 2 * out["keras_tf_avolkov1"]["conv_backprop_filter_ops_built"] > 0)


def test_avolkov1_nccl_step_fetches_every_devices_all_reduce(tf_python: str) -> None:
    """usenccl: one NcclAllReduce per device and variable, and the step fetches all of them
    (an NCCL all-reduce whose peers do not all run never completes), through one SGD update
    per device as SGD_MGPU's get_updates made them. Built, not run: NCCL has no CPU kernel."""
    out = run_child(tf_python, "tests/children/towers_nccl.py", timeout=600)
    assert out["params"] == 4  # the probe: a convolution and a dense layer, kernel and bias
    assert out["nccl"] == out["fetched"] == 3 * 4, out
    assert len(out["devices"]) == 3, out
    assert out["updates"] == 3 * 4, out


@pytest.mark.parametrize("options", [{}, {"cpu_relocation": True, "cpu_merge": False,
                                          "keras_version": "2.1"}],
                         ids=["defaults", "relocation-gpu-merge-2.1"])
def test_multi_gpu_model_saves_its_template(options: dict, tmp_path: Path,
                                            tf_python: str) -> None:
    rec = run("keras_tf_multi_gpu_model", 2, 8, tmp_path, tf_python, options)
    result = rec["result"]
    assert result["saved_template_ok"] is True
    assert result["split"] == [4, 4] and result["wrapped"] is True
    assert sorted(result["placement"]) == [CPU.format(0), CPU.format(1)]
    assert result["variables_device"].endswith("CPU:0")
    assert result["cpu_relocation"] is options.get("cpu_relocation", False)
    assert result["cpu_merge"] is options.get("cpu_merge", True)
    assert result["merge_device"] == "/cpu:0"  # CPU:0, or the first device: /cpu:0 here
    assert result["keras_version"] == options.get("keras_version", "2.2")
    # the docstring's example for these arguments: Example 1 on /cpu:0, Example 3 no scope
    assert result["template_built_on"] == ("default" if options else "cpu")
    # what differs from the original's own usage is named (the summary's "vs original")
    assert sorted(result["departs_from_original"]) == sorted(f"{k}={v}"
                                                             for k, v in options.items())


def test_staging_trains_on_the_batch_put_one_step_before(tmp_path: Path,
                                                        tf_python: str) -> None:
    """A step reads the StagingArea's previous put: primed with batch A and fed batch B, it
    gives the same weights as a step primed with A and fed A."""
    inputs = tmp_path / "inputs.npz"
    make_inputs(inputs)
    diffs = run_child(tf_python, "tests/children/towers_staging.py", str(inputs), timeout=600)
    assert diffs and max(diffs.values()) < 1e-6, diffs
