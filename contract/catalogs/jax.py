"""The JAX family's runners (jit + sharding, Keras 3 on JAX) and its Grain pipeline, as the
parent knows them: names, modules, options. Framework-free (bench.catalog.registry imports it). A
new runner of this family is one RunnerInfo below (docs/DESIGN.md, "Add a runner"); `_runner`
gives one with what the family's runners share."""

from __future__ import annotations

from typing import Any

from contract import cross_entropy
from contract.catalog import LOADER_OPTION, SHARDED_NO_CONVERGE, Option, RunnerInfo
from contract.communication import DATA_PARALLEL, FSDP_PAPER, ZERO3, ZERO_PAPER, StepCollectives

JAX_BATCHNORM_OPTION = Option(str, "per_device", ("per_device", "global"),
                              "per_device: each device's BatchNorm normalises its own B/N rows "
                              "(shard_map), as MirroredStrategy and DDP do; global: statistics "
                              "over the whole global batch (jit over the sharded batch: XLA "
                              "all-reduces them, sync BatchNorm)")

KERAS_INPUT_OPTION = Option(str, "numpy", ("numpy", "preplaced"),
                            "numpy: fit gets host numpy data (arrays with batch_size, or the "
                            "loader's numpy batches) and the distribution lays out each batch "
                            "itself; preplaced: batches already laid out on the devices in "
                            "the distribution's layout (synthetic or loader=framework)")

ATTENTION_OPTION = Option(str, "auto", ("auto", "xla", "cudnn"),
                          "transformers: jax.nn.dot_product_attention's implementation: auto "
                          "(None: JAX chooses; XLA's own ops in jax 0.10.2), xla, or cudnn "
                          "(cuDNN's fused flash attention: GPUs, bf16 only); a CNN has no "
                          "attention (recorded none)")
ATTENTION_IMPLEMENTATION = {"auto": None, "xla": "xla", "cudnn": "cudnn"}

CUDNN_EQUIVALENCE = ("cuDNN's fused flash attention is a GPU kernel (bf16); the equivalence "
                     "step trains the probe CNN, which has no attention: the case needs a GPU "
                     "and a transformer probe (not built)")

JAX_MULTI_NODE = "jax.distributed.initialize (SLURM auto-detection), gloo collectives on CPU"


def _runner(name: str, module: str, description: str, **fields: Any) -> RunnerInfo:
    """A RunnerInfo of the jax family: every one takes fp32, tf32 and bf16, CNNs and
    transformers, has its collectives measured by the jax_allreduce probe and (unless `fields`
    says otherwise) spans nodes through jax.distributed; `fields` adds the rest."""
    return RunnerInfo(name, "jax", module, description,
                      **{"precisions": ("fp32", "tf32", "bf16"), "multi_node": JAX_MULTI_NODE,
                         "workloads": ("cnn", "transformer"), "probe": "jax_allreduce",
                         **fields})


def attention_applies(spec: Any) -> bool:
    """Whether the run's model is a built-in transformer, whose attention the `attention`
    option sets (a CNN has none; a user's model calls its own attention)."""
    from models import get_spec

    return not spec.custom_model and get_spec(spec.model).workload == "transformer"


def attention_problem(spec: Any, platform: str) -> str | None:
    """Why jax_native's `attention` cannot run as asked on `platform` ("gpu", "cpu"): cudnn is
    cuDNN's GPU kernel, of bfloat16 or float16 q, k, v only (jax's check_is_flash_attention and
    its dtype check); None where it can or the option does not apply. Asked by the plan before
    the launch (the spec's device) and by the child (the platform jax reports)."""
    if spec.options.get("attention") != "cudnn" or not attention_applies(spec):
        return None
    if platform != "gpu":
        return (f"attention cudnn: cuDNN's fused flash attention (jax.nn.dot_product_attention "
                f"implementation='cudnn') is a GPU kernel; the run's devices are {platform} "
                f"devices, with no cuDNN (auto or xla run XLA's attention there)")
    if spec.precision != "bf16":
        return (f"attention cudnn: cuDNN's fused attention takes bfloat16 or float16 q, k and v "
                f"(jax: 'Q must be fp16/bf16/fp8'); precision {spec.precision} computes "
                f"attention in float32: use precision bf16, or attention auto or xla")
    return None


