"""The MXNet family's builders agree with each model's spec and with each other: Gluon and Keras
2.2 on MXNet (keras-mxnet) give the spec's parameters and FLOPs, the same BatchNorm settings,
and, for the probe's canonical weights, the same softmax."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from models import available_models, get_spec
from tests.helpers.cli import run_check_script

REPO = Path(__file__).resolve().parents[1]
# MXNet builds the 2017 CNNs only (its runners' era; docs/MODELS.md)
CNNS = [m for m in available_models() if get_spec(m).workload == "cnn"]

pytestmark = [pytest.mark.slow, pytest.mark.framework("mxnet")]

# The probe's canonical weights and NCHW input, drawn alike in both scripts (same interpreter).
PROBE_DATA = r"""
def probe_data(probe):
    rng = np.random.default_rng(1)
    w = {k: rng.standard_normal(s).astype(np.float32) for k, s in probe.weights}
    return w, rng.standard_normal((4, *probe.input_shape)).astype(np.float32).transpose(0, 3, 1, 2)
"""

# Runs in the MXNet interpreter, from the repo root; prints one line "RESULT <json>".
GLUON_CHECK = r"""
import json, sys
import mxnet as mx
import numpy as np
from mxnet.gluon import nn
from models import get_spec, load_builder
from models.gluon_common import (count_flops_gluon, count_params_gluon, count_trainable_gluon,
                                 get_canonical_weights, iter_blocks, set_canonical_weights)
""" + PROBE_DATA + r"""
out = {}
for name in sys.argv[1:]:
    spec, build = get_spec(name), load_builder(name, "gluon")
    h, w, c = spec.input_shape
    net = build(spec)
    r = {"params": count_params_gluon(net), "trainable": count_trainable_gluon(net),
         "flops": count_flops_gluon(net, (c, h, w)),
         "bn": sorted({(b._kwargs["eps"], b._kwargs["momentum"], not b._kwargs["fix_gamma"])
                       for b in iter_blocks(net) if isinstance(b, nn.BatchNorm)})}
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    net.hybridize()
    x = np.random.default_rng(0).standard_normal((2, c, h, w)).astype(np.float32)
    y = net(mx.nd.array(x)).asnumpy()
    r.update(output_shape=list(y.shape[1:]), finite=bool(np.isfinite(y).all()))
    try:
        build(spec, "channels_last")
        r["rejects_channels_last"] = False
    except ValueError:
        r["rejects_channels_last"] = True
    out[name] = r
probe = get_spec("probe")
w, x = probe_data(probe)
ctxs = [mx.cpu(0), mx.cpu(1)]
net = load_builder("probe", "gluon")(probe)
net.initialize(mx.init.Xavier(), ctx=ctxs)
net.hybridize()
set_canonical_weights(net, w)
got = get_canonical_weights(net)
params = list(net.collect_params().values())
probs = [mx.nd.softmax(net(mx.nd.array(x, ctx=ctx))).asnumpy() for ctx in ctxs]
out["probe/canonical"] = {
    "names": {k: list(v.shape) for k, v in got.items()},
    "round_trip": all(np.array_equal(got[k], w[k]) for k in w),
    "all_contexts": all(np.array_equal(d.asnumpy(), p.list_data()[0].asnumpy())
                        for p in params for d in p.list_data()) and len(params[0].list_data()) == 2,
    "contexts_diff": float(np.abs(probs[0] - probs[1]).max()),
    "probs": probs[0].tolist(),
}
print("RESULT " + json.dumps(out))
"""

KERAS2_CHECK = r"""
import json, sys
from runners.mxnet.common import import_keras_mxnet
keras = import_keras_mxnet()
import numpy as np
from models import get_spec, load_builder
from models.keras2_common import (count_flops_keras2, count_params_keras2,
                                  count_trainable_keras2, get_canonical_weights,
                                  set_canonical_weights)
""" + PROBE_DATA + r"""
out = {}
for name in sys.argv[1:]:
    spec = get_spec(name)
    h, w, c = spec.input_shape
    m = load_builder(name, "keras")(spec, data_format="channels_first")
    x = np.random.default_rng(0).standard_normal((2, c, h, w)).astype(np.float32)
    out[name] = {
        "params": count_params_keras2(m), "trainable": count_trainable_keras2(m),
        "flops": count_flops_keras2(m), "output_shape": list(m.output_shape[1:]),
        "bn": sorted({(layer.epsilon, layer.momentum, layer.scale) for layer in m.layers
                      if isinstance(layer, keras.layers.BatchNormalization)}),
        "row_sums": m.predict(x).sum(axis=1).tolist(),
    }
probe = get_spec("probe")
w, x = probe_data(probe)
m = load_builder("probe", "keras")(probe, data_format="channels_first")
set_canonical_weights(m, w)
got = get_canonical_weights(m)
out["probe/canonical"] = {
    "names": {k: list(v.shape) for k, v in got.items()},
    "round_trip": all(np.array_equal(got[k], w[k]) for k in w),
    "probs": m.predict(x).tolist(),
}
print("RESULT " + json.dumps(out))
"""


def _run(python: str, script: str) -> dict:
    """Run a check script in the MXNet interpreter; its parsed RESULT line."""
    return run_check_script(python, script, *CNNS,
                            env={"PYTHONWARNINGS": "ignore", "MXNET_SUBGRAPH_VERBOSE": "0"})


@pytest.fixture(scope="module")
def gluon_results(mxnet_python: str) -> dict:
    return _run(mxnet_python, GLUON_CHECK)


@pytest.fixture(scope="module")
def keras2_results(mxnet_python: str) -> dict:
    return _run(mxnet_python, KERAS2_CHECK)


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
