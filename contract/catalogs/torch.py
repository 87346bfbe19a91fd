"""The PyTorch family's runners (DDP, Keras 3 on torch, Horovod on torch's ranks) and its
DataLoader pipeline, as the parent knows them: names, modules, options. Framework-free
(bench.catalog.registry imports it). A new runner of this family is one RunnerInfo below
(docs/DESIGN.md, "Add a runner")."""

from __future__ import annotations

from contract import catalog, cross_entropy
from contract import communication as comm
from contract.catalog import DATA_FORMAT_OPTION, LOADER_OPTION, Option, RunnerInfo

DATA_LOADER_OPTION = Option(str, "auto", ("auto", "dataloader", "dali"),
                            "real data: NVIDIA DALI on GPUs when it is installed (auto), or "
                            "always the torch DataLoader, or always DALI")

# The process group backend of the sharded runners (torch_ddp's own option, as it reads)
SHARDED_BACKEND_OPTION = Option(str, "auto", ("auto", "gloo", "nccl"),
                                "process group backend (auto: nccl on GPUs, gloo on CPU)")
# torch.compile's modes (torch._inductor.list_mode_options)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
TORCHRUN_MULTI_NODE = "torchrun, a c10d rendezvous hosted on the first node"

RUNNERS: list[RunnerInfo] = [
    RunnerInfo(
        "torch_ddp",
        "torch",
        "runners.torch.ddp",
        "native PyTorch DistributedDataParallel, one process per device (torchrun)",
        options={
            "data_loader": DATA_LOADER_OPTION,
            # GPU defaults: what NVIDIA's DeepLearningExamples and Lambda's PyTorch benchmark
            # scripts use (channels_last, torch.compile, cudnn.benchmark, a fused optimizer,
            # DDP's gradient_as_bucket_view, data resident on the device); on CPUs what is
            # fastest there
            "memory_format": Option(str, "channels_first",
                                    ("channels_first", "channels_last"),
                                    "torch.channels_last memory format for model and data",
                                    gpu_default="channels_last"),
            "compile": Option(bool, False, help="torch.compile the model", gpu_default=True),
            # GPU default "default" as torch.compile's own: the other modes are not yet
            # measured on a GPU here (docs/runners/torch_ddp.md, "Compile")
            "compile_mode": Option(str, "default", COMPILE_MODES,
                                   "torch.compile's mode (needs compile: true): reduce-overhead "
                                   "and max-autotune capture CUDA graphs on GPUs (Inductor "
                                   "skips them on CPUs, recorded); default kept on GPUs "
                                   "until measured there", needs=("compile", True)),
            "backend": Option(str, "auto", ("auto", "gloo", "nccl"),
                              "process group backend (auto: nccl on GPUs, gloo on CPU)"),
            "cudnn_benchmark": Option(bool, True,
                                      help="torch.backends.cudnn.benchmark: autotune the "
                                           "convolutions in the warm-up (GPUs; no-op on CPUs)"),
            "optimizer_impl": Option(str, "foreach", ("foreach", "fused", "for-loop"),
                                     "SGD's implementation: foreach (multi-tensor), fused "
                                     "(one kernel; fused=True), or for-loop (per parameter)",
                                     gpu_default="fused"),
            "gradient_as_bucket_view": Option(bool, True,
                                              help="DDP's gradient_as_bucket_view: gradients "
                                                   "are views into the all-reduce buckets (no "
                                                   "copy)"),
            "cross_entropy": cross_entropy.OPTION,
        },
        precisions=("fp32", "tf32", "bf16", "fp16"),  # autocast; fp16 with a GradScaler
        # backend gloo: what auto picks on CPU, so the default case runs it; the defaults'
        # case is the CPU's (channels_first, eager, foreach, bucket views)
        # compile_mode reduce-overhead: its CUDA graphs are GPU-only (Inductor skips them on
        # CPU); here it checks the step compiled in that mode; cross_entropy: the probe's
        # logits are 2-D, where the option does not act (contract/cross_entropy.py)
        equivalence_options=({"compile": True},
                             {"compile": True, "compile_mode": "reduce-overhead"},
                             {"memory_format": "channels_last"},
                             {"gradient_as_bucket_view": False},
                             *cross_entropy.EQUIVALENCE),
        launcher="torchrun",
        multi_node=TORCHRUN_MULTI_NODE,
        workloads=("cnn", "transformer"),
        custom_models=("torch",),
        collectives=comm.DATA_PARALLEL,
        probe="torch_allreduce",
        converges=True,
    ),
    RunnerInfo(
        "torch_zero1",
        "torch",
        "runners.torch.zero1",
        "ZeRO-1: DDP with torch.distributed.optim.ZeroRedundancyOptimizer (optimizer state "
        "partitioned over the ranks), one process per device (torchrun)",
        options={"backend": SHARDED_BACKEND_OPTION},
        precisions=("fp32", "tf32", "bf16", "fp16"),  # autocast, as torch_ddp; fp16 on GPUs
        # the default case is the only one: backend auto is gloo on CPU (overlap_with_ddp is
        # not offered: its first two iterations apply no update, runners/torch/zero1.py)
        launcher="torchrun",
        multi_node=TORCHRUN_MULTI_NODE,
        workloads=("cnn", "transformer"),
        custom_models=("torch",),
        shards=("optimizer",),
        collectives=comm.StepCollectives(
            (comm.GRAD_AR, comm.PARAM_AG_STEP),
            "DDP's all-reduce, then ZeroRedundancyOptimizer broadcasts each rank's updated "
            "parameters", "the owners' broadcasts counted as one all-gather of the parameters "
            "(N broadcasts of 1/N each; measured as the all-gather's busbw)"),
        probe="torch_allreduce",
        no_converge=catalog.SHARDED_NO_CONVERGE,
    ),
    RunnerInfo(
        "torch_fsdp2",
        "torch",
        "runners.torch.fsdp2",
        "FSDP2: torch.distributed.fsdp.fully_shard per block and on the root (as torchtitan), "
        "one process per device (torchrun)",
        options={
            "backend": SHARDED_BACKEND_OPTION,
            "reshard_after_forward": Option(bool, True,
                                            help="reshard each unit's parameters after its "
                                                 "forward (ZeRO-3-like; false keeps them "
                                                 "gathered until backward: ZeRO-2-like)"),
        },
        # MixedPrecisionPolicy(param_dtype=bf16|fp16, reduce_dtype=fp32); fp16 with
        # ShardedGradScaler, on CPUs too
        precisions=("fp32", "tf32", "bf16", "fp16"),
        equivalence_options=({"reshard_after_forward": False},),
        launcher="torchrun",
        multi_node=TORCHRUN_MULTI_NODE,
        workloads=("cnn", "transformer"),
        custom_models=("torch",),
        # parameters and optimizer state sharded at rest, gradients after the reduce-scatter,
        # whatever reshard_after_forward (which decides only between forward and backward)
        shards=("params", "grads", "optimizer"),
        collectives={"option": "reshard_after_forward",
                     "values": {True: comm.FSDP_FULL_SHARD, False: comm.FSDP_SHARD_GRAD_OP}},
        probe="torch_allreduce",
        no_converge=catalog.SHARDED_NO_CONVERGE,
    ),
    RunnerInfo(
        "keras_torch",
        "torch",
        "runners.torch.keras_torch",
        "Keras 3 on PyTorch, multi-device through DDP as Keras' PyTorch guide does",
        options={
            "data_loader": DATA_LOADER_OPTION,
            "loader": LOADER_OPTION,
            "data_format": DATA_FORMAT_OPTION,
        },
        precisions=("fp32", "tf32", "bf16"),
        equivalence_options=({"data_format": "channels_first"},),
        launcher="torchrun",
        multi_node=TORCHRUN_MULTI_NODE,
        workloads=("cnn", "transformer"),
        custom_models=("keras",),
        converges=True,
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
        # across nodes: horovodrun 0.28.1's gloo launch, srun's task on each node in place of
        # its ssh (runners/torch/horovod_launch.py; no MPI in this Horovod build)
        multi_node="horovodrun's gloo rendezvous (RendezvousServer + slot environment), "
                   "ranks started by srun instead of ssh",
        custom_models=("torch",),
        era="a 2017 system: its builders are the 2017 CNNs; transformers are not of its era",
        collectives=comm.DATA_PARALLEL,
        probe="horovod_allreduce",
        no_converge=("not wired to the converge recipe (its allreduce-averaged SGD is "
                     "torch_ddp's math)"),
    ),
    RunnerInfo(
        "deepspeed",
        "torch",
        "runners.torch.deepspeed_zero",
        "DeepSpeed ZeRO stage 1/2/3, one process per device (torchrun; CPU accelerator over "
        "gloo on CPUs)",
        options={
            # default 2: PyTorch Lightning's DeepSpeedStrategy default; it shards optimizer state
            # and gradients at DDP's communication volume (a reduce-scatter and an all-gather
            # move what one all-reduce moves), where 3 adds parameter all-gathers
            "stage": Option(int, 2, (1, 2, 3),
                            "ZeRO stage: 1 partitions the optimizer state, 2 also the "
                            "gradients, 3 also the parameters"),
            "reduce_bucket_size": Option(int, 500_000_000, None,
                                         "zero_optimization.reduce_bucket_size (elements; "
                                         "DeepSpeed's default 5e8): the gradients one bucket "
                                         "reduces at once, stage 2's most held whole",
                                         minimum=1, maximum=10**12),
        },
        # bf16/fp16: DeepSpeed's config sections (bf16 params, fp32 master partitions; fp16
        # with dynamic loss scaling, GPUs only)
        precisions=("fp32", "bf16", "fp16"),
        equivalence_options=({"stage": 1}, {"stage": 3}, {"reduce_bucket_size": 1000}),
        launcher="torchrun",
        multi_node=TORCHRUN_MULTI_NODE,
        workloads=("cnn", "transformer"),
        custom_models=("torch",),
        # Read back from DeepSpeed 0.19's ZeRO optimizer as its end-of-backward reduction
        # begins: stage 1 holds every full gradient there (it reduces them only then), stage
        # 2 its partition and at most one bucket (it reduces bucket by bucket during
        # backward: the record's state_granularity_bytes); stage 3 also the parameters.
        shards={"option": "stage", "values": {1: ("optimizer",),
                                              2: ("optimizer", "grads"),
                                              3: ("params", "grads", "optimizer")}},
        collectives={"option": "stage",
                     "values": {1: comm.ZERO_1_2, 2: comm.ZERO_1_2, 3: comm.ZERO_3}},
        probe="torch_allreduce",
        no_converge=catalog.SHARDED_NO_CONVERGE,
    ),
]

PIPELINES: list[RunnerInfo] = [
    RunnerInfo("torch_dataloader", "torch", "runners.torch.pipeline",
               "PyTorch DataLoader over the JPEG file list: Pillow decode in workers "
               "processes, pinned memory on GPUs", equivalence=False),
]

# The communication probe (mode: allreduce): the family's own all-reduce alone, no model, over
# buffers from 1 MiB to the model's gradient size (contract/collectives.py).
PROBES: list[RunnerInfo] = [
    RunnerInfo("torch_allreduce", "torch", "runners.torch.allreduce_probe",
               "torch.distributed.all_reduce, one process per device (torchrun): NCCL on "
               "GPUs, gloo on CPU", equivalence=False, launcher="torchrun"),
    RunnerInfo("horovod_allreduce", "horovod", "runners.torch.horovod_allreduce_probe",
               "hvd.allreduce (sum) of torch tensors, one process per device (horovodrun, "
               "gloo)", equivalence=False, launcher="horovodrun"),
]
