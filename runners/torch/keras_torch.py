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
Models (issue 26): a built-in CNN trains on the logits under its softmax (above); a built-in
transformer (gpt2, vit_b16 and their tiny versions: models/transformer_keras.py) or a user's
Keras model (models.build_for; checked to be a keras.Model with the entry's output shape and
described by models.keras_common.describe on the rank's device, Invalid when wrong) returns
logits itself and is wrapped as it is. A token model (int32 ids (B, T) in, logits (B, T, V)
out) takes each rank's synthetic slice of ids (B/N, T + 1) in [0, V), made on its device once
as the images are: inputs ids[:, :-1], targets ids[:, 1:], cross-entropy the mean over all
B/N x T positions of the rank (DDP averages the ranks, so the global mean); real data is
unavailable (the prepared datasets are images). The loss stays torch's (the guide's loop;
torch.nn.functional.cross_entropy on float32 logits, what Keras' sparse cross-entropy from
logits computes). A user's image model is fed H, W, C, as its entry declares (option
data_format applies to the built-in models). The result adds flops_source, tokens_per_sample
and workload: params counted by Keras, flops_per_sample a transformer's standard count (its
spec), a user's model's FlopCounterMode count (describe), a CNN's Conv2D and Dense count.
Real data: with loader `framework` each rank reads its DistributedSampler share of the JPEG
file list through a torch DataLoader (as the guide's loop does; runners/torch/data.py), in
the Keras model's layout. With loader `keras` each rank reads its share (files rank, rank + N,
...) through runners/keras_data.py's JpegSequence, a Keras 3 PyDataset with `workers`
processes, iterated by the adapter Keras' own fit uses on the torch backend (the public
PyDataset iterates serially; its workers only run inside that adapter).
Precision: bf16 is Keras' mixed_bfloat16 policy (float32 variables, bfloat16 compute);
precision_policy reads the policy's compute_dtype, the torch parameters' dtype and the
gradients' (DDP's all-reduce dtype). State: after the timed window each rank's parameters,
.grad and optimizer state, whole replicas (runners/torch/state.py).
Placement: each rank's batch rows and device and its Keras model's parameter device, gathered
over the process group (runners.torch.dist, as torch_ddp). Equivalence runs the benchmark's
step function (the guide's loop in DDP, the run's data_format, resident-tensor input) on the
probe, one step of SGD without momentum. Follows the guide as published for Keras 3 (Keras
3.x on PyTorch 2.13).
Converge (mode converge, runners/converge.py): the guide's loop as the benchmark runs it
(training_parts), over each rank's rows of the recipe's global batches (runners/torch/dist.py
ConvergeLoop): torch SGD with the recipe's momentum and weight decay, its param groups' learning
rate set before every step; initial weights from keras.utils.set_random_seed(recipe.seed). Rank
0 evaluates the held-out split with the Keras model called with training=False (its
BatchNormalization moving statistics, which DDP never broadcasts: they are Keras variables
held as non-trainable parameters, so each rank's follow its own rows) and shares the accuracy
with an all-reduce; every rank's moving means and variances are checked finite. What differs
from the other Keras runners: not model.fit with a learning-rate callback. Keras 3's fit has no
multi-process data parallelism on the torch backend (keras.distribution is JAX's), so per rank
it would train an unsynchronised replica; the guide trains by this loop for that reason, and so
does the benchmark.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

os.environ["KERAS_BACKEND"] = "torch"  # Keras reads its backend once, at import

import keras  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from models import ModelSpec, get_spec, load_builder, spec_of  # noqa: E402
from models.custom import CustomModelError  # noqa: E402
from models.keras_common import (  # noqa: E402
    build_run_model,
    get_canonical_weights,
    model_record,
    set_canonical_weights,
)
from runners.common import Invalid, Spec, Unavailable, main  # noqa: E402
from runners.memory import model_state_torch  # noqa: E402
from runners.real_data import batch_at, check_classes, open_dataset, rank_files  # noqa: E402
from runners.torch.data import Batch, RealInput, SyntheticInput  # noqa: E402
from runners.torch.dist import (  # noqa: E402
    ConvergeLoop,
    PlacementTracker,
    Ranks,
    StepCounter,
    converge_splits,
    equivalence_input,
    equivalence_step,
    init_ranks,
    loss_of,
    per_rank_batch,
    rank_input,
    rank_shares,
    timed_steps,
    wrap_ddp,
)
from runners.torch.state import AFTER_WINDOW, grad_dtype, state_bytes, torch_precision  # noqa: E402

POLICIES = {"fp32": "float32", "tf32": "float32", "bf16": "mixed_bfloat16"}


def framework_versions() -> dict[str, str]:
    return {"keras": keras.__version__, "torch": torch.__version__, "numpy": np.__version__}


def check_backend() -> None:
    if keras.backend.backend() != "torch":
        raise Unavailable(f"keras {keras.__version__} loaded the {keras.backend.backend()} "
                          "backend, not torch")


def input_shape(model_spec: ModelSpec, data_format: str) -> tuple[int, ...]:
    """One sample's shape in the data format; a token model's is its sequence."""
    if model_spec.input_kind == "tokens":
        return model_spec.input_shape
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


def build_run_logits(spec: Spec, model_spec: ModelSpec, data_format: str, ranks: Ranks
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


def keras_input(spec: Spec, ranks: Ranks, model_spec: ModelSpec, batch: int,
                channels_first: bool) -> RealInput:
    """This rank's share (files rank, rank + N, ...) through JpegSequence, a Keras 3 PyDataset
    with `workers` processes, iterated as Keras' fit does on the torch backend."""
    from keras.src.trainers.data_adapters.py_dataset_adapter import PyDatasetAdapter

    from runners.keras_data import JpegSequence

    data = open_dataset(spec)
    check_classes(data, model_spec.num_classes, spec.model)
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


def training_parts(ranks: Ranks, logits: keras.Model, lr: float, momentum: float,
                   weight_decay: float = 0.0
                   ) -> tuple[torch.nn.Module, StepCounter, PlacementTracker]:
    """What the step function of every mode is made of, the guide's: the logits model in DDP,
    torch SGD over its parameters (counted: StepCounter), the placement tracker."""
    ddp_model = wrap_ddp(logits, ranks)
    optimizer = torch.optim.SGD(logits.parameters(), lr=lr, momentum=momentum,
                                weight_decay=weight_decay)
    return ddp_model, StepCounter(optimizer), PlacementTracker(logits)


def training_step(ranks: Ranks, logits: keras.Model, feed: SyntheticInput | RealInput,
                  lr: float, momentum: float
                  ) -> tuple[Callable[[], torch.Tensor], StepCounter, PlacementTracker]:
    """The one step function of the benchmark and equivalence modes, the guide's loop:
    model(x, training=True), CrossEntropyLoss, torch SGD (training_parts); it returns this
    rank's loss."""
    ddp_model, counter, tracker = training_parts(ranks, logits, lr, momentum)
    optimizer = counter.optimizer

    def step() -> torch.Tensor:
        x, y = feed.next()
        outputs = ddp_model(tracker.saw(x), training=True)
        loss = loss_of(outputs, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step, counter, tracker


def dtype_policy(spec: Spec) -> str:
    """Keras' dtype policy for the run's precision (set globally before the model is built)."""
    if spec.precision not in POLICIES:
        raise Unavailable(f"precision {spec.precision}: this runner has fp32 and bf16 "
                          "(Keras' mixed_bfloat16 policy)")
    keras.mixed_precision.set_global_policy(POLICIES[spec.precision])
    return POLICIES[spec.precision]


def benchmark(spec: Spec) -> dict[str, Any]:
    check_backend()
    policy = dtype_policy(spec)
    # a user's Keras model takes images as it declares them, H, W, C (models/custom.py)
    data_format = "channels_last" if spec.custom_model else spec.options["data_format"]
    loader = spec.options["loader"]
    ranks = init_ranks(spec, "auto")
    batch = per_rank_batch(spec, ranks)
    model_spec = spec_of(spec)
    tokens = model_spec.input_kind == "tokens"
    channels_first = data_format == "channels_first"
    feed: SyntheticInput | RealInput
    if spec.data == "real" and loader == "keras" and not tokens:
        feed = keras_input(spec, ranks, model_spec, batch, channels_first)
    else:  # a token model's ids int32, what the Keras model's Input takes
        feed = rank_input(spec, ranks, model_spec, batch, input_shape(model_spec, data_format),
                          channels_first, token_dtype=torch.int32)
    keras.utils.set_random_seed(0)  # the same initial weights everywhere (DDP broadcasts too)
    model, logits, described = build_run_logits(spec, model_spec, data_format, ranks)
    step, counter, tracker = training_step(ranks, logits, feed, 0.01, 0.9)
    result = timed_steps(spec, ranks, step, counter, tracker, feed)
    result.update({
        "framework": framework_versions(),
        "layout": "tokens (batch, sequence)" if tokens else data_format,
        "dtype_policy": policy,
        "strategy": "Keras model (torch backend) in torch DistributedDataParallel, one process "
                    "per device (torchrun), trained by the PyTorch loop of Keras' guide",
        "loop": "torch.optim.SGD + torch.nn.functional.cross_entropy on the float32 logits "
                "(every position of a token model's), model(x, training=True)",
        **model_record(model, model_spec, described),
        **model_state_torch(logits, counter.optimizer),
        **state_bytes(ranks, logits.parameters(), counter.optimizer.state.values(),
                      AFTER_WINDOW),
        **torch_precision(spec.precision, keras.mixed_precision.global_policy().compute_dtype,
                          logits, grad_dtype(logits),
                          f"keras.mixed_precision.set_global_policy({policy!r}); no autocast"),
    })
    if spec.data == "real":
        result["loader_option"] = loader
    ranks.close()
    return result


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
    """Mode converge (runners/converge.py): the guide's loop, as the benchmark runs it (the
    Keras model's logits in DDP, model(x, training=True), torch SGD with the recipe's momentum
    and weight decay, the learning rate set in its param groups before every step), over this
    rank's share of each of the recipe's global batches; initial weights from
    keras.utils.set_random_seed(recipe.seed); held-out accuracy of the Keras model called
    with training=False (BatchNorm's moving statistics) on rank 0 (ConvergeLoop). Not fit:
    Keras 3's fit has no multi-process data parallelism on the torch backend (keras.
    distribution is JAX's), which is why the guide trains by this loop."""
    from runners.converge import Recipe, train_to_accuracy

    check_backend()
    policy = dtype_policy(spec)
    recipe = Recipe.of(spec)
    if spec.custom_model:
        raise Unavailable("mode converge trains the built-in CNNs (a user's Keras model's "
                          "logits are not separated from its output layer here)")
    data_format = spec.options["data_format"]
    ranks = init_ranks(spec, "auto")
    model_spec = spec_of(spec)
    if model_spec.workload != "cnn":
        raise Unavailable(f"mode converge trains an image CNN; {spec.model} is a "
                          f"{model_spec.workload}")
    splits = converge_splits(spec, model_spec)
    keras.utils.set_random_seed(recipe.seed)
    model, logits = build_logits_model(spec.model, data_format, ranks)
    ddp_model, counter, tracker = training_parts(ranks, logits, recipe.base_lr,
                                                 recipe.momentum, recipe.weight_decay)

    def to_input(x: np.ndarray) -> torch.Tensor:  # NHWC pixels in the model's data format
        t = torch.from_numpy(x).to(ranks.device)
        return t if data_format == "channels_last" else t.permute(0, 3, 1, 2).contiguous()

    loop = ConvergeLoop(ranks, spec.precision, lambda x: ddp_model(x, training=True),
                        lambda x: logits(x, training=False), to_input, counter, tracker,
                        lambda: keras_bn_stats(model), cast=False)
    result = train_to_accuracy(spec, loop.train_epoch, loop.evaluate, loop.moving_stats,
                               ranks.rank, ranks.world, splits)
    result.update({
        **loop.record(result["samples"]),
        "framework": framework_versions(),
        "layout": data_format,
        "dtype_policy": policy,
        "strategy": "Keras model (torch backend) in torch DistributedDataParallel, one process "
                    "per device (torchrun), trained by the PyTorch loop of Keras' guide",
        "loop": "the guide's loop over the recipe's batches (this rank's rows of each): "
                "torch.optim.SGD, its param groups' lr set before each step, cross-entropy "
                "on the float32 logits, model(x, training=True); not fit (see the module's "
                "docstring)",
        "batch_size_per_rank": rank_shares(spec.global_batch_size, ranks.world),
        "input": "the dataset's splits (splits.npz) in memory; each rank's rows copied to its "
                 "device per step",
        **model_record(model, model_spec, None),
        **model_state_torch(logits, counter.optimizer),
        **state_bytes(ranks, logits.parameters(), counter.optimizer.state.values(),
                      "after the last epoch's last step"),
        **torch_precision(spec.precision, keras.mixed_precision.global_policy().compute_dtype,
                          logits, grad_dtype(logits),
                          f"keras.mixed_precision.set_global_policy({policy!r}); no autocast"),
    })
    ranks.close()
    return result


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step (momentum 0) of the benchmark's step function on the probe, each rank
    on its slice of the batch, resident on its device in the run's layout as the synthetic
    input is; weights saved."""
    check_backend()
    data_format = spec.options["data_format"]
    ranks = init_ranks(spec, "auto")
    weights, x, y, lr = spec.equivalence_inputs()
    feed = equivalence_input(x, y, ranks, data_format == "channels_first")
    dtype_policy(spec)
    model, logits = build_logits_model("probe", data_format, ranks)
    set_canonical_weights(model, weights)
    step, counter, tracker = training_step(ranks, logits, feed, lr, 0.0)
    return equivalence_step(spec, ranks, step, counter, tracker,
                            lambda: get_canonical_weights(model),
                            framework=framework_versions(), layout=data_format)


if __name__ == "__main__":
    main(benchmark, equivalence, converge)
