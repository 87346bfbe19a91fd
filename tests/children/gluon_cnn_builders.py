"""The Gluon CNN builders named in argv, in the MXNet interpreter: parameters, FLOPs, outputs,
BatchNorm settings and the probe's canonical weights. Prints one line "RESULT <json>"."""

import json
import sys

import mxnet as mx
import numpy as np
from mxnet.gluon import nn

from models import get_spec, load_builder
from models.gluon_common import (
    count_flops_gluon,
    count_params_gluon,
    count_trainable_gluon,
    get_canonical_weights,
    iter_blocks,
    set_canonical_weights,
)
from tests.children.mxnet_probe_data import probe_data

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