RUNNERS: list[RunnerInfo] = [
    _runner(
        "jax_native",
        "runners.jax.native",
        "JAX jit with a data-parallel NamedSharding over N devices; Flax model, optax SGD",
        options={"batchnorm": JAX_BATCHNORM_OPTION, "attention": ATTENTION_OPTION,
                 "cross_entropy": cross_entropy.OPTION},
        # cross_entropy: the probe's logits are 2-D, where the option does not act
        equivalence_options=({"batchnorm": "global"}, *cross_entropy.EQUIVALENCE),
        equivalence_gpu_only=(({"attention": "cudnn"}, CUDNN_EQUIVALENCE),),
        custom_models=("jax",),
        collectives=DATA_PARALLEL,
        converges=True,
        launch_check=lambda spec: attention_problem(spec, spec.device),
    ),
    _runner(
        "jax_fsdp",
        "runners.jax.fsdp",
        "JAX FSDP as MaxText's fsdp axis: params, momentum and batch sharded over one mesh "
        "axis (NamedSharding), XLA gathers each layer's weights in the jitted step",
        custom_models=("jax",),
        shards=("params", "grads", "optimizer"),
        # as MaxText's fsdp axis: the weights gathered per layer inside the step
        collectives=StepCollectives(
            ZERO3, f"as ZeRO-3, {ZERO_PAPER}.2.2",
            "XLA gathers the weights again in the backward pass (as under remat); if it keeps "
            "the forward's gathered weights, one all-gather less"),
        no_converge=SHARDED_NO_CONVERGE,
    ),
    _runner(
        "keras_jax",
        "runners.jax.keras_jax",
        "Keras 3 on JAX with keras.distribution.DataParallel, trained with fit",
        options={
            "loader": LOADER_OPTION,
            "batchnorm": JAX_BATCHNORM_OPTION,
            "input": KERAS_INPUT_OPTION,
            "steps_per_execution": Option(
                int, 1, help="model.compile(steps_per_execution=): train steps per call of "
                "Keras' train function (on jax a Python loop of jitted steps; callbacks and "
                "the clock's reading once per call, each step timed as the call's mean)",
                minimum=1, maximum=10000),
        },
        equivalence_options=({"batchnorm": "global"}, {"input": "preplaced"}),
        custom_models=("keras",),
        collectives=DATA_PARALLEL,
        converges=True,
    ),
    _runner(
        "keras_model_parallel",
        "runners.jax.keras_model_parallel",
        "Keras 3 on JAX with keras.distribution.ModelParallel: a (1, N) batch x model mesh, a "
        "LayoutMap sharding the kernels and embeddings over N devices, trained with fit",
        options={
            "loader": LOADER_OPTION,
            "input": KERAS_INPUT_OPTION,
        },
        equivalence_options=({"input": "preplaced"},),
        multi_node="keras.distribution.initialize -> jax.distributed.initialize",
        multi_node_unavailable=(
            "the (1, N) mesh gives every device, so every process, the whole global batch; "
            "keras_jax's multi-node feeding gives each process its own rows, and no "
            "per-process feeding of a replicated batch is built"),
        shards=("params", "grads", "optimizer"),
        collectives=StepCollectives(
            ZERO3, f"as FSDP, {FSDP_PAPER}",
            "treated as weight-sharded over all devices like FSDP (the LayoutMap shards each "
            "weight over the mesh axis the batch is split on; XLA's SPMD partitioner gathers "
            "it in forward and backward and reduce-scatters its gradient)"),
        no_converge='tensor parallelism on one batch, not wired to the converge recipe',
    ),
]

PIPELINES: list[RunnerInfo] = [
    RunnerInfo("grain", "jax", "runners.jax.pipeline",
               "Grain (the JAX ecosystem's loader) over the JPEG file list: Pillow decode "
               "in workers processes", equivalence=False),
    RunnerInfo("keras_pydataset", "jax", "runners.jax.keras_pipeline",
               "Keras 3 PyDataset over the JPEG file list (the Keras-idiomatic path): "
               "Pillow decode in workers processes", equivalence=False),
]

# The communication probe (mode: allreduce): the family's own collectives alone, no model, over
# buffers from 1 MiB to the model's gradient size (contract/collectives.py).
PROBES: list[RunnerInfo] = [
    RunnerInfo("jax_allreduce", "jax", "runners.jax.allreduce_probe",
               "jax.lax.psum / all_gather / psum_scatter under a jitted jax.shard_map over N "
               "devices in one process (XLA's collectives: NCCL on GPUs)",
               equivalence=False),
]
