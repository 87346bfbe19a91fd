"""The 2017 Keras tower runners (keras_tf_kuza55, keras_tf_multi_gpu_model, keras_tf_avolkov1):
what the generic equivalence and CLI tests do not cover. multi_gpu_model's uneven split, kuza55
refusing an uneven batch, the saved template, and avolkov1's options, run for real on virtual
CPU devices in the TF environment."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

from bench.launch import launch
from bench.plan import RunSpec
from bench.records import load_records
from bench.registry import RUNNERS
from tests.conftest import REPO, run_cli
from tests.test_equivalence import BATCH, LR, RTOL, make_inputs

pytestmark = [pytest.mark.slow, pytest.mark.framework("tf")]


def run_tf(python: str, code: str) -> dict:
    """Run `code` in the TF environment from the repo root; it prints one JSON line last."""
    proc = subprocess.run([python, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def child_spec(runner: str, n: int, global_batch: int, tmp_path: Path, *, model: str = "probe",
               mode: str = "benchmark", options: dict | None = None,
               equivalence: dict | None = None) -> RunSpec:
    info = RUNNERS[runner]
    return RunSpec(
        run_id=f"{runner}-{mode}-n{n}-gb{global_batch}", sweep_id="towers", runner=runner,
        family=info.family, module=info.module, model=model, num_devices=n, device="cpu",
        virtual_devices=True, scaling="strong", batch_size_per_device=global_batch // n,
        global_batch_size=global_batch, data="synthetic", precision="fp32", warmup_steps=1,
        measure_steps=1, repeat=0, timeout_s=300,
        options={**{k: o.default for k, o in info.options.items()}, **(options or {})},
        mode=mode, equivalence=equivalence)


def test_multi_gpu_model_slices_give_last_tower_the_remainder(tf_python: str) -> None:
    """B=10 over 3 towers: [3, 3, 4], nothing dropped; kuza55's split would be [3, 3, 3]. The
    tower model on 3 virtual devices returns all 10 rows, equal to the template's output, and
    owns no weights beyond the template's (BatchNorm statistics included)."""
    out = run_tf(tf_python, """
        import json
        import numpy as np
        import tensorflow as tf
        from runners import keras_towers as kt
        from runners.tf_common import setup_devices
        names, _ = setup_devices({"num_devices": 3, "device": "cpu"})
        x = tf.reshape(tf.range(10 * 2), (10, 2))
        last = [kt.slice_batch(x, i, 3, "last") for i in range(3)]
        drop = [kt.slice_batch(x, i, 3, "drop") for i in range(3)]
        template = kt.build_template("minigooglenet", "/cpu:0")
        model = kt.TowerModel(template, names, merge_device="/cpu:0", remainder="last")
        images = tf.random.stateless_normal((10, 32, 32, 3), seed=(5, 6))
        mean = [w for w in template.weights if "moving_mean" in w.path][0]
        before = mean.numpy().copy()
        merged = model(images, training=False)
        reference = template(images, training=False)
        model(images, training=True)
        print(json.dumps({
            "last": [int(t.shape[0]) for t in last],
            "drop": [int(t.shape[0]) for t in drop],
            "rows_kept": bool(np.array_equal(tf.concat(last, 0).numpy(), x.numpy())),
            "sizes_last": kt.split_sizes(10, 3, "last"),
            "sizes_drop": kt.split_sizes(10, 3, "drop"),
            "merged_rows": int(merged.shape[0]),
            "max_diff": float(np.abs(merged.numpy() - reference.numpy()).max()),
            "same_weights": [id(w) for w in model.weights] == [id(w) for w in template.weights],
            "bn_updated": bool(np.abs(mean.numpy() - before).max() > 0),
        }))
        """)
    assert out["last"] == out["sizes_last"] == [3, 3, 4]
    assert out["drop"] == out["sizes_drop"] == [3, 3, 3]
    assert out["rows_kept"]
    assert out["merged_rows"] == 10
    assert out["max_diff"] < 1e-5
    assert out["same_weights"]
    assert out["bn_updated"], "towers did not update the template's BatchNorm statistics"


