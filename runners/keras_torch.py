"""Keras 3 on PyTorch, multi-device the way Keras' guide "Multi-GPU distributed training with
PyTorch" (keras.io/guides/distributed_training_with_torch) does it: one process per device,
the Keras model (a torch.nn.Module under the torch backend) wrapped in torch's
DistributedDataParallel and trained by a plain PyTorch loop with a torch optimizer and
torch.nn.CrossEntropyLoss, not by model.fit.

Processes: torchrun starts one rank per device (the guide forks them with
torch.multiprocessing; torchrun is the launcher of the same process group) and each rank
joins it as torch_ddp's ranks do (NCCL between GPUs, gloo between virtual CPU devices).
Split, reduce, synchronise: as torch_ddp (one B/N slice per rank, made on its device; DDP
all-reduces gradient buckets during backward and averages them over the ranks, so every rank
applies the gradient of the global mean loss; .item() on the loss waits for the step).
Differences from the guide, and why: the builders end in a softmax, so the loss reads the
logits of the layer before it (the guide's model ends in logits); the guide's loop calls
model(inputs), which in Keras 3 leaves BatchNorm and Dropout in inference mode (Keras does not
read torch's module.training), so this runner passes training=True; SGD with momentum 0.9,
the harness's optimizer, in place of the guide's Adam; synthetic tensors resident on the
device instead of a DataLoader over MNIST.
Precision: bf16 is Keras' mixed_bfloat16 policy (float32 variables, bfloat16 compute).
"""

from __future__ import annotations

import os
from typing import Any

os.environ["KERAS_BACKEND"] = "torch"  # Keras reads its backend once, at import

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from models import ModelSpec, get_spec, load_builder  # noqa: E402
from models.keras_common import (  # noqa: E402
    count_flops_keras,
    count_params_keras,
    get_canonical_weights,
    set_canonical_weights,
)
from runners.common import (  # noqa: E402
    Spec,
    Unavailable,
    load_equivalence_inputs,
    main,
)
from runners.torch_dist import (
    Ranks,
    StepCounter,
    close_ranks,
    equivalence_part,
    finish_equivalence,  # noqa: E402
    init_ranks,
    per_rank_batch,
    synthetic_slice,
    threads_record,
    timed_steps,
    wrap_ddp,
)

POLICIES = {"fp32": "float32", "bf16": "mixed_bfloat16"}


def framework_versions() -> dict[str, str]:
    return {"keras": keras.__version__, "torch": torch.__version__, "numpy": np.__version__}


def check_backend() -> None:
    if keras.backend.backend() != "torch":
        raise Unavailable(f"keras {keras.__version__} loaded the {keras.backend.backend()} "
                          "backend, not torch")


def input_shape(model_spec: ModelSpec, data_format: str) -> tuple[int, int, int]:
    h, w, c = model_spec.input_shape
    return (h, w, c) if data_format == "channels_last" else (c, h, w)


def build_logits_model(name: str, data_format: str, ranks: Ranks) -> tuple[keras.Model,
                                                                            keras.Model]:
    """The builder's model, and one sharing its layers that returns the softmax's input."""
    with keras.device(str(ranks.device)):
        model = load_builder(name, "keras")(get_spec(name), data_format=data_format)
        logits = keras.Model(model.inputs, model.get_layer("softmax").input,
                             name=f"{model.name}_logits")
    return model, logits.to(ranks.device)


def benchmark(spec: Spec) -> dict[str, Any]:
    check_backend()
    if spec["data"] != "synthetic":
        raise Unavailable(f"data {spec['data']!r} is not supported by this runner yet")
    if spec["precision"] not in POLICIES:
        raise Unavailable(f"precision {spec['precision']}: this runner has fp32 and bf16 "
                          "(Keras' mixed_bfloat16 policy)")
    data_format = spec["options"].get("data_format", "channels_last")
    ranks = init_ranks(spec)
    batch = per_rank_batch(spec, ranks)
    policy = POLICIES[spec["precision"]]
    keras.mixed_precision.set_global_policy(policy)
    keras.utils.set_random_seed(0)  # the same initial weights everywhere (DDP broadcasts too)
    model_spec = get_spec(spec["model"])
    model, logits = build_logits_model(spec["model"], data_format, ranks)
    ddp_model = wrap_ddp(logits, ranks)
    optimizer = torch.optim.SGD(logits.parameters(), lr=0.01, momentum=0.9)
    counter = StepCounter(optimizer)
    loss_fn = torch.nn.CrossEntropyLoss()
    x, y = synthetic_slice(ranks, input_shape(model_spec, data_format), model_spec.num_classes,
                           batch)

    def step() -> torch.Tensor:
        outputs = ddp_model(x, training=True)
        loss = loss_fn(outputs.float(), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.detach()

    result = timed_steps(spec, ranks, step, counter, batch)
    result.update({
        "replicas": ranks.world,
        "framework": framework_versions(),
        "devices": ranks.devices,
        "layout": data_format,
        "dtype_policy": policy,
        "backend": ranks.backend,
        "strategy": "Keras model (torch backend) in torch DistributedDataParallel, one process "
                    "per device (torchrun), trained by the PyTorch loop of Keras' guide",
        "loop": "torch.optim.SGD + torch.nn.CrossEntropyLoss on the logits, "
                "model(x, training=True)",
        "data_placement": "one synthetic slice per rank, generated on its device once",
        "threads": threads_record(ranks),
        "params": count_params_keras(model),
        "flops_per_sample": count_flops_keras(model),
    })
    close_ranks()
    return result


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step on the probe, each rank on its slice of the batch; weights saved."""
    check_backend()
    data_format = spec["options"].get("data_format", "channels_last")
    ranks = init_ranks(spec)
    weights, x, y, lr = load_equivalence_inputs(spec)
    x_part, ys = equivalence_part(x, y, ranks)
    model, logits = build_logits_model("probe", data_format, ranks)
    set_canonical_weights(model, weights)
    ddp_model = wrap_ddp(logits, ranks)
    optimizer = torch.optim.SGD(logits.parameters(), lr=lr)
    xs = x_part if data_format == "channels_last" else x_part.transpose(0, 3, 1, 2)
    xs = torch.from_numpy(np.ascontiguousarray(xs)).to(ranks.device)  # inputs come NHWC
    loss = torch.nn.CrossEntropyLoss()(ddp_model(xs, training=True).float(), ys)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return finish_equivalence(spec, ranks, loss, lambda: get_canonical_weights(model),
                              data_format)


if __name__ == "__main__":
    main(benchmark, equivalence)
