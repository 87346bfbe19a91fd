"""tf_cnn_benchmarks: the flag mapping and the output parser on transcripts (fast, no framework),
and one real run through the CLI when a checkout is given in TF_CNN_BENCHMARKS_DIR (slow)."""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.plan.runs import RunSpec
from bench.records.store import check_record, load_records
from runners.common import Invalid, Unavailable
from runners.tf.cnn_benchmarks import (
    ENV_VAR,
    IMAGES_PER_SEC_SOURCE,
    benchmark,
    build_flags,
    find_script,
    left_to_script,
    parse_output,
    step_times,
    trace_op_seconds,
    trace_placement,
)
from runners.tf.op_kinds import (
    BATCHNORM_FORWARD,
    BATCHNORM_GRAD,
    CONV_BACKPROP_FILTER,
    CONV_BACKPROP_INPUT,
    CONV_FORWARD,
    count_kinds,
    op_kind,
)
from tests.helpers.cli import run_cli

DATA = Path(__file__).resolve().parent / "data" / "tf_cnn_benchmarks"


def make_spec(**over: Any) -> RunSpec:
    spec: dict[str, Any] = {
        "run_id": "r", "sweep_id": "s", "family": "tf", "module": "runners.tf.cnn_benchmarks",
        "virtual_devices": False, "scaling": "weak", "repeat": 0,
        "runner": "tf_cnn_benchmarks", "model": "resnet50", "num_devices": 2, "device": "gpu",
        "batch_size_per_device": 64, "global_batch_size": 128, "data": "synthetic",
        "precision": "fp32", "warmup_steps": 5, "measure_steps": 20, "timeout_s": 600,
        "options": {"variable_update": "replicated", "all_reduce_spec": None,
                    "local_parameter_device": "cpu", "data_format": "channels_last",
                    "benchmarks_dir": None},
    }
    spec.update(over)
    return RunSpec(**spec)  # the parent's spec: the options resolved over their defaults


def flag_dict(flags: list[str]) -> dict[str, str]:
    return dict(f[2:].split("=", 1) if "=" in f else (f[2:], "") for f in flags)


def test_module_imports_no_framework() -> None:
    assert "tensorflow" not in sys.modules


def test_flags_batch_is_per_device_and_devices_are_num_gpus() -> None:
    flags = flag_dict(build_flags(make_spec()))
    assert flags["batch_size"] == "64"  # per device, not the global 128
    assert flags["num_gpus"] == "2"
    assert flags["device"] == "gpu"
    assert flags["num_batches"] == "20" and flags["num_warmup_batches"] == "5"
    assert flags["display_every"] == "1"
    assert flags["variable_update"] == "replicated"
    assert flags["local_parameter_device"] == "cpu"
    assert "all_reduce_spec" not in flags and "use_fp16" not in flags and "data_dir" not in flags


def test_flags_strong_scaling_still_passes_the_per_device_batch() -> None:
    spec = make_spec(num_devices=4, batch_size_per_device=32, global_batch_size=128)
    assert flag_dict(build_flags(spec))["batch_size"] == "32"
    with pytest.raises(Invalid, match="per device"):
        build_flags(make_spec(global_batch_size=100))


def test_flags_model_names() -> None:
    assert flag_dict(build_flags(make_spec()))["model"] == "resnet50_v1.5"
    with pytest.raises(Unavailable, match="MiniGoogLeNet.*not among"):
        build_flags(make_spec(model="minigooglenet"))


def test_flags_data_format_and_device() -> None:
    nchw = make_spec(options={"data_format": "channels_first"})
    assert flag_dict(build_flags(nchw))["data_format"] == "NCHW"
    cpu = make_spec(device="cpu")
    assert flag_dict(build_flags(cpu))["data_format"] == "NHWC"
    assert flag_dict(build_flags(cpu))["device"] == "cpu"
    with pytest.raises(Unavailable, match="NHWC"):  # the script refuses NCHW on CPU
        build_flags(make_spec(device="cpu", options={"data_format": "channels_first"}))


def test_flags_variable_update_all_reduce_and_parameter_device() -> None:
    opts = {"variable_update": "parameter_server", "all_reduce_spec": "nccl",
            "local_parameter_device": "gpu"}
    flags = flag_dict(build_flags(make_spec(), opts))
    assert flags["variable_update"] == "parameter_server"
    assert flags["all_reduce_spec"] == "nccl"
    assert flags["local_parameter_device"] == "gpu"


