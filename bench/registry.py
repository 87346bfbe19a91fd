"""Runners and framework families the harness knows, described without importing them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Option:
    """One runner option: its type, default, and (optionally) the values allowed."""

    type: type | tuple[type, ...]
    default: Any
    allowed: tuple[Any, ...] | None = None
    help: str = ""


@dataclass(frozen=True)
class Family:
    """A framework family: one Python environment per device variant."""

    name: str
    description: str
    requirements: dict[str, str]  # variant ("cpu" | "gpu") -> requirements file, repo-relative
    # A script run with the environment's interpreter after pip install (argument: the
    # variant), for what pip alone cannot do (Horovod's patched source build); repo-relative.
    post_install: str | None = None


@dataclass(frozen=True)
class RunnerInfo:
    """What the parent knows of a runner: where it lives and what it accepts."""

    name: str
    family: str
    module: str
    description: str
    options: dict[str, Option] = field(default_factory=dict)
    precisions: tuple[str, ...] = ("fp32",)
    equivalence: bool = True  # takes part in the data-parallel equivalence test
    # Option sets the equivalence test runs besides the defaults: every option that changes
    # how gradients are reduced or the step is compiled (each dict overrides the defaults).
    equivalence_options: tuple[dict[str, Any], ...] = ()
    # How the parent starts the run: "python" (one process), "torchrun" (one process per
    # device, torch.distributed.run) or "horovodrun" (one per device, over gloo).
    launcher: str = "python"
    unavailable: str | None = None  # why this runner can never run here (list shows it)


# Options every runner accepts; the launcher consumes them, the child never sees them.
COMMON_OPTIONS: dict[str, Option] = {
    "python": Option(str, None, help="use this interpreter instead of the family's environment"),
}

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family("tf", "TensorFlow 2.21 with Keras 3",
               {"cpu": "envs/tf-cpu.txt", "gpu": "envs/tf-gpu.txt"}),
        Family("mxnet", "Apache MXNet 1.9.1 (Gluon) with keras-mxnet 2.2.4.3",
               {"cpu": "envs/mxnet-cpu.txt", "gpu": "envs/mxnet-gpu.txt"}),
        Family("torch", "PyTorch 2.13 with Keras 3 (torch backend)",
               {"cpu": "envs/torch-cpu.txt", "gpu": "envs/torch-gpu.txt"}),
        Family("jax", "JAX with Flax and optax, and Keras 3 (jax backend)",
               {"cpu": "envs/jax-cpu.txt", "gpu": "envs/jax-gpu.txt"}),
        Family("horovod", "Horovod 0.28.1 built from source against PyTorch 2.13 (gloo)",
               {"cpu": "envs/horovod-cpu.txt", "gpu": "envs/horovod-gpu.txt"},
               post_install="envs/horovod_build.py"),
    ]
}

LOADER_OPTION = Option(str, "framework", ("framework", "keras"),
                       "real data: the framework's fast pipeline, or the Keras-idiomatic "
                       "Sequence/PyDataset a Keras user writes (runners/keras/data.py)")

KERAS2_INPUT_OPTION = Option(str, "feed_dict", ("feed_dict", "staging", "tf_data"),
                             "Keras 2 tower runners: numpy batches fed by session.run's "
                             "feed_dict every step (as fit on arrays did), the same through a "
                             "StagingArea per tower one step ahead, or a tf.data dataset "
                             "given to fit")
KERAS2_WRAP_OPTION = Option(bool, False, help="at 1 device, build the one-tower wrapper "
                                              "(measures its cost) instead of the plain model "
                                              "the original falls back to")

JAX_BATCHNORM_OPTION = Option(str, "per_device", ("per_device", "global"),
                              "per_device: each device's BatchNorm normalises its own B/N rows "
                              "(shard_map), as MirroredStrategy and DDP do; global: statistics "
                              "over the whole global batch (jit over the sharded batch: XLA "
                              "all-reduces them, sync BatchNorm)")


DATA_LOADER_OPTION = Option(str, "auto", ("auto", "dataloader", "dali"),
                            "real data: NVIDIA DALI on GPUs when it is installed (auto), or "
                            "always the torch DataLoader, or always DALI")

RUNNERS: dict[str, RunnerInfo] = {
    r.name: r
    for r in [
        RunnerInfo(
            "tf_mirrored",
            "tf",
            "runners.tf.mirrored",
            "Keras 3 model.fit under tf.distribute.MirroredStrategy",
            options={
                "loader": LOADER_OPTION,
                "xla": Option(bool, False, help="compile the train step with XLA (jit_compile; "
                              "Keras 3 compiles strategy.run whole, so 2+ replicas are "
                              "unavailable)"),
                "steps_per_execution": Option(int, 1, help="train steps per tf.function call"),
                "data_format": Option(
                    str, "channels_last", ("channels_last", "channels_first"), "tensor layout"
                ),
                "cross_device_ops": Option(
                    str,
                    "auto",
                    ("auto", "nccl", "hierarchical_copy", "reduction_to_one_device"),
                    "how MirroredStrategy all-reduces gradients",
                ),
            },
            precisions=("fp32", "tf32", "bf16", "fp16"),
            equivalence_options=({"cross_device_ops": "reduction_to_one_device"},
                                 {"cross_device_ops": "hierarchical_copy"}),
        ),
        RunnerInfo(
            "tf_native",
            "tf",
            "runners.tf.native",
            "custom training loop in tf.function under MirroredStrategy (the no-Keras baseline)",
            options={
                "xla": Option(bool, False, help="jit_compile the train step"),
                "data_format": Option(
                    str, "channels_last", ("channels_last", "channels_first"), "tensor layout"
                ),
                "fused_batchnorm": Option(bool, True, help="BatchNorm by TF's fused kernel "
                                          "(FusedBatchNormV3), not Keras 3's unfused ops"),
            },
            precisions=("fp32", "tf32", "bf16", "fp16"),
            # No reduction option (MirroredStrategy's default all-reduce). Not here: xla (on 2
            # virtual CPU devices XLA runs every replica on CPU:0, so the step is invalid:
            # tests/test_tf_runners.py checks that, and xla = no xla at 1 device) and
            # channels_first (TF's CPU Conv2DBackpropFilter has no NCHW kernel).
        ),
        RunnerInfo(
            "keras_tf_kuza55",
            "tf",
            "runners.tf.keras_kuza55",
            "kuza55's make_parallel (2016) on Keras 2 (tf_keras, TF1 graph, fit): whole batch "
            "to every tower, sliced there, outputs merged on /cpu:0",
            options={
                "loader": LOADER_OPTION,
                "input": KERAS2_INPUT_OPTION,
                "ps": Option(str, "cpu", ("cpu", "gpu"), "where the template's variables live"),
            },
            # staging and tf_data input: the shared keras2_towers code, run through
            # multi_gpu_model's cases (the suite's time budget)
            equivalence_options=({"ps": "gpu"},),
        ),
        RunnerInfo(
            "keras_tf_multi_gpu_model",
            "tf",
            "runners.tf.keras_multi_gpu_model",
            "Keras 2.1.6-2.2.5 multi_gpu_model on Keras 2 (tf_keras, TF1 graph, fit): CPU "
            "template, replicas per device, CPU merge; plain model at 1 device",
            options={
                "loader": LOADER_OPTION,
                "input": KERAS2_INPUT_OPTION,
                "keras_version": Option(str, "2.2", ("2.1", "2.2"),
                                        "2.1: slice inside each replica's device scope (whole "
                                        "batch to every device); 2.2: slice on the input's "
                                        "device (keras PR #10230)"),
                "cpu_merge": Option(bool, True, help="merge replica outputs on the CPU"),
                "cpu_relocation": Option(bool, False,
                                         help="clone the template under /cpu:0 and train the "
                                              "clone (Keras 2.1.6+)"),
                "wrap_single_device": KERAS2_WRAP_OPTION,
            },
            equivalence_options=({"keras_version": "2.1"}, {"cpu_merge": False},
                                 {"input": "staging"}, {"input": "tf_data"},
                                 {"wrap_single_device": True}),
        ),
        RunnerInfo(
            "keras_tf_avolkov1",
            "tf",
            "runners.tf.keras_avolkov1",
            "avolkov1's make_parallel (2017) on Keras 2 (tf_keras, TF1 graph, fit): slicing "
            "and merge on the parameter device, StagingArea input, its multi-GPU optimizer; "
            "plain model at 1 device",
            options={
                "loader": LOADER_OPTION,
                "input": KERAS2_INPUT_OPTION,
                "ps": Option(str, "cpu", ("cpu", "gpu"),
                             "where variables live, slicing and the merge run"),
                "average_gradients": Option(bool, False,
                                            help="its SGD_MGPU: gradients of the merged loss "
                                                 "once per device (N backward passes), "
                                                 "averaged"),
                "nccl": Option(bool, False, help="average those copies by NCCL all-reduce "
                                                 "(GPUs; needs average_gradients)"),
                "wrap_single_device": KERAS2_WRAP_OPTION,
            },
            equivalence_options=({"average_gradients": True}, {"input": "staging"},
                                 {"ps": "gpu"},
                                 {"average_gradients": True, "input": "staging"},
                                 {"wrap_single_device": True}),
        ),
        RunnerInfo(
            "tensorpack",
            "tf",
            "runners.tf.tensorpack",
            "tensorpack 0.11 synchronous multi-tower trainers (tf.compat.v1, legacy Keras)",
            options={
                "trainer": Option(str, "replicated", ("replicated", "parameter_server"),
                                  "SyncMultiGPUTrainerReplicated or ...ParameterServer"),
                "input": Option(str, "staging", ("queue", "staging"),
                                "QueueInput (real data: TFDatasetInput), or it wrapped "
                                "in StagingInput"),
                "ps_device": Option(str, "cpu", ("cpu", "gpu"),
                                    "variables' device for the parameter-server trainer"),
                "allreduce": Option(str, "auto", ("auto", "nccl", "gpu", "hierarchical"),
                                    "replicated trainer's all-reduce mode (auto: tensorpack's "
                                    "choice, hierarchical with the GradientPacker at 8 towers, "
                                    "else gpu; hierarchical needs 8 towers; nccl: GPUs only)"),
            },
            equivalence_options=({"trainer": "parameter_server"},
                                 {"trainer": "parameter_server", "ps_device": "gpu"},
                                 {"input": "queue"}),
        ),
        RunnerInfo(
            "tf_cnn_benchmarks",
            "tf",
            "runners.tf.cnn_benchmarks",
            "the real tf_cnn_benchmarks script from a tensorflow/benchmarks checkout",
            options={
                "benchmarks_dir": Option(str, None, help="checkout of tensorflow/benchmarks "
                                         "(default: $TF_CNN_BENCHMARKS_DIR)"),
                "variable_update": Option(str, None,
                                          ("parameter_server", "replicated", "independent"),
                                          "--variable_update (unset: the script's "
                                          "parameter_server)"),
                "all_reduce_spec": Option(str, None, help="--all_reduce_spec, e.g. nccl"),
                "local_parameter_device": Option(str, None, ("cpu", "gpu"),
                                                 "--local_parameter_device (unset: the "
                                                 "script's gpu)"),
                "data_format": Option(str, None, ("channels_last", "channels_first"),
                                      "--data_format NHWC or NCHW (unset: the script's NCHW "
                                      "on GPUs, NHWC on CPU, the only one it runs there)"),
                "script_model": Option(str, None, ("resnet50_v1.5", "resnet50"),
                                       "--model for our resnet50 (unset: resnet50_v1.5, our "
                                       "architecture; resnet50 is v1, TF's 2017 tables)"),
            },
            precisions=("fp32", "fp16"),  # fp16: --use_fp16
            equivalence=False,  # it brings its own models
        ),
        RunnerInfo(
            "mxnet_native",
            "mxnet",
            "runners.mxnet.native",
            "native MXNet: hybridised Gluon net, a context per device, kvstore gradient reduce",
            options={
                "kvstore": Option(str, "device", ("device", "local", "nccl"),
                                  "where gradients are summed (nccl: GPUs only)"),
                "hybridize": Option(bool, True, help="compile the Gluon net to a static graph"),
            },
            precisions=("fp32", "fp16"),  # fp16: GPUs only (no fp16 convolutions on CPU)
            equivalence_options=({"kvstore": "local"}, {"hybridize": False}),
        ),
        RunnerInfo(
            "keras_mxnet",
            "mxnet",
            "runners.mxnet.keras_mxnet",
            "Keras 2.2 (keras-mxnet) compiled with a context list, trained with fit",
            options={
                "loader": LOADER_OPTION,
                "input": Option(str, "generator", ("generator", "arrays"),
                                "fit_generator on a batch generator, or fit on numpy arrays"),
                "gradient_reduce": Option(str, "mean", ("mean", "sum"),
                                          "mean: lr / N so N contexts step as 1 device; sum: "
                                          "keras-mxnet as is (N x the gradient)"),
            },
            # gradient_reduce sum steps N x as far by design: tests/test_mxnet_runners.py
            equivalence_options=({"input": "arrays"},),
        ),
        RunnerInfo(
            "torch_ddp",
            "torch",
            "runners.torch.ddp",
            "native PyTorch DistributedDataParallel, one process per device (torchrun)",
            options={
                "data_loader": DATA_LOADER_OPTION,
                "memory_format": Option(str, "channels_first",
                                        ("channels_first", "channels_last"),
                                        "torch.channels_last memory format for model and data"),
                "compile": Option(bool, False, help="torch.compile the model"),
                "backend": Option(str, "auto", ("auto", "gloo", "nccl"),
                                  "process group backend (auto: nccl on GPUs, gloo on CPU)"),
            },
            precisions=("fp32", "tf32", "bf16", "fp16"),  # autocast; fp16 with a GradScaler
            # backend gloo: what auto picks on CPU, so the default case runs it
            equivalence_options=({"compile": True}, {"memory_format": "channels_last"}),
            launcher="torchrun",
        ),
        RunnerInfo(
            "keras_torch",
            "torch",
            "runners.torch.keras_torch",
            "Keras 3 on PyTorch, multi-device through DDP as Keras' PyTorch guide does",
            options={
                "data_loader": DATA_LOADER_OPTION,
                "loader": LOADER_OPTION,
                "data_format": Option(str, "channels_last", ("channels_last", "channels_first"),
                                      "the Keras model's tensor layout"),
            },
            precisions=("fp32", "tf32", "bf16"),
            equivalence_options=({"data_format": "channels_first"},),
            launcher="torchrun",
        ),
        RunnerInfo(
            "jax_native",
            "jax",
            "runners.jax.native",
            "JAX jit with a data-parallel NamedSharding over N devices; Flax model, optax SGD",
            options={"batchnorm": JAX_BATCHNORM_OPTION},
            precisions=("fp32", "tf32", "bf16"),
            equivalence_options=({"batchnorm": "global"},),
        ),
        RunnerInfo(
            "keras_jax",
            "jax",
            "runners.jax.keras_jax",
            "Keras 3 on JAX with keras.distribution.DataParallel, trained with fit",
            options={
                "loader": LOADER_OPTION,
                "batchnorm": JAX_BATCHNORM_OPTION,
                "input": Option(str, "numpy", ("numpy", "preplaced"),
                                "numpy: fit gets host numpy data (arrays with batch_size, or the "
                                "loader's numpy batches) and DataParallel distributes each batch "
                                "itself; preplaced: batches already laid out on the devices in "
                                "DataParallel's layout (synthetic or loader=framework)"),
            },
            precisions=("fp32", "tf32", "bf16"),
            equivalence_options=({"batchnorm": "global"}, {"input": "preplaced"}),
        ),
        RunnerInfo(
            "horovod",
            "horovod",
            "runners.torch.horovod",
            "Horovod with PyTorch: DistributedOptimizer allreduce, one process per device",
            options={
                "data_loader": DATA_LOADER_OPTION,
                "fp16_allreduce": Option(bool, False,
                                         help="compress gradients to fp16 for the allreduce"),
            },
            precisions=("fp32",),
            # fp16_allreduce rounds gradients to float16: tests/test_horovod.py checks its step
            # against one device at float16's precision, not the float32 test's 1e-5
            launcher="horovodrun",
        ),
        RunnerInfo(
            "keras_cntk",
            "cntk",
            "runners.keras.cntk",
            "Keras 2.2 on CNTK 2.7 with MPI data parallelism (seed 003); cannot run here",
            equivalence=False,
            unavailable=("CNTK 2.7 ships wheels only for Python 2.7, 3.5 and 3.6, none for "
                         "this machine's Python; needs a Python 3.6 env with cntk 2.7, "
                         "keras 2.2.4 and MPI (runners/keras/cntk.py says how)"),
        ),
    ]
}


BASELINE_PIPELINE = "pil_loop"  # runs once, with 0 workers, whatever the worker counts
# Input pipelines measured on their own (mode: pipeline): decode, augment, batch; no model.
# Family "harness" is the harness's own interpreter (numpy and Pillow, no framework).
PIPELINES: dict[str, RunnerInfo] = {
    p.name: p
    for p in [
        RunnerInfo("pil_loop", "harness", "runners.pipeline_pil",
                   "the naive baseline: one Python process, Pillow decode, numpy crop/flip, "
                   "workers ignored", equivalence=False),
        RunnerInfo("tf_data", "tf", "runners.tf.pipeline",
                   "tf.data over the TFRecord shards: interleaved reads, parallel "
                   "decode_jpeg and crop/flip (workers threads), batch, prefetch",
                   equivalence=False),
        RunnerInfo("mxnet_record_iter", "mxnet", "runners.mxnet.pipeline",
                   "MXNet's C++ ImageRecordIter over train.rec (workers decode threads)",
                   equivalence=False),
        RunnerInfo("torch_dataloader", "torch", "runners.torch.pipeline",
                   "PyTorch DataLoader over the JPEG file list: Pillow decode in workers "
                   "processes, pinned memory on GPUs", equivalence=False),
        RunnerInfo("grain", "jax", "runners.jax.pipeline",
                   "Grain (the JAX ecosystem's loader) over the JPEG file list: Pillow decode "
                   "in workers processes", equivalence=False),
        RunnerInfo("keras_pydataset", "jax", "runners.keras.pipeline",
                   "Keras 3 PyDataset over the JPEG file list (the Keras-idiomatic path): "
                   "Pillow decode in workers processes", equivalence=False),
    ]
}

def runner_options(runner: str) -> dict[str, Option]:
    """All options a runner accepts, its own plus the common ones."""
    return {**COMMON_OPTIONS, **RUNNERS[runner].options}


def resolved_options(runner: str, given: dict[str, Any]) -> dict[str, Any]:
    """A run's options as the child reads them: every option of the runner (or pipeline) at
    its default, under what the config gave. A name the registry does not know passes as
    given (the tests' toy runners)."""
    info = RUNNERS.get(runner) or PIPELINES.get(runner)
    if info is None:
        return dict(given)
    return {**{k: o.default for k, o in info.options.items()}, **given}
