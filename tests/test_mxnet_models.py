"""The MXNet family's builders agree with each model's spec and with each other: Gluon and Keras
2.2 on MXNet (keras-mxnet) give the spec's parameters and FLOPs, the same BatchNorm settings,
and, for the probe's canonical weights, the same softmax."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from models import available_models, get_spec
from tests.helpers.cli import run_child

REPO = Path(__file__).resolve().parents[1]
# MXNet builds the 2017 CNNs only (its runners' era; docs/MODELS.md)
CNNS = [m for m in available_models() if get_spec(m).workload == "cnn"]

pytestmark = [pytest.mark.slow, pytest.mark.framework("mxnet")]

def _run(python: str, script: str) -> dict:
    """Run a check script in the MXNet interpreter; its parsed RESULT line."""
    return run_child(python, script, *CNNS,
                     env={"PYTHONWARNINGS": "ignore", "MXNET_SUBGRAPH_VERBOSE": "0"})


@pytest.fixture(scope="module")
def gluon_results(mxnet_python: str) -> dict:
    return _run(mxnet_python, "tests/children/gluon_cnn_builders.py")


@pytest.fixture(scope="module")
def keras2_results(mxnet_python: str) -> dict:
    return _run(mxnet_python, "tests/children/keras_mxnet_cnn_builders.py")


def _counts(r: dict) -> tuple[int, int, int]:
    return r["params"], r["trainable"], r["flops"]


@pytest.mark.parametrize("name", CNNS)
def test_gluon_builder_matches_spec(gluon_results: dict, name: str) -> None:
    s, r = get_spec(name), gluon_results[name]
    assert _counts(r) == (s.params, s.trainable_params, s.flops_per_sample)
    assert r["output_shape"] == [s.num_classes]
    assert r["finite"]
    assert r["rejects_channels_last"]


@pytest.mark.parametrize("name", CNNS)
def test_keras_mxnet_builder_matches_spec(keras2_results: dict, name: str) -> None:
    s, r = get_spec(name), keras2_results[name]
    assert _counts(r) == (s.params, s.trainable_params, s.flops_per_sample)
    assert r["output_shape"] == [s.num_classes]
    assert r["row_sums"] == pytest.approx([1.0, 1.0], abs=1e-4)


@pytest.mark.parametrize("name", CNNS)
def test_batchnorm_settings_agree(gluon_results: dict, keras2_results: dict, name: str) -> None:
    assert gluon_results[name]["bn"] == keras2_results[name]["bn"]
    expected = {"resnet50": [[1e-5, 0.9, True]], "minigooglenet": [[1e-3, 0.99, True]],
                "small_cnn": [[1e-3, 0.9, True]]}
    assert gluon_results[name]["bn"] == expected.get(name, [])


@pytest.mark.parametrize("framework", ["gluon", "keras2"])
def test_probe_canonical_weights(gluon_results: dict, keras2_results: dict,
                                 framework: str) -> None:
    r = {"gluon": gluon_results, "keras2": keras2_results}[framework]["probe/canonical"]
    assert r["names"] == {n: list(s) for n, s in get_spec("probe").weights}
    assert r["round_trip"]


def test_probe_gluon_weights_on_every_context(gluon_results: dict) -> None:
    r = gluon_results["probe/canonical"]
    assert r["all_contexts"]
    assert r["contexts_diff"] == 0.0


def test_probe_gluon_matches_keras_mxnet(gluon_results: dict, keras2_results: dict) -> None:
    gluon = np.asarray(gluon_results["probe/canonical"]["probs"])
    keras2 = np.asarray(keras2_results["probe/canonical"]["probs"])
    assert gluon.shape == keras2.shape == (4, get_spec("probe").num_classes)
    np.testing.assert_allclose(gluon, keras2, rtol=0, atol=1e-5)