def test_unset_options_leave_the_scripts_own_defaults() -> None:
    unset = {"variable_update": None, "all_reduce_spec": None, "local_parameter_device": None,
             "data_format": None, "benchmarks_dir": None, "script_model": None}
    gpu = build_flags(make_spec(), unset)
    names = set(flag_dict(gpu))
    # benchmark_cnn.py's defaults: parameter_server, ps on gpu, NCHW
    assert not names & {"variable_update", "local_parameter_device", "data_format"}
    assert left_to_script(gpu) == {"variable_update": "parameter_server",
                                   "local_parameter_device": "gpu", "data_format": "NCHW"}
    # on CPU the script refuses its default NCHW: the one layout it runs there is passed
    cpu = build_flags(make_spec(device="cpu"), unset)
    assert flag_dict(cpu)["data_format"] == "NHWC"
    assert left_to_script(cpu) == {"variable_update": "parameter_server",
                                   "local_parameter_device": "gpu"}


def test_flags_script_model_and_trace_file() -> None:
    assert flag_dict(build_flags(make_spec(), {"script_model": "resnet50"}))["model"] == \
        "resnet50"
    with pytest.raises(Unavailable, match="not a resnet50"):
        build_flags(make_spec(), {"script_model": "resnet101"})
    flags = flag_dict(build_flags(make_spec(), trace_file="/tmp/t.json"))
    assert flags["trace_file"] == "/tmp/t.json"


def test_trace_placement_from_a_real_two_device_trace() -> None:
    # the script's --trace_file of a 2-CPU-device ResNet-50 v1.5 run (batch 1 per device,
    # parameter_server), kept to its process names and executed-node events
    with gzip.open(DATA / "resnet50_cpu_2dev_trace.json.gz", "rt") as f:
        trace = json.load(f)
    placement, by_type = trace_placement(trace)
    assert sorted(placement) == ["/job:localhost/replica:0/task:0/device:CPU:0",
                                 "/job:localhost/replica:0/task:0/device:CPU:1"]
    assert all(v > 100 for v in placement.values())
    # its model: fused BatchNorm (53 layers per tower), plain SGD, L2 weight decay
    kinds = count_kinds(by_type)
    assert kinds[BATCHNORM_FORWARD] == kinds[BATCHNORM_GRAD] == 2 * 53
    assert kinds[CONV_FORWARD] == 2 * 53
    assert by_type["ApplyGradientDescent"] == 161
    assert "L2Loss" in by_type and "_SOURCE" not in by_type
    assert trace_placement({"traceEvents": []}) == ({}, {})
    seconds = trace_op_seconds(trace)
    assert set(seconds) == set(by_type) and all(v >= 0 for v in seconds.values())
    # the convolutions (forward or backward) dominate
    assert op_kind(max(seconds, key=seconds.get)) in (CONV_FORWARD, CONV_BACKPROP_FILTER,
                                                      CONV_BACKPROP_INPUT)


def test_flags_precision() -> None:
    assert "--use_fp16" in build_flags(make_spec(precision="fp16"))
    assert "--use_fp16" not in build_flags(make_spec())
    with pytest.raises(Unavailable, match="bf16"):
        build_flags(make_spec(precision="bf16"))


def test_flags_real_data_needs_a_data_dir() -> None:
    with pytest.raises(Unavailable, match="dataset.path"):
        build_flags(make_spec(data="real"))
    flags = flag_dict(build_flags(make_spec(data="real", dataset={"path": "/data/prepared"})))
    assert flags["data_dir"] == "/data/prepared/tfrecord"


def test_no_checkout_is_unavailable_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_VAR, raising=False)
    with pytest.raises(Unavailable) as err:
        benchmark(make_spec(device="cpu", num_devices=1, global_batch_size=64))
    reason = str(err.value)
    assert ENV_VAR in reason
    assert "runner_options.tf_cnn_benchmarks.benchmarks_dir" in reason
    assert "git clone https://github.com/tensorflow/benchmarks" in reason


def test_find_script_accepts_the_repo_root_or_the_script_folder(tmp_path: Path) -> None:
    folder = tmp_path / "scripts" / "tf_cnn_benchmarks"
    folder.mkdir(parents=True)
    (folder / "tf_cnn_benchmarks.py").write_text("")
    expected = (folder / "tf_cnn_benchmarks.py").resolve()
    assert find_script({}, {ENV_VAR: str(tmp_path)}) == expected
    assert find_script({}, {ENV_VAR: str(folder)}) == expected
    assert find_script({"benchmarks_dir": str(tmp_path)}, {}) == expected  # the option
    with pytest.raises(Unavailable, match="holds no tf_cnn_benchmarks.py"):
        find_script({}, {ENV_VAR: str(tmp_path / "nowhere")})


