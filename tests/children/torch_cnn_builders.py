"""The PyTorch CNN builders named in argv, in the torch interpreter: parameters, FLOPs (ours and
torch's FlopCounterMode), outputs, BatchNorm settings and the probe's canonical weights.
Prints one line "RESULT <json>"."""

import json
import sys

import numpy as np
import torch
from torch.utils.flop_counter import FlopCounterMode

from models import get_spec, load_builder
from models.torch_common import (
    count_flops_torch,
    count_params_torch,
    count_trainable_torch,
    get_canonical_weights,
    set_canonical_weights,
)
from tests.children.probe_reference import probe_reference

torch.manual_seed(0)
out = {}
for name in sys.argv[1:]:
    spec, build = get_spec(name), load_builder(name, "torch")
    h, w, c = spec.input_shape
    x = torch.from_numpy(np.random.default_rng(0).random((2, c, h, w), dtype=np.float32))
    first = build(spec, "channels_first")
    last = build(spec, "channels_last")
    last.load_state_dict(first.state_dict())  # copy_ keeps each parameter's memory format
    logits = {}
    for fmt, m in (("channels_first", first), ("channels_last", last)):
        m.eval()  # dropout off, so both formats compute the same function
        with torch.no_grad():
            xin = x.contiguous(memory_format=torch.channels_last) if fmt == "channels_last" else x
            y = m(xin)
            with FlopCounterMode(display=False) as counter:
                m(xin[:1])
        logits[fmt] = y.numpy().astype(np.float64)
        kernels = [p for p in m.parameters() if p.dim() == 4]
        out[f"{name}/{fmt}"] = {
            "params": count_params_torch(m), "trainable": count_trainable_torch(m),
            "flops": count_flops_torch(m, (c, h, w)),
            "flop_counter": int(counter.get_total_flops()),
            "flop_counter_ops": {str(k): int(v)
                                 for k, v in counter.get_flop_counts()["Global"].items()},
            "output_shape": list(y.shape), "finite": bool(torch.isfinite(y).all()),
            "kernels_channels_last": all(
                k.is_contiguous(memory_format=torch.channels_last) for k in kernels),
        }
    a, b = logits["channels_first"], logits["channels_last"]
    # Different conv kernels sum in different orders: float32 rounding grows with the logits'
    # magnitude (ResNet-50's reach ~50 with fresh BatchNorm statistics), so atol scales with it.
    scale = float(np.abs(a).max())
    out[f"{name}/formats"] = {"max_abs_diff": float(np.abs(a - b).max()), "scale": scale,
                              "allclose": bool(np.allclose(a, b, rtol=1e-5,
                                                           atol=1e-5 * max(scale, 1.0)))}
    try:
        build(spec, "nhwc")
        out[f"{name}/bad_format"] = "no error"
    except ValueError as e:
        out[f"{name}/bad_format"] = "ValueError: " + str(e)


probe = get_spec("probe")
build = load_builder("probe", "torch")
rng = np.random.default_rng(1)
w = {k: rng.standard_normal(s).astype(np.float32) for k, s in probe.weights}
x_nhwc = rng.standard_normal((4, *probe.input_shape)).astype(np.float32)
x_nchw = torch.from_numpy(np.ascontiguousarray(x_nhwc.transpose(0, 3, 1, 2)))
ref = probe_reference(w, x_nhwc)
result = {}
for fmt in ("channels_first", "channels_last"):
    m = build(probe, fmt)
    set_canonical_weights(m, w)
    got = get_canonical_weights(m)
    with torch.no_grad():
        p = torch.softmax(m(x_nchw), dim=1).numpy()
    result[fmt] = {"names": {k: list(v.shape) for k, v in got.items()},
                   "round_trip": all(np.array_equal(got[k], w[k]) for k in w),
                   "reference_diff": float(np.abs(p - ref).max())}
try:
    set_canonical_weights(build(probe), {"dense/kernel": w["dense/kernel"].T})
    result["bad_shape"] = "no error"
except ValueError as e:
    result["bad_shape"] = "ValueError: " + str(e)
try:
    set_canonical_weights(build(probe), {"nope/kernel": w["conv/kernel"]})
    result["unknown_name"] = "no error"
except KeyError as e:
    result["unknown_name"] = "KeyError: " + str(e)
out["probe/canonical"] = result
out["versions"] = {"torch": torch.__version__}
print("RESULT " + json.dumps(out))
