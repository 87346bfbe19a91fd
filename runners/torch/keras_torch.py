"""keras_torch: Keras 3 on PyTorch as Keras' guide "Multi-GPU distributed training with PyTorch"
does it: one process per device (torchrun), the Keras model in torch's DDP, trained by a plain
PyTorch loop (not model.fit) in every mode. Differs from the guide: the loss reads the logits
before the CNNs' softmax, training=True passed, SGD momentum 0.9 in place of Adam, synthetic
tensors resident on the device. docs/runners/keras_torch.md."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from contract.reasons import code

os.environ["KERAS_BACKEND"] = "torch"  # Keras reads its backend once, at import

import keras
import numpy as np
import torch

from contract.result import join
from models import ModelSpec, get_spec, load_builder, spec_of
from models.custom import CustomModelError
from models.keras_common import (
    build_run_model,
    get_canonical_weights,
    model_record,
    set_canonical_weights,
)
from runners.common import Invalid, Spec, Unavailable, main
from runners.converge import Recipe, fitting_splits
from runners.memory import model_state_torch
from runners.real_data import batch_at, open_for_model, rank_files
from runners.torch import dist as td
from runners.torch.data import Batch, LoaderConfig, RealInput, equivalence_input, rank_input
from runners.torch.equivalence import equivalence_step
from runners.torch.rank_converge import ConvergeModel, RankConverge
from runners.torch.state import AFTER_WINDOW, grad_dtype, state_bytes, torch_precision

STRATEGY = code("torch.keras_ddp_strategy")
POLICIES = {"fp32": "float32", "tf32": "float32", "bf16": "mixed_bfloat16"}


def build_logits_model(name: str, data_format: str, ranks: td.Ranks) -> tuple[keras.Model,
                                                                            keras.Model]:
    """The builder's model, and one sharing its layers that returns the softmax's input."""
    with keras.device(str(ranks.device)):
        model = load_builder(name, "keras")(get_spec(name), data_format=data_format)
        logits = keras.Model(model.inputs, model.get_layer("softmax").input,
                             name=f"{model.name}_logits")
    return model, logits.to(ranks.device)


def build_run_logits(spec: Spec, model_spec: ModelSpec, data_format: str, ranks: td.Ranks
                     ) -> tuple[keras.Model, keras.Model, dict[str, Any] | None]:
    """(the run's model, the model of its logits, a user's model's description or None): a
    built-in CNN as build_logits_model; a transformer or a user's model (models.build_for,
    checked and described on the rank's device, Invalid when wrong) already returns logits."""
    if model_spec.workload == "cnn":
        return (*build_logits_model(spec.model, data_format, ranks), None)
    try:
        with keras.device(str(ranks.device)):
            model, described = build_run_model(spec, model_spec, data_format=data_format)
    except CustomModelError as exc:
        raise Invalid(str(exc)) from None
    return model, model.to(ranks.device), described


def keras_input(spec: Spec, ranks: td.Ranks, model_spec: ModelSpec, channels_first: bool
                ) -> RealInput:
    """This rank's share (files rank, rank + N, ...) through JpegSequence, a Keras 3 PyDataset
    with `workers` processes, iterated as Keras' fit does on the torch backend."""
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    from runners.keras_data import JpegSequence

    data = open_for_model(spec, model_spec)
    batch = spec.split_batch(ranks.world, "ranks")
    share = rank_files(data.files, ranks.rank, ranks.world)
    size = model_spec.input_shape[0]
    steps = spec.warmup_steps + spec.measure_steps
    sequence = JpegSequence(share, size, data.augmentation, batch, steps, channels_first,
                            data.workers, seed=ranks.rank)
    loader = PyDatasetAdapter(sequence, shuffle=False).get_torch_dataloader()

    def batches() -> Iterator[Batch]:
        for i, (x, y) in enumerate(loader):
            share_index = batch_at(len(share), batch, i, ranks.rank)
            yield x, y, torch.from_numpy(ranks.rank + share_index * ranks.world)

    description = (f"Keras 3 PyDataset (JpegSequence) over the JPEG file list: rank r reads "
                   f"files r, r + {ranks.world}, ... ({len(share)} images); Pillow decode and "
                   f"numpy {data.augmentation} in "
                   + (f"{data.workers} worker process(es)" if data.workers else
                      "the main process (workers 0)")
                   + f", through the adapter fit uses on the torch backend; batches copied "
                   f"to {ranks.device}")
    return RealInput("keras", description, batches(), ranks.device, torch.contiguous_format,
                     data, size, len(share))


def training_parts(ranks: td.Ranks, logits: keras.Model, lr: float, momentum: float,
                   weight_decay: float = 0.0) -> td.StepParts:
    """What the step function of every mode is made of, the guide's: the logits model in DDP
    called with training=True, torch SGD over its parameters (counted), the tracker; no
    autocast (the Keras policy casts)."""
    ddp_model = td.wrap_ddp(logits, ranks)
    optimizer = torch.optim.SGD(logits.parameters(), lr=lr, momentum=momentum,
                                weight_decay=weight_decay)
    return td.StepParts(lambda x: ddp_model(x, training=True), td.StepCounter(optimizer),
                     td.PlacementTracker(logits), cast=False)


def training_step(ranks: td.Ranks, logits: keras.Model, feed: td.Feed, lr: float, momentum: float
                  ) -> tuple[td.Step, td.StepParts]:
    """The one step function of the benchmark and equivalence modes, the guide's loop:
    model(x, training=True), the loss, zero_grad, backward, step; it returns this rank's loss."""
    parts = training_parts(ranks, logits, lr, momentum)
    optimizer = parts.optimizer

    def step() -> torch.Tensor:
        x, y = feed.next()
        loss = td.loss_of(parts.model(parts.tracker.saw(x)), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step, parts


def dtype_policy(spec: Spec) -> str:
    """Keras' dtype policy for the run's precision (set globally before the model is built),
    once Keras is checked to run on torch: every mode's first step."""
    if keras.backend.backend() != "torch":
        raise Unavailable(f"keras {keras.__version__} loaded the {keras.backend.backend()} "
                          "backend, not torch")
    if spec.precision not in POLICIES:
        raise Unavailable(f"precision {spec.precision}: this runner has fp32 and bf16 "
                          "(Keras' mixed_bfloat16 policy)")
    keras.mixed_precision.set_global_policy(POLICIES[spec.precision])
    return POLICIES[spec.precision]


def keras_fields(spec: Spec, ranks: td.Ranks, policy: str, logits: keras.Model,
                 optimizer: torch.optim.Optimizer, when: str) -> dict[str, Any]:
    """What a benchmark and a converge result say alike: versions, the policy, the strategy,
    the model state (read `when`) and the precision read back."""
    return join({"framework": td.framework_versions("keras"), "dtype_policy": policy,
                 "strategy": STRATEGY},
                model_state_torch(logits, optimizer),
                state_bytes(ranks, logits.parameters(), optimizer.state.values(), when),
                torch_precision(spec.precision,
                                keras.mixed_precision.global_policy().compute_dtype, logits,
                                grad_dtype(logits), f"keras.mixed_precision.set_global_policy("
                                                    f"{policy!r}); no autocast"))


def benchmark(spec: Spec) -> dict[str, Any]:
    policy = dtype_policy(spec)
    # a user's Keras model takes images as it declares them, H, W, C (models/custom.py)
    data_format = "channels_last" if spec.custom_model else spec.options["data_format"]
    loader = spec.options["loader"]
    ranks = td.init_ranks(spec, "auto")
    model_spec = spec_of(spec)
    tokens = model_spec.input_kind == "tokens"
    channels_first = data_format == "channels_first"
    feed: td.Feed
    if spec.data == "real" and loader == "keras" and not tokens:
        feed = keras_input(spec, ranks, model_spec, channels_first)
    else:  # one sample's shape in the data format; a token model's: its sequence of int32
        # ids, what the Keras model's Input takes
        shape = (model_spec.input_shape if tokens or data_format == "channels_last"
                 else td.nchw(model_spec))
        feed = rank_input(spec, ranks.place, model_spec, shape,
                          LoaderConfig(channels_first=channels_first), torch.int32)
    keras.utils.set_random_seed(0)  # the same initial weights everywhere (DDP broadcasts too)
    model, logits, described = build_run_logits(spec, model_spec, data_format, ranks)
    step, parts = training_step(ranks, logits, feed, 0.01, 0.9)
    result = td.timed_steps(spec, ranks, step, parts.counter, parts.tracker, feed)
    return td.closing(ranks, result, {
        "layout": "tokens (batch, sequence)" if tokens else data_format,
        "loop": code("torch.keras_sgd_cross_entropy"),
        **({"loader_option": loader} if spec.data == "real" else {}),
    }, keras_fields(spec, ranks, policy, logits, parts.optimizer, AFTER_WINDOW),
        model_record(model, model_spec, described))


def keras_bn_stats(model: keras.Model) -> list[tuple[str, torch.Tensor]]:
    """Every Keras BatchNormalization layer's moving_mean and moving_variance (the Keras
    variables' torch tensors), named by the variables' paths; nested models walked."""
    out = []
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            out += [(v.path, v.value) for v in (layer.moving_mean, layer.moving_variance)]
        elif isinstance(layer, keras.Model):
            out += keras_bn_stats(layer)
    return out


def converge(spec: Spec) -> dict[str, Any]:
    """Mode converge: the guide's loop as the benchmark runs it (training_parts, torch SGD with
    the recipe's momentum and weight decay), initial weights from keras.utils.set_random_seed(
    recipe.seed), through RankConverge; rank 0 evaluates the Keras model called with
    training=False (its BatchNormalization moving statistics, never broadcast by DDP)."""
    policy = dtype_policy(spec)
    recipe = Recipe.of(spec)
    if spec.custom_model:
        raise Unavailable("mode converge trains the built-in CNNs (a user's Keras model's "
                          "logits are not separated from its output layer here)")
    data_format = spec.options["data_format"]
    ranks = td.init_ranks(spec, "auto")
    model_spec = spec_of(spec)
    if model_spec.workload != "cnn":
        raise Unavailable(f"mode converge trains an image CNN; {spec.model} is a "
                          f"{model_spec.workload}")
    splits = fitting_splits(spec, model_spec)
    keras.utils.set_random_seed(recipe.seed)
    model, logits = build_logits_model(spec.model, data_format, ranks)
    parts = training_parts(ranks, logits, recipe.base_lr, recipe.momentum, recipe.weight_decay)

    def to_input(x: np.ndarray) -> torch.Tensor:  # NHWC pixels in the model's data format
        t = torch.from_numpy(x).to(ranks.device)
        return t if data_format == "channels_last" else t.permute(0, 3, 1, 2).contiguous()

    loop = RankConverge(ranks, spec.precision, parts, ConvergeModel(
        to_input, lambda x: logits(x, training=False), lambda: keras_bn_stats(model)))
    return td.closing(ranks, loop.run(spec, splits), {
        "layout": data_format,
        "loop": code("torch.keras_guide_loop"),
    }, keras_fields(spec, ranks, policy, logits, parts.optimizer,
                    "read after the last epoch's last step"), model_record(model, model_spec, None))


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step (momentum 0) of the benchmark's step function on the probe, each rank
    on its slice of the batch, resident on its device in the run's layout as the synthetic
    input is; weights saved."""
    dtype_policy(spec)  # fp32: the equivalence step's precision
    data_format = spec.options["data_format"]
    ranks = td.init_ranks(spec, "auto")
    weights, x, y, lr = spec.equivalence_inputs()
    feed = equivalence_input(x, y, ranks.place,
                             LoaderConfig(channels_first=data_format == "channels_first"))
    model, logits = build_logits_model("probe", data_format, ranks)
    set_canonical_weights(model, weights)
    step, parts = training_step(ranks, logits, feed, lr, 0.0)
    return equivalence_step(spec, ranks, step, parts.counter, parts.tracker,
                            lambda: get_canonical_weights(model),
                            framework=td.framework_versions("keras"), layout=data_format)


if __name__ == "__main__":
    main(benchmark, equivalence, converge)
