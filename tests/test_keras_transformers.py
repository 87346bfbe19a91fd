"""The Keras 3 transformers (models/transformer_keras.py) and the Keras runners that train them:
the builders' parameter count against the framework-free spec (gpt2, gpt2_tiny, vit_b16,
vit_tiny under KERAS_BACKEND=jax), models.keras_common.describe on them and on a user's
subclassed model, and one CLI sweep per runner (keras_jax with gpt2_tiny and vit_tiny,
keras_torch and tf_mirrored with gpt2_tiny, at 2 virtual CPU devices) whose records say ok
with the spec's parameters, FLOPs and tokens per sample."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench.records.store import check_record, load_records
from models import get_spec
from tests.helpers.cli import run_child, run_cli

pytestmark = pytest.mark.slow
BATCH, MEASURE = 4, 3
# 2 devices only: at 1 each runner takes the same path over a mesh, strategy or process group
# of one (its 1-device runs: the runners' own test files), and the 2-device record checks all
# a 1-device one would, the layout over the devices besides
DEVICES = 2


@pytest.mark.framework("jax")
def test_keras_builders_match_the_spec(jax_python: str) -> None:
    out = run_child(jax_python, "tests/children/keras_transformer_builders.py")
    assert out["params"] == {n: get_spec(n).params
                             for n in ("gpt2", "gpt2_tiny", "vit_b16", "vit_tiny")}
    assert out["described"], "the check script described no model"
    for name, described in out["described"].items():
        spec = get_spec(name)
        assert described["params"] == described["trainable_params"] == spec.params
        assert described["output_shape"] == (
            [2, 64, 2048] if name == "gpt2_tiny" else [2, 10])
        # XLA counts every op: the standard count's matmuls and attention, and a little more
        assert spec.flops_per_sample <= described["flops_per_sample"] \
            <= 1.2 * spec.flops_per_sample, (name, described)
        assert described["flops_source"].startswith("jax: XLA cost analysis")
    custom = out["custom"]
    # Embedding 100 x 16 + Dense 16 -> 100 with bias; 2 x 8 positions x 16 x 100 at least
    assert custom["params"] == 100 * 16 + 16 * 100 + 100
    assert custom["output_shape"] == [2, 8, 100]
    assert custom["flops_per_sample"] >= 2 * 8 * 16 * 100
    assert "returned builtins.object, not a keras.Model" in out["not_a_model"]


def sweep(out: Path, runner: str, models: list[str]) -> dict[tuple[str, int], dict]:
    """The CPU smoke config through the CLI for `runner` and `models` at DEVICES devices (1
    warm-up, 3 timed steps, 4 samples per device); its records by (model, devices)."""
    proc = run_cli("--config", "configs/cpu-smoke.yaml", "--set", f"runners=[{runner}]",
                   "--set", f"models=[{','.join(models)}]", "--set", f"devices=[{DEVICES}]",
                   "--set", "warmup_steps=1", "--set", f"measure_steps={MEASURE}",
                   "--set", f"batch_size_per_device={BATCH}", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {(r["model"], r["num_devices"]): r for r in load_records(out)}


def check_transformer_records(records: dict[tuple[str, int], dict], models: list[str]) -> None:
    """Every record ok, with the spec's parameters and standard FLOPs, tokens per sample (64
    for gpt2_tiny, None for an image), a first loss near ln(classes) and the batch laid over
    every device."""
    assert sorted(records) == sorted((m, DEVICES) for m in models)
    for (name, n), rec in records.items():
        log = Path(rec["log_path"]).read_text()[-3000:]
        assert rec["status"] == "ok", f"{name} x{n}: {rec['reason']}\n{log}"
        assert check_record(rec) == []
        assert rec["samples"] == MEASURE * BATCH * n
        spec, result = get_spec(name), rec["result"]
        assert result["params"] == spec.params
        assert result["flops_per_sample"] == spec.flops_per_sample
        assert result["flops_source"] == spec.flops_source
        assert result["workload"] == "transformer"
        assert rec["tokens_per_sample"] == (64 if name == "gpt2_tiny" else None)
        assert abs(rec["first_loss"] - math.log(spec.num_classes)) < 1.0, rec["first_loss"]
        assert len(rec["placement"]) == n, rec["placement"]


@pytest.fixture(scope="module")
def keras_jax_records(tmp_path_factory: pytest.TempPathFactory, jax_python: str
                      ) -> dict[tuple[str, int], dict]:
    return sweep(tmp_path_factory.mktemp("keras_jax"), "keras_jax", ["gpt2_tiny", "vit_tiny"])


@pytest.mark.framework("jax")
def test_keras_jax_trains_the_transformers(keras_jax_records: dict) -> None:
    check_transformer_records(keras_jax_records, ["gpt2_tiny", "vit_tiny"])
    gpt = keras_jax_records["gpt2_tiny", DEVICES]["result"]
    assert gpt["layout"] == "tokens (batch, sequence)"
    assert gpt["batchnorm_statistics"] == "the model has no BatchNormalization layer"
    assert gpt["placement"] == {"cpu:0": BATCH, "cpu:1": BATCH}  # rows of the first timed batch
    assert [d["id"] for d in gpt["devices"]] == [0, 1]
    # what JAX reports of each window (runners/jax/window_evidence.py): no compile; input
    # numpy: Keras copies the inputs and the labels to every device at every step
    for name in ("gpt2_tiny", "vit_tiny"):
        evidence = keras_jax_records[name, DEVICES]["result"]["window_evidence"]
        assert evidence["compiles"] == 0, evidence
        assert evidence["transfers"]["host_to_device"] == 2 * DEVICES * MEASURE, evidence


@pytest.fixture(scope="module")
def keras_torch_records(tmp_path_factory: pytest.TempPathFactory, torch_python: str
                        ) -> dict[tuple[str, int], dict]:
    return sweep(tmp_path_factory.mktemp("keras_torch"), "keras_torch", ["gpt2_tiny"])


@pytest.fixture(scope="module")
def tf_mirrored_records(tmp_path_factory: pytest.TempPathFactory, tf_python: str
                        ) -> dict[tuple[str, int], dict]:
    return sweep(tmp_path_factory.mktemp("tf_mirrored"), "tf_mirrored", ["gpt2_tiny"])


@pytest.mark.framework("torch")
def test_keras_torch_trains_gpt2_tiny(keras_torch_records: dict) -> None:
    records = keras_torch_records
    check_transformer_records(records, ["gpt2_tiny"])
    assert records["gpt2_tiny", DEVICES]["placement"] == {
        f"rank{i}:cpu": MEASURE * BATCH for i in range(DEVICES)}


@pytest.mark.framework("tf")
def test_tf_mirrored_trains_gpt2_tiny(tf_mirrored_records: dict) -> None:
    records = tf_mirrored_records
    check_transformer_records(records, ["gpt2_tiny"])
    assert records["gpt2_tiny", DEVICES]["result"]["layout"] == "tokens (batch, sequence)"
