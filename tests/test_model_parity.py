"""Every builder agrees with its model's framework-free spec: parameters and FLOPs."""

from __future__ import annotations

import json
import subprocess

import pytest

from models import available_models, get_spec
from tests.conftest import REPO

KERAS_CHECK = r"""
import json, sys
from models import get_spec, load_builder
from models.keras_common import count_flops_keras, count_params_keras, count_trainable_keras
out = {}
for name in sys.argv[1:]:
    for fmt in ("channels_last", "channels_first"):
        m = load_builder(name, "keras")(get_spec(name), data_format=fmt)
        out[f"{name}/{fmt}"] = [count_params_keras(m), count_trainable_keras(m),
                                count_flops_keras(m), list(m.output.shape)]
print("RESULT " + json.dumps(out))
"""


def test_models_are_discovered_and_specs_consistent() -> None:
    assert {"minigooglenet", "probe", "resnet50"} <= set(available_models())
    for name in available_models():
        s = get_spec(name)
        assert s.name == name
        assert len(s.input_shape) == 3 and all(d > 0 for d in s.input_shape)
        assert s.params >= s.trainable_params > 0 and s.flops_per_sample > 0
    probe = get_spec("probe")
    assert sum(int(__import__("math").prod(shape)) for _, shape in probe.weights) == probe.params


def test_issue_figures() -> None:
    assert get_spec("resnet50").trainable_params == 25_557_032  # torchvision's count
    assert get_spec("minigooglenet").params == 1_656_250  # Keras' count, BN stats included


def test_unknown_model() -> None:
    with pytest.raises(KeyError, match="unknown model 'nope'"):
        get_spec("nope")


@pytest.mark.slow
@pytest.mark.framework("tf")
def test_keras_builders_match_specs(tf_python: str) -> None:
    names = available_models()
    proc = subprocess.run([tf_python, "-c", KERAS_CHECK, *names], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env={"PYTHONPATH": str(REPO),
                                                       "TF_CPP_MIN_LOG_LEVEL": "2",
                                                       "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    got = json.loads(line[len("RESULT "):])
    for name in names:
        s = get_spec(name)
        for fmt in ("channels_last", "channels_first"):
            params, trainable, flops, out_shape = got[f"{name}/{fmt}"]
            assert (params, trainable, flops) == (s.params, s.trainable_params,
                                                  s.flops_per_sample), (name, fmt)
            assert out_shape[-1] == s.num_classes
