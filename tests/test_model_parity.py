"""Every model's builders agree with its framework-free spec: parameters, FLOPs, outputs."""

from __future__ import annotations

import ast
import math
import subprocess
import sys
from pathlib import Path

import pytest

from models import available_models, get_spec
from tests.helpers.cli import run_child

REPO = Path(__file__).resolve().parents[1]
# The CNNs: checked here in both data formats with count_flops_keras (conv and dense layers);
# the transformers' Keras builders in tests/test_keras_transformers.py (the standard count).
CNNS = [m for m in available_models() if get_spec(m).workload == "cnn"]


def test_models_are_discovered() -> None:
    assert {"minigooglenet", "probe", "resnet50"} <= set(available_models())


@pytest.mark.parametrize("name", available_models())
def test_spec_is_self_consistent(name: str) -> None:
    s = get_spec(name)
    assert s.name == name and s.description
    assert len(s.input_shape) == (1 if s.input_kind == "tokens" else 3)
    assert all(isinstance(d, int) and d > 0 for d in s.input_shape)
    assert s.workload in ("cnn", "transformer")
    assert s.num_classes > 1
    assert s.params >= s.trainable_params > 0 and s.flops_per_sample > 0


def test_probe_weights() -> None:
    from models.probe.spec import WEIGHTS

    s = get_spec("probe")
    assert s.weights == tuple(WEIGHTS)
    assert [n for n, _ in WEIGHTS] == ["conv/kernel", "conv/bias", "dense/kernel", "dense/bias"]
    assert sum(math.prod(shape) for _, shape in WEIGHTS) == s.params == s.trainable_params
    h, w, c = s.input_shape
    assert dict(WEIGHTS)["conv/kernel"][2] == c
    assert dict(WEIGHTS)["dense/kernel"] == (h * w * dict(WEIGHTS)["conv/bias"][0], s.num_classes)


def test_reference_counts() -> None:
    resnet = get_spec("resnet50")
    assert resnet.trainable_params == 25_557_032  # torchvision's parameters() count
    assert resnet.params == 25_557_032 + 53_120  # + BatchNorm running mean and variance
    assert get_spec("minigooglenet").params == 1_656_250  # Keras' count, BN statistics included


def test_unknown_model() -> None:
    with pytest.raises(KeyError, match="unknown model 'nope'"):
        get_spec("nope")


def test_specs_import_no_framework() -> None:
    code = ("import sys, models\n"
            "for n in models.available_models(): models.get_spec(n)\n"
            "print(sorted({'tensorflow', 'keras', 'torch', 'jax', 'numpy'} & set(sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=True)
    assert proc.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def keras_results(tf_python: str) -> dict:
    # The probe's channels_first forward needs an NCHW Conv2D on the CPU, which only TF's
    # oneDNN kernels have; TF turns oneDNN on by default only on some x86 CPUs (AVX-512 ones),
    # so ask for it on every host.
    return run_child(tf_python, "tests/children/keras_cnn_builders.py", *CNNS,
                     env={"TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": "",
                          "TF_ENABLE_ONEDNN_OPTS": "1"})


@pytest.mark.slow
@pytest.mark.framework("tf")
@pytest.mark.parametrize("name", CNNS)
@pytest.mark.parametrize("fmt", ["channels_last", "channels_first"])
def test_keras_builder_matches_spec(keras_results: dict, name: str, fmt: str) -> None:
    s, r = get_spec(name), keras_results[f"{name}/{fmt}"]
    assert (r["params"], r["trainable"], r["flops"]) == (
        s.params, s.trainable_params, s.flops_per_sample)
    assert r["output_shape"] == [s.num_classes]
    if fmt == "channels_last":
        assert r["row_sums"] == pytest.approx([1.0, 1.0], abs=1e-4)


@pytest.mark.slow
@pytest.mark.framework("tf")
@pytest.mark.parametrize("name", CNNS)
def test_keras_mixed_precision_output_is_float32(keras_results: dict, name: str) -> None:
    assert keras_results[f"{name}/mixed_float16"]["output_dtype"] == "float32"


@pytest.mark.slow
@pytest.mark.framework("tf")
def test_keras_probe_canonical_weights(keras_results: dict) -> None:
    r = keras_results["probe/canonical"]
    assert r["names"] == {n: list(s) for n, s in get_spec("probe").weights}
    assert r["round_trip"]
    # two conv kernels (Eigen NHWC, oneDNN NCHW) sum in different orders: float32 rounding of
    # a softmax, ~5e-6; a layout or weight-transpose mistake moves it by ~0.1
    assert r["formats_diff"] < 2e-5


@pytest.mark.parametrize(("model", "table"), [("minigooglenet", "LAYOUT"), ("resnet50", "STAGES")])
def test_every_builder_takes_the_architecture_from_the_spec(model: str, table: str) -> None:
    """One architecture table per model, in its framework-free spec: no builder keeps a copy."""
    builders = sorted((REPO / "models" / model).glob("*_builder.py"))
    assert len(builders) >= 5
    for path in builders:
        tree = ast.parse(path.read_text())
        imports = {(n.module, a.name) for n in tree.body if isinstance(n, ast.ImportFrom)
                   for a in n.names}
        assert (f"models.{model}.spec", table) in imports, path.name
        assigned = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                    if isinstance(t, ast.Name)}
        assert table not in assigned, f"{path.name} defines its own {table}"