@pytest.mark.parametrize("runner", ["keras_tf_kuza55", "keras_tf_avolkov1"])
def test_uneven_batch_is_invalid_not_silently_dropped(runner: str, tmp_path: Path,
                                                     tf_python: str) -> None:
    """The config refuses an uneven strong-scaling batch; the child refuses it too."""
    rec = launch(child_spec(runner, 3, 10, tmp_path), tf_python, tmp_path, {})
    assert rec["status"] == "invalid", rec["reason"]
    assert "drop" in rec["reason"] and "10" in rec["reason"], rec["reason"]


@pytest.mark.parametrize("options", [{}, {"cpu_relocation": True, "cpu_merge": False}],
                         ids=["defaults", "relocation-gpu-merge"])
def test_multi_gpu_model_saves_its_template(options: dict, tmp_path: Path,
                                            tf_python: str) -> None:
    args = ["--config", "configs/cpu-smoke.yaml", "--set", "runners=[keras_tf_multi_gpu_model]",
            "--set", "devices=[2]", "--set", "warmup_steps=1", "--set", "measure_steps=2",
            "--set", "batch_size_per_device=4", "--out", str(tmp_path / "out")]
    for name, value in options.items():
        args += ["--set", f"runner_options.keras_tf_multi_gpu_model.{name}={str(value).lower()}"]
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (rec,) = load_records(tmp_path / "out")
    assert rec["status"] == "ok", (rec["reason"], Path(rec["log_path"]).read_text()[-3000:])
    result = rec["result"]
    assert result["saved_template_ok"] is True
    assert result["split"] == [4, 4]
    assert result["tower_devices"] == ["/cpu:0", "/cpu:1"]
    assert result["variables_device"].endswith("CPU:0")
    assert result["cpu_relocation"] is options.get("cpu_relocation", False)
    assert result["cpu_merge"] is options.get("cpu_merge", True)


def test_avolkov1_prefetch_and_average_gradients_run(tmp_path: Path, tf_python: str) -> None:
    proc = run_cli("--config", "configs/cpu-smoke.yaml", "--set", "runners=[keras_tf_avolkov1]",
                   "--set", "devices=[2]", "--set", "warmup_steps=1", "--set", "measure_steps=2",
                   "--set", "batch_size_per_device=4",
                   "--set", "runner_options.keras_tf_avolkov1.prefetch=true",
                   "--set", "runner_options.keras_tf_avolkov1.average_gradients=true",
                   "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (rec,) = load_records(tmp_path / "out")
    assert rec["status"] == "ok", (rec["reason"], Path(rec["log_path"]).read_text()[-3000:])
    assert rec["samples"] == 2 * 8
    result = rec["result"]
    assert result["prefetch"] is True and result["average_gradients"] is True
    assert result["tower_devices"] == ["/cpu:0", "/cpu:1"]
    assert result["slice_device"] == "/cpu:0"


def test_avolkov1_averaged_gradients_equal_one_device_step(tmp_path: Path,
                                                           tf_python: str) -> None:
    """Per-tower mean-loss gradients averaged over 2 equal slices (with prefetch) give the
    same SGD step as the global-mean gradient on 1 device."""
    inputs = tmp_path / "inputs.npz"
    make_inputs(inputs)
    weights = {}
    for n, options in [(1, {}), (2, {"prefetch": True, "average_gradients": True})]:
        out = tmp_path / f"n{n}.npz"
        spec = child_spec("keras_tf_avolkov1", n, BATCH, tmp_path, mode="equivalence",
                          options=options, equivalence={"inputs": str(inputs),
                                                        "output": str(out),
                                                        "learning_rate": LR})
        rec = launch(spec, tf_python, tmp_path, {})
        assert rec["status"] == "ok", (rec["reason"], Path(rec["log_path"]).read_text()[-3000:])
        with np.load(out) as data:
            weights[n] = {k: data[k] for k in data.files}
    with np.load(inputs) as data:
        initial = {k: data[k] for k in data.files if k.startswith("w:")}
    assert set(weights[1]) == set(weights[2]) == set(initial)
    for name in initial:
        assert np.abs(weights[1][name] - initial[name]).max() > 1e-3, f"{name} did not move"
        np.testing.assert_allclose(weights[2][name], weights[1][name], rtol=RTOL, atol=1e-6)
