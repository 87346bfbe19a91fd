"""The PyTorch transformers named in argv, and models.torch_common.describe on a user's module
and its errors, in the torch interpreter. Prints one line "RESULT <json>"."""

import json
import sys

import torch

from models import get_spec, load_builder
from models.custom import CustomModelError
from models.torch_common import describe, sample_input

torch.manual_seed(0)
out = {}
for name in sys.argv[1:]:
    spec, build = get_spec(name), load_builder(name, "torch")
    m = build(spec, data_format="channels_first")
    row = {"params": sum(p.numel() for p in m.parameters()),
           "trainable": sum(p.numel() for p in m.parameters() if p.requires_grad)}
    if name.endswith("_tiny"):
        row.update(describe(m, spec))
        m.eval()
        with torch.no_grad():
            x = sample_input(spec, 2)
            y = m(x)
            row["finite"] = bool(torch.isfinite(y).all())
            if spec.input_kind == "tokens":
                row["input_dtype"] = str(x.dtype)
                changed = x.clone()
                t = spec.input_shape[0] // 2
                changed[:, t] = (changed[:, t] + 1) % spec.num_classes
                z = m(changed)
                row["before_t_unchanged"] = bool(torch.equal(y[:, :t], z[:, :t]))
                row["from_t_changed"] = bool((y[:, t:] - z[:, t:]).abs().amax() > 0)
                row["head_tied"] = not any(p.shape == (spec.num_classes, spec.transformer.d_model)
                                           for n, p in m.named_parameters() if n != "wte.weight")
            else:
                last = build(spec, data_format="channels_last")
                last.load_state_dict(m.state_dict())
                last.eval()
                row["patch_kernel_channels_last"] = last.patch_embed.weight.is_contiguous(
                    memory_format=torch.channels_last)
                z = last(x.contiguous(memory_format=torch.channels_last))
                row["formats_max_abs_diff"] = float((y - z).abs().max())
    out[name] = row
try:
    describe(object(), get_spec("gpt2_tiny"))
    out["not_a_model"] = "no error"
except CustomModelError as e:
    out["not_a_model"] = str(e)
mini = get_spec("minigooglenet")
out["minigooglenet"] = describe(load_builder("minigooglenet", "torch")(mini), mini)
print("RESULT " + json.dumps(out))