def test_parse_real_cpu_transcript() -> None:
    out = parse_output((DATA / "resnet50_cpu.txt").read_text())
    assert out["total_images_per_sec"] == 5.25
    assert out["model"] == "resnet50_v1.5"
    assert out["devices"] == ["/cpu:0"]
    assert out["global_batch"] == 2 and out["batch_per_device"] == 2
    assert out["data_format"] == "NHWC" and out["variables"] == "replicated"
    assert [s["step"] for s in out["steps"]] == [1, 2, 3, 4]
    assert out["first_loss"] == 6.986 and out["last_loss"] == 7.514
    assert out["timed_steps"] == 4 and out["samples"] == 8
    assert len(out["step_times_s"]) == 4
    assert all(0.3 < t < 0.45 for t in out["step_times_s"])  # ~5.3 images/sec, batch 2


def test_parse_real_two_cpu_device_transcript() -> None:
    out = parse_output((DATA / "resnet50_cpu_2dev.txt").read_text())
    assert out["devices"] == ["/cpu:0", "/cpu:1"]
    assert out["global_batch"] == 4 and out["batch_per_device"] == 2
    assert out["samples"] == 4 * 4
    assert out["total_images_per_sec"] == 5.13


def test_parse_handmade_two_gpu_transcript() -> None:
    out = parse_output((DATA / "handmade_2gpu.txt").read_text())
    assert out["devices"] == ["/gpu:0", "/gpu:1"]
    assert out["all_reduce"] == "nccl" and out["data_format"] == "NCHW"
    assert out["global_batch"] == 128 and out["batch_per_device"] == 64
    assert out["total_images_per_sec"] == 255.71
    assert out["samples"] == 6 * 128
    assert out["losses"] == [7.912, 7.905, 7.887, 7.861, 7.843, 7.820]
    assert out["steps"][1]["uncertainty"] == 3.5 and out["steps"][2]["jitter"] == 14.6
    # the transcript was made from these step times; rates are printed to 0.1 images/sec
    truth = [0.50, 0.52, 0.48, 0.50, 0.51, 0.49]
    assert out["step_times_s"] == pytest.approx(truth, abs=0.004)


def test_step_times_when_not_every_step_is_displayed() -> None:
    text = ("Batch size:  10 global\n"
            "1\timages/sec: 10.0 +/- 0.0 (jitter = 0.0)\t5.000\n"
            "3\timages/sec: 10.0 +/- 0.0 (jitter = 0.0)\t4.000\n"
            "total images/sec: 9.90\n")
    out = parse_output(text)
    assert out["step_times_s"] == [1.0, 1.0, 1.0]
    assert out["timed_steps"] == 3 and out["samples"] == 30
    # a rounding that would make a step non-positive gives no derived times
    assert step_times([{"step": 1, "images_per_sec_mean": 10.0},
                       {"step": 2, "images_per_sec_mean": 21.0}], 10) is None


def test_parse_output_without_a_run() -> None:
    out = parse_output("Traceback (most recent call last):\nValueError: boom\n")
    assert out["total_images_per_sec"] is None and out["steps"] == []
    assert out["first_loss"] is None and out["samples"] is None


@pytest.mark.slow
@pytest.mark.framework("tf")
@pytest.mark.skipif(not os.environ.get(ENV_VAR),
                    reason=f"set {ENV_VAR} to a checkout of tensorflow/benchmarks (git clone "
                           f"https://github.com/tensorflow/benchmarks) to run the real script")
def test_real_script_on_cpu(tmp_path: Path, tf_python: str) -> None:
    out = tmp_path / "tcb"
    proc = run_cli("--config", "configs/cpu-smoke.yaml", "--set", "runners=[tf_cnn_benchmarks]",
                   "--set", "models=[resnet50]", "--set", "warmup_steps=2",
                   "--set", "measure_steps=2", "--set", "batch_size_per_device=2",
                   "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = {r["num_devices"]: r for r in load_records(out)}
    assert sorted(records) == [1, 2]
    for n, rec in records.items():
        assert check_record(rec) == []
        assert rec["status"] == "ok", f"{rec['reason']}\n{Path(rec['log_path']).read_text()}"
        assert rec["samples"] == 2 * 2 * n
        assert rec["images_per_sec"] > 0
        assert rec["result"]["images_per_sec_source"] == IMAGES_PER_SEC_SOURCE
        assert len(rec["step_times_s"]) == 2
        assert len(rec["environment"]["devices"]) == n
        assert "total images/sec" in Path(rec["log_path"]).read_text()
        # where TF ran the traced step, from the script's own trace: both devices at n=2
        assert len(rec["placement"]) == n and all(v > 0 for v in rec["placement"].values())
        assert rec["result"]["left_to_script"]["variable_update"] == "parameter_server"
        assert rec["result"]["variable_update"] == "parameter_server"  # the script's header
        assert not any(f.startswith("--trace_file") for f in rec["result"]["flags"])
