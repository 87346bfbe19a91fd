"""The JAX-family runners for real on CPU: a few steps at 1 and 2 virtual CPU devices (XLA host
platform) through the CLI, as a user runs them, bf16 on 2, keras_jax's preplaced input and
global BatchNorm, the placement read back from jax, and the BatchNorm semantics of both
`batchnorm` modes (per-device statistics or over the global batch)."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from bench.catalog.registry import RUNNERS
from bench.plan.config import load_config
from bench.plan.runs import RunSpec, expand
from bench.records.store import check_record
from bench.run.sweep import precheck
from contract.reasons import sentence
from contract.spec import spec_for
from runners.jax.common import CPU_KIND, _with_device_count
from tests.helpers.cli import REPO, run_child
from tests.helpers.sharding import assert_replicas
from tests.helpers.sweeps import smoke_sweep

JAX_RUNNERS = sorted(n for n, r in RUNNERS.items() if r.family == "jax")
# (params, flops per sample) the runners report, BatchNorm's moving statistics counted, of
# small_cnn: the model of these tests of a runner's mechanics (devices, options, precision,
# input modes) and of the golden runs, where the model does not matter and compiles 3x faster
# than MiniGoogLeNet (whose Flax and Keras builders tests/test_flax_models.py and
# tests/test_model_parity.py check)
MODEL_COUNTS = {"small_cnn": (60_746, 11_288_576)}
MECHANICS = "models=[small_cnn]"
# the golden runs' timed steps and telemetry interval: small_cnn's 3 steps (10-60 ms each) may
# take less than one default interval (0.25 s), leaving no telemetry sample in the window and
# the record's `contended` null where the golden record has a boolean: 20 steps (0.15 s or more)
# sampled every 0.05 s
GOLDEN_STEPS = 20
GOLDEN_TELEMETRY = "telemetry.interval_s=0.05"


def check_spec(runner: str, **fields: Any) -> str:
    """A spec as the parent resolves it (1 CPU device, minigooglenet, batch 8 per device, the
    runner's options at their defaults) with `fields` over it, as JSON for a check script's argv."""
    info = RUNNERS[runner]
    n = fields.get("num_devices", 1)
    spec = RunSpec(**{
        "run_id": "check", "sweep_id": "check", "runner": runner, "family": info.family,
        "module": info.module, "model": "minigooglenet", "num_devices": n, "device": "cpu",
        "virtual_devices": n > 1, "scaling": "weak", "batch_size_per_device": 8,
        "global_batch_size": 8 * n, "data": "synthetic", "precision": "fp32",
        "warmup_steps": 2, "measure_steps": 3, "repeat": 0, "timeout_s": 600, **fields})
    return json.dumps(spec.to_dict())


def test_jax_family_is_registered() -> None:
    assert JAX_RUNNERS == ["jax_fsdp", "jax_native", "keras_jax", "keras_model_parallel"]
    assert all(RUNNERS[n].precisions == ("fp32", "tf32", "bf16") for n in JAX_RUNNERS)


def test_device_count_flag_is_appended_or_replaced() -> None:
    assert _with_device_count("", 2) == "--xla_force_host_platform_device_count=2"
    assert _with_device_count("--xla_dump_to=/tmp/x", 4) == (
        "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=4")
    assert _with_device_count("--xla_force_host_platform_device_count=8 --a=1", 2) == (
        "--a=1 --xla_force_host_platform_device_count=2")


def test_cudnn_attention_off_gpus_is_unavailable_before_launch() -> None:
    cfg = load_config(REPO / "configs/cpu-smoke.yaml", [
        "runners=[jax_native]", "models=[gpt2_tiny,small_cnn]", "devices=[1]",
        "runner_options.jax_native.attention=[cudnn,xla]"])
    verdicts = {(r.model, r.options["attention"]): precheck(r, 0) for r in expand(cfg, "s")}
    status, reason = verdicts["gpt2_tiny", "cudnn"]
    assert status == "unavailable"
    assert "implementation='cudnn') is a GPU kernel; the run's devices are cpu" in reason
    # xla runs anywhere; a CNN has no attention: the option does not apply, the run goes
    assert verdicts["gpt2_tiny", "xla"] is None
    assert verdicts["small_cnn", "cudnn"] is None and verdicts["small_cnn", "xla"] is None


def test_cudnn_attention_on_gpus_needs_bf16() -> None:
    check = RUNNERS["jax_native"].launch_check
    spec = partial(spec_for, model="gpt2_tiny", device="gpu", options={"attention": "cudnn"})
    assert "use precision bf16" in check(spec(precision="fp32"))
    assert "precision tf32 computes attention in float32" in check(spec(precision="tf32"))
    assert check(spec(precision="bf16")) is None
    assert check(spec(precision="fp32", options={"attention": "auto"})) is None
    assert check(spec(precision="fp32", model="resnet50")) is None


def check_ok(rec: dict, n: int, steps: int = 3) -> dict:
    """The common checks of an ok record of small_cnn at n virtual devices, `steps` timed;
    its runner's result."""
    assert check_record(rec) == [] and rec["model"] == "small_cnn"
    log = Path(rec["log_path"]).read_text()[-3000:]
    assert rec["status"] == "ok", f"{rec['reason']}\n{log}"
    assert rec["virtual_devices"] is True
    assert rec["samples"] == steps * 8 * n
    assert rec["images_per_sec"] > 0
    result = rec["result"]
    assert result["replicas"] == n
    assert result["layout"] == "channels_last"
    assert result["framework"]["jax"] == "0.10.2"
    assert [d["kind"] for d in result["devices"]] == [CPU_KIND] * n
    assert [d["id"] for d in result["devices"]] == list(range(n))
    assert result["shardings"]["per_device_batch"] == 8
    assert (result["params"], result["flops_per_sample"]) == MODEL_COUNTS["small_cnn"]
    # where the timed batch lay, as jax reports it: 8 rows on each of the n devices
    assert result["placement"] == rec["placement"]
    assert sorted(rec["placement"].values()) == [8] * n, rec["placement"]
    assert result["batchnorm"] == rec["options"]["batchnorm"]
    assert_replicas(rec, n)  # data parallel: the whole state on every device
    assert rec["precision_policy"]["follows"] is True
    return result


# the data-parallel runners (jax_fsdp and keras_model_parallel: tests/test_jax_sharded.py)
@pytest.mark.parametrize("runner", ["jax_native", "keras_jax"])
@pytest.mark.slow
@pytest.mark.framework("jax")
def test_runner_at_one_and_two_devices(runner: str, tmp_path: Path, jax_python: str) -> None:
    # keras_jax with 1 warm-up step: at 1 device Keras' jax trainer compiles its step again at
    # step 2 (issue 41 item 5); the settle rule keeps it out of the window
    keras_warmup = ["warmup_steps=1"] if runner == "keras_jax" else []
    records = smoke_sweep(tmp_path / runner, f"runners=[{runner}]", MECHANICS,
                          f"measure_steps={GOLDEN_STEPS}", GOLDEN_TELEMETRY, *keras_warmup)
    assert sorted(records) == [1, 2]
    for n, rec in records.items():
        result = check_ok(rec, n, GOLDEN_STEPS)
        if runner == "jax_native":
            assert result["framework"]["flax"] == "0.12.8"
            assert result["shardings"]["batch"] == f"NamedSharding(mesh={{data: {n}}}, " \
                                                   "spec=P('data',))"
            # per-device BatchNorm: the step's one pmean of gradients, statistics and loss is
            # one combined all-reduce in the compiled program (kept, over 1 device, at n=1)
            assert result["collectives"]["all-reduce"] >= 1
            assert result["attention"] == "none"  # a CNN: the option does not apply
            assert result["attention_custom_calls"] == 0
        else:
            assert result["framework"]["keras"] == "3.15.1"
            assert result["shardings"]["mesh"] == {"batch": n}
            assert result["dtype_policy"] == "float32"
            assert result["input"] == "numpy"
            # the steps fit is given: warm-up, timed, and the settle rule's 3 calls of headroom
            assert result["host_dataset"]["batches"] == 1 + GOLDEN_STEPS + 3
            check_window_evidence(result, GOLDEN_STEPS, host_to_device=2 * n)
            # JAX compiled at step 1, and at 1 device again at step 2: the warm-up ran one step
            # past the last compile
            assert step_compiles(result) == {1: 2, 2: 1}[n]
            assert result["warmup_steps_run"] == {1: 3, 2: 2}[n]
            assert "keras_settle_compiles" in result["warmup_extended"]
            assert result["fed_batch_sharding"].startswith(
                f"NamedSharding(mesh={{batch: {n}}}, spec=P('batch'")
        assert result["batchnorm"] == "per_device"


@pytest.mark.slow
@pytest.mark.framework("jax")
def test_keras_jax_preplaced_global_batchnorm(tmp_path: Path, jax_python: str) -> None:
    rec = smoke_sweep(tmp_path, "runners=[keras_jax]", "devices=[2]", MECHANICS,
                      "measure_steps=4", "runner_options.keras_jax.steps_per_execution=2",
                      "runner_options.keras_jax.input=preplaced",
                      "runner_options.keras_jax.batchnorm=global")[2]
    result = check_ok(rec, 2, steps=4)
    assert result["input"] == "preplaced" and "no-op" in sentence(result["data_placement"])
    assert result["batchnorm"] == "global"
    # steps_per_execution 2, as Keras holds it: one clock reading per call of 2 steps, each
    # step timed as the call's mean (samples: the optimizer's counter, checked by check_ok)
    assert result["steps_per_execution"] == 2
    times = rec["step_times_s"]
    assert times[0] == times[1] and times[2] == times[3], times
    # the batch made once on the devices: nothing crosses from the host in the window
    check_window_evidence(result, 4, host_to_device=0)


def step_compiles(result: dict) -> int:
    """How often JAX compiled Keras' train step before the window opened."""
    return sum(c["function"] == "jit(train_step)"
               for c in result["window_evidence"]["compiled_before_window"])


def check_window_evidence(result: dict, steps: int, host_to_device: int) -> None:
    """What JAX reported of the window (runners/jax/window_evidence.py): no compile, and
    `host_to_device` transfers per step, as the transfer guard logged them."""
    evidence = result["window_evidence"]
    assert evidence["steps"] == steps
    assert evidence["compiles"] == 0 and result["window_recompiled"] is None, evidence
    assert evidence["transfers"]["host_to_device"] == host_to_device * steps, evidence


@pytest.mark.slow
@pytest.mark.framework("jax")
def test_jax_native_global_batchnorm(tmp_path: Path, jax_python: str) -> None:
    rec = smoke_sweep(tmp_path, "runners=[jax_native]", "devices=[2]", MECHANICS,
                      "runner_options.jax_native.batchnorm=global")[2]
    result = check_ok(rec, 2)
    assert result["batchnorm"] == "global" and result["collectives"]["all-reduce"] > 0


@pytest.mark.slow
@pytest.mark.framework("jax")
def test_jax_native_bf16(tmp_path: Path, jax_python: str) -> None:
    rec = smoke_sweep(tmp_path, "runners=[jax_native]", "devices=[2]", MECHANICS,
                      "precision=bf16")[2]
    result = check_ok(rec, 2)
    assert rec["precision"] == "bf16"
    assert result["dtype"] == "bfloat16 compute, float32 params"


@pytest.mark.slow
@pytest.mark.framework("jax")
def test_batchnorm_statistics_per_device_and_global(jax_python: str) -> None:
    """batchnorm: global (jit over the sharded batch, Keras' own layer under DataParallel) takes
    the moments of the whole batch (XLA all-reduces them); per_device (shard_map, the Keras
    subclass) the mean of each device's moments, as MirroredStrategy or DDP would."""
    r = run_child(jax_python, "tests/children/jax_batchnorm_modes.py",
                  check_spec("keras_jax", num_devices=2), env={"XLA_FLAGS": ""}, timeout=300)
    assert r["rows_per_device"] == [4, 4]
    assert sorted(r["keras_placement"].values()) == [4, 4] and len(r["keras_placement"]) == 2
    assert r["keras_class_global"] == "BatchNormalization"
    assert r["keras_class_per_device"] == "PerDeviceBatchNormalization"
    for framework in ("flax", "keras"):
        assert r[f"{framework}_global"] == pytest.approx(r["global_var"], rel=1e-5)
        assert r[f"{framework}_per_device"] == pytest.approx(r["per_device_var"], rel=1e-5)
        assert r[f"{framework}_global"] != pytest.approx(r["per_device_var"], rel=0.1)


def test_warmup_runs_past_the_second_epochs_recompile() -> None:
    from runners.jax.keras_input import warmup_past_recompile

    assert warmup_past_recompile(2, 40, 10) == 11  # step 11 opens epoch 2: warm-up
    assert warmup_past_recompile(20, 100, 55) == 56  # the H100 ResNet-50 case
    assert warmup_past_recompile(20, 100, 120) == 20  # one epoch holds every step
    assert warmup_past_recompile(60, 40, 55) == 60  # the warm-up already ran past it


def settle(compiling: set[int], warmup: int, per_call: int = 1) -> tuple[Any, Any, int]:
    """keras_fit's FitWindow driven call by call, JAX heard compiling in the calls `compiling`
    (1-based; the compile events the clock would hear, without jax: no transfer log): (the
    warm-up, the evidence, the calls run)."""
    from runners.jax.keras_fit import FitWindow, Warmup
    from runners.jax.window_evidence import WindowEvidence

    class HeardCompiles(WindowEvidence):
        def open(self) -> None:
            self.window = (len(self.compiled), len(self.compiled))

        def close(self) -> None:
            if self.window is not None:
                self.window = (self.window[0], len(self.compiled))

    evidence, w = HeardCompiles(), Warmup(warmup, per_call)
    window, calls, done = FitWindow(w, 2 * per_call, evidence, lambda: None), 0, False
    while not done:
        calls += 1
        if calls in compiling:  # heard during the call, before the clock's call_done
            evidence.compiled.append(("jit(train_step)", 1.0))
        done = window.call_done(0.1)
    return w, evidence, calls


def test_settle_rule_warms_up_past_compiles_within_its_bound() -> None:
    from runners.jax.keras_fit import SETTLE_CALLS, warmup_fields

    # keras_model_parallel and keras_jax at 1 device, warmup_steps 1 (issue 41 item 5): JAX
    # compiled the step at calls 1 and 2; the window opens after call 3
    w, evidence, calls = settle({1, 2}, warmup=1)
    assert (w.added, w.capped, calls) == (2, False, 3 + 2)
    assert evidence.in_window() == []
    assert warmup_fields(w, 1) == {"warmup_steps_run": 3, "warmup_extended":
                                   "1 -> 3: 2 more step(s) (3 at most): "
                                   "jax.keras_settle_compiles"}
    # a compile before the last warm-up call: nothing added, nothing said
    w, _, _ = settle({1}, warmup=2)
    assert w.added == 0 and warmup_fields(w, 2) == {"warmup_steps_run": 2}
    # JAX compiling at every call: the bound, said; the next compile falls in the window
    w, evidence, _ = settle(set(range(1, 20)), warmup=1)
    assert (w.added, w.capped) == (SETTLE_CALLS, True)
    assert "reached with JAX still compiling" in warmup_fields(w, 1)["warmup_extended"]
    assert len(evidence.in_window()) == 2
    # steps_per_execution 2: whole calls added, the bound in steps
    w, _, _ = settle({1}, warmup=2, per_call=2)
    assert (w.added, warmup_fields(w, 2)["warmup_steps_run"]) == (2, 4)


@pytest.mark.slow
def test_keras_jax_window_excludes_the_second_epochs_recompile(jax_python: str) -> None:
    # small_cnn: a step of milliseconds, its recompile of a second or more
    spec = check_spec("keras_jax", model="small_cnn", warmup_steps=2, measure_steps=8,
                      options={"input": "numpy", "batchnorm": "per_device"})
    r = run_child(jax_python, "tests/children/keras_jax_epoch_steps.py", spec,
                  env={"XLA_FLAGS": ""}, timeout=600)
    times = sorted(r["step_times_s"])
    assert len(times) == 8
    assert times[-1] < 4 * times[len(times) // 2], times  # no compile-length step timed
    # step 5 opens the second epoch and compiles (warm-up to 5); the settle rule adds step 6
    assert r["host_dataset"]["batches"] == 4 and r["warmup_steps_run"] == 6
    # JAX's own count: steps 1, 2 (1 device) and 5 compiled, none in the window
    assert step_compiles(r) == 3
    assert r["window_evidence"]["compiles"] == 0 and r["window_recompiled"] is None
    assert r["samples"] == 8 * 8  # the optimizer's counter over the window: the 8 timed steps
    assert "compiles its train step again" in sentence(r["warmup_extended"])


# --- transformers and a user's own Flax model (issue 26) ---

@pytest.fixture(scope="module")
def transformer_sweep(tmp_path_factory: pytest.TempPathFactory, jax_python: str
                      ) -> dict[str, dict]:
    """jax_native on gpt2_tiny and vit_tiny at 2 virtual CPU devices through the CLI (1 warm-up,
    3 timed steps, 4 samples per device); records by model. jax_native takes no other path at
    1 device (its 1-device run: test_runner_at_one_and_two_devices)."""
    from bench.records.store import load_records

    out = tmp_path_factory.mktemp("transformers")
    smoke_sweep(out, "runners=[jax_native]", "models=[gpt2_tiny,vit_tiny]", "devices=[2]",
                "warmup_steps=1", "batch_size_per_device=4")
    records = load_records(out)
    assert [r["num_devices"] for r in records] == [2, 2], records
    return {r["model"]: r for r in records}


@pytest.mark.slow
@pytest.mark.framework("jax")
@pytest.mark.parametrize("model", ["gpt2_tiny", "vit_tiny"])
def test_jax_native_transformers(transformer_sweep: dict, model: str) -> None:
    from models import get_spec

    spec = get_spec(model)
    tokens = spec.input_kind == "tokens"
    rec = transformer_sweep[model]
    assert check_record(rec) == []
    assert rec["status"] == "ok", rec["reason"]
    assert rec["samples"] == 3 * 4 * 2 and rec["images_per_sec"] > 0
    result = rec["result"]
    assert result["params"] == spec.params
    assert result["flops_per_sample"] == spec.flops_per_sample
    assert result["flops_source"] == spec.flops_source
    assert result["workload"] == "transformer"
    assert rec["tokens_per_sample"] == (64 if tokens else None)
    # at most about ln(classes), where a model that guesses starts (after one warm-up step on
    # the same batch, a little lower)
    assert 0 < rec["first_loss"] < math.log(spec.num_classes) + 0.5
    # no BatchNorm: the per-device step still averages the gradients (one all-reduce)
    assert result["collectives"]["all-reduce"] >= 1
    assert sorted(rec["placement"].values()) == [4, 4]
    assert_replicas(rec, 2)
    assert result["layout"] == ("token ids (batch, sequence)" if tokens else "channels_last")
    assert ("next-token" in sentence(result["loss_kind"])) == tokens
    # the option at its default; the compiled step holds no cuDNN attention on CPU
    assert result["attention"] == "auto" and result["attention_custom_calls"] == 0
    assert result["attention_kernel"] == "jax.xla_attention"  # no cuDNN fused attention
    # cross_entropy at its default: float32, read from the loss's jaxpr
    assert result["cross_entropy"]["applied"] == "float32"
    assert result["cross_entropy"]["computed_in"] == ["float32"]
    # XLA's memory analysis of the step that ran: the donated train state's buffers reused
    memory = result["compiled_memory"]
    assert memory["alias_bytes"] > 0 and memory["donated_buffers_reused"] is True
    # the aliased buffers are the state's: at most the arguments (state and batch), at least
    # the params (float32: 4 bytes each) that the new state overwrites in place
    assert 4 * spec.params <= memory["alias_bytes"] <= memory["argument_bytes"]
    assert memory["output_bytes"] >= memory["alias_bytes"]
    assert memory["temp_bytes"] > 0 and memory["generated_code_bytes"] >= 0


def run_native(jax_python: str, tmp: Path, name: str, n: int = 2, **fields: Any) -> dict:
    """jax_native started as bench/run/launch.py starts it (`python -m runners.jax.native
    --spec S --result R`) on a hand-made spec (`fields` over check_spec's); its result."""
    spec = json.loads(check_spec("jax_native", num_devices=n, warmup_steps=1,
                                 batch_size_per_device=4, global_batch_size=4 * n, **fields))
    spec_path, result_path = tmp / f"{name}.spec.json", tmp / f"{name}.result.json"
    spec_path.write_text(json.dumps(spec))
    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run([jax_python, "-m", "runners.jax.native", "--spec", str(spec_path),
                           "--result", str(result_path)], cwd=repo, capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(repo)})
    assert result_path.exists(), proc.stderr[-3000:]
    return json.loads(result_path.read_text())


def run_user_model(jax_python: str, tmp: Path, name: str, custom: dict, n: int = 2,
                   **fields: Any) -> dict:
    """run_native on a user's model (`custom`: its models entry)."""
    return run_native(jax_python, tmp, name, n, model=custom["name"], custom_model=custom,
                      **fields)


@pytest.fixture(scope="module")
def user_model_runs(tmp_path_factory: pytest.TempPathFactory, jax_python: str) -> dict:
    folder = tmp_path_factory.mktemp("user-models")  # outside the repo
    shutil.copy(REPO / "tests/children/flax_user_models.py", folder / "mynets.py")
    entry = {"name": "tinylm", "framework": "jax", "build": "mynets:make", "path": str(folder),
             "args": {"vocab": 97, "width": 32},
             "input": {"kind": "tokens", "seq_len": 16, "vocab": 97}}
    return {
        # attention cudnn: a user's model calls its own attention, the option does not apply
        "ok": run_user_model(jax_python, folder, "ok", entry, options={"attention": "cudnn"}),
        # reached in the child (the plan predicts it): unavailable before the model is built
        "cudnn_cpu": run_native(jax_python, folder, "cudnn_cpu", 1, model="gpt2_tiny",
                                options={"attention": "cudnn"}),
        "wrong_vocab": run_user_model(jax_python, folder, "wrong_vocab", {
            **entry, "input": {"kind": "tokens", "seq_len": 16, "vocab": 50}}, n=1),
        "not_flax": run_user_model(jax_python, folder, "not_flax", {
            **entry, "build": "mynets:not_flax", "args": {}}, n=1),
    }


@pytest.mark.slow
@pytest.mark.framework("jax")
def test_jax_native_users_token_model(user_model_runs: dict) -> None:
    r = user_model_runs["ok"]
    assert r["status"] == "ok", r.get("reason")
    # Embed 97 x 32, Dense 32 -> 32, Dense 32 -> 97 (with biases)
    assert r["params"] == 97 * 32 + 32 * 32 + 32 + 32 * 97 + 97
    assert r["flops_source"] == "XLA cost analysis of the jitted forward (batch 1)"
    # 16 positions x 2 x (32 x 32 + 32 x 97) multiply-adds, and a little element-wise work
    assert 16 * 2 * (32 * 32 + 32 * 97) <= r["flops_per_sample"] < 1.1 * 16 * 2 * (
        32 * 32 + 32 * 97)
    assert r["workload"] == "custom" and r["tokens_per_sample"] == 16
    assert r["placement"] == {"cpu:0": 4, "cpu:1": 4} and r["samples"] == 3 * 8
    assert r["collectives"]["all-reduce"] >= 1
    assert r["attention"] == "none" and r["compiled_memory"]["donated_buffers_reused"]


@pytest.mark.slow
@pytest.mark.framework("jax")
def test_cudnn_attention_reached_on_cpu_is_unavailable(user_model_runs: dict) -> None:
    r = user_model_runs["cudnn_cpu"]
    assert r["status"] == "unavailable"
    assert "implementation='cudnn') is a GPU kernel; the run's devices are cpu" in r["reason"]


@pytest.mark.slow
@pytest.mark.framework("jax")
def test_jax_native_users_model_invalid(user_model_runs: dict) -> None:
    r = user_model_runs["wrong_vocab"]
    assert r["status"] == "invalid"
    assert r["reason"] == ("models: tinylm: output shape [2, 16, 97] for a batch of 2 does not "
                           "match vocab 50 (expected [2, 16, 50])")
    r = user_model_runs["not_flax"]
    assert r["status"] == "invalid"
    assert r["reason"] == ("models: tinylm: mynets:not_flax returned builtins.object, not a "
                           "flax.linen.Module")
