"""The TensorFlow family's runners (tf.distribute, TF 1.x graph styles, the Keras 2 tower
strategies, tensorpack, tf_cnn_benchmarks) and its tf.data pipeline, as the parent knows them:
names, modules, options. Framework-free (bench.catalog.registry imports it). A new runner of this
family
is one RunnerInfo below (docs/DESIGN.md, "Add a runner")."""

from __future__ import annotations

from typing import Any

from contract.catalog import DATA_FORMAT_OPTION, LOADER_OPTION, Option, RunnerInfo
from contract.communication import DATA_PARALLEL

KERAS2_INPUT_OPTION = Option(str, "feed_dict", ("feed_dict", "staging", "tf_data"),
                             "Keras 2 tower runners: numpy batches fed by session.run's "
                             "feed_dict every step (as fit on arrays did), the same through a "
                             "StagingArea per tower one step ahead, or a tf.data dataset "
                             "given to fit")
KERAS2_WRAP_OPTION = Option(bool, False, help="at 1 device, build the one-tower wrapper "
                                              "(measures its cost) instead of the plain model "
                                              "the original falls back to")


TEMPLATE_DEVICES = ("default", "cpu", "gpu")
ON_CPU_SAME_DEVICE = ("on virtual CPU devices /cpu:0 is also the first tower device: the "
                      "option names the same device as the default")


def keras2_tower_options(**own: Option) -> dict[str, Option]:
    """What every Keras 2 tower runner accepts (the real-data loader, the input path), then
    its own options."""
    return {"loader": LOADER_OPTION, "input": KERAS2_INPUT_OPTION, **own}


RUNNERS: list[RunnerInfo] = [
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
            "steps_per_execution": Option(int, 1, help="train steps per tf.function call",
                                          minimum=1, maximum=10000),
            "data_format": DATA_FORMAT_OPTION,
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
        multi_node="MultiWorkerMirroredStrategy, its cluster from TF's SlurmClusterResolver",
        workloads=("cnn", "transformer"),
        custom_models=("keras", "tf"),
        collectives=DATA_PARALLEL,
        probe="tf_allreduce",
        converges=True,
    ),
    RunnerInfo(
        "tf_native",
        "tf",
        "runners.tf.native",
        "custom training loop in tf.function under MirroredStrategy (the no-Keras baseline)",
        options={
            "xla": Option(bool, False, help="jit_compile the train step"),
            "data_format": DATA_FORMAT_OPTION,
            "fused_batchnorm": Option(bool, True, help="BatchNorm by TF's fused kernel "
                                      "(FusedBatchNormV3), not Keras 3's unfused ops"),
        },
        precisions=("fp32", "tf32", "bf16", "fp16"),
        # No reduction option (MirroredStrategy's default all-reduce). Not here: xla (on 2
        # virtual CPU devices XLA runs every replica on CPU:0, so the step is invalid:
        # tests/test_tf_runners.py checks that, and xla = no xla at 1 device) and
        # channels_first (TF's CPU Conv2DBackpropFilter has no NCHW kernel).
        multi_node="MultiWorkerMirroredStrategy, its cluster from TF's SlurmClusterResolver",
        converges=True,
    ),
    RunnerInfo(
        "keras_tf_kuza55",
        "tf",
        "runners.tf.keras_kuza55",
        "kuza55's make_parallel (2016) on Keras 2 (tf_keras, TF1 graph, fit): whole batch "
        "to every tower, sliced there, outputs merged on /cpu:0",
        options=keras2_tower_options(
            ps=Option(str, "default", TEMPLATE_DEVICES,
                      "where the template's variables live: default = no device scope, as "
                      "kuza55's users built the model they passed in (TF's default "
                      "placement: the first GPU); cpu = /cpu:0; gpu = the first tower "
                      "device")),
        # staging and tf_data input: the shared keras2_towers code, run through
        # multi_gpu_model's cases (the suite's time budget)
        equivalence_gpu_only=(({"ps": "cpu"}, ON_CPU_SAME_DEVICE),
                              ({"ps": "gpu"}, ON_CPU_SAME_DEVICE)),
        era="a 2017 system: its builders are the 2017 CNNs; transformers are not of its era",
        converges=True,
    ),
    RunnerInfo(
        "keras_tf_multi_gpu_model",
        "tf",
        "runners.tf.keras_multi_gpu_model",
        "Keras 2.1.6-2.2.5 multi_gpu_model on Keras 2 (tf_keras, TF1 graph, fit): CPU "
        "template, replicas per device, CPU merge; plain model at 1 device",
        options=keras2_tower_options(
            keras_version=Option(str, "2.2", ("2.1", "2.2"),
                                 "2.1: slice inside each replica's device scope (whole batch "
                                 "to every device); 2.2: slice on the input's device (keras "
                                 "PR #10230)"),
            cpu_merge=Option(bool, True, help="merge replica outputs on the CPU"),
            cpu_relocation=Option(bool, False, help="clone the template under /cpu:0 and "
                                                    "train the clone (Keras 2.1.6+)"),
            template_device=Option(str, "docs", ("docs", *TEMPLATE_DEVICES),
                                   "where the template is built: docs = as the docstring's "
                                   "example for these arguments (Example 1, the defaults: "
                                   "/cpu:0; Examples 2 and 3, cpu_relocation or cpu_merge "
                                   "false: no device scope); default, cpu or gpu as kuza55's "
                                   "ps"),
            wrap_single_device=KERAS2_WRAP_OPTION),
        # staging input: run for real in tests/test_keras_towers.py (staging semantics)
        equivalence_options=({"keras_version": "2.1"}, {"input": "tf_data"},
                             {"wrap_single_device": True}),
        equivalence_gpu_only=(({"cpu_merge": False}, ON_CPU_SAME_DEVICE),
                              ({"cpu_relocation": True},
                               "it clones the template under /cpu:0, which here is where the "
                               "template already is and the first replica's device")),
        era="a 2017 system: its builders are the 2017 CNNs; transformers are not of its era",
        converges=True,
    ),
    RunnerInfo(
        "keras_tf_avolkov1",
        "tf",
        "runners.tf.keras_avolkov1",
        "avolkov1's make_parallel (2017) on Keras 2 (tf_keras, TF1 graph, fit): slicing "
        "and merge on the parameter device, StagingArea input, its multi-GPU optimizer; "
        "plain model at 1 device",
        options=keras2_tower_options(
            ps=Option(str, "cpu", ("cpu", "gpu"), "its ps_device: where slicing and the "
                                                  "merge run (make_parallel's default "
                                                  "/cpu:0)"),
            template_device=Option(str, "default", TEMPLATE_DEVICES,
                                   "where the serial model is built: default = no device "
                                   "scope, as its cifar10_cnn_mgpu.py example; cpu or gpu as "
                                   "kuza55's ps"),
            average_gradients=Option(bool, False, help="its SGD_MGPU: gradients of the merged "
                                                       "loss once per device (N backward "
                                                       "passes), averaged"),
            nccl=Option(bool, False, help="average those copies by NCCL all-reduce (GPUs; "
                                          "needs average_gradients)"),
            wrap_single_device=KERAS2_WRAP_OPTION),
        equivalence_options=({"average_gradients": True}, {"wrap_single_device": True}),
        equivalence_gpu_only=(({"ps": "gpu"}, ON_CPU_SAME_DEVICE),
                              ({"template_device": "cpu"}, ON_CPU_SAME_DEVICE),
                              ({"average_gradients": True, "input": "staging"},
                               "a StagingArea on the CPU holds the batch the CPU already "
                               "has: no copy to overlap (the staging order is tested in "
                               "tests/test_keras_towers.py)"),
                              ({"average_gradients": True, "nccl": True},
                               "NCCL all-reduce has no CPU kernel (the graph's all-reduce "
                               "ops are tested in tests/test_keras_towers.py)")),
        era="a 2017 system: its builders are the 2017 CNNs; transformers are not of its era",
        no_converge=("not wired to the converge recipe (its towers are kuza55's; the seeds' "
                     "tower runners that converge are keras_tf_kuza55 and "
                     "keras_tf_multi_gpu_model)"),
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
        equivalence_options=({"trainer": "parameter_server"}, {"input": "queue"}),
        equivalence_gpu_only=(({"trainer": "parameter_server", "ps_device": "gpu"},
                               ON_CPU_SAME_DEVICE),),
        multi_node="tensorpack's HorovodTrainer / DistributedTrainerReplicated",
        multi_node_unavailable="its multi-node launch is not built yet (issue 16's notes)",
        era="a 2017 system: its builders are the 2017 CNNs; transformers are not of its era",
        no_converge=("tensorpack's trainer runs a fixed number of steps on its own input "
                     "graph; not wired to the converge recipe"),
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
        multi_node="tf_cnn_benchmarks' own cluster flags (--job_name, --worker_hosts, "
                   "--ps_hosts; variable_update distributed_replicated)",
        multi_node_unavailable="its multi-node launch is not built yet: one worker per node "
                               "with the cluster flags from SLURM (issue 16's notes)",
        era="a 2017 system: its builders are the 2017 CNNs; transformers are not of its era",
        no_converge=("tf_cnn_benchmarks trains a fixed number of batches and evaluates only in "
                     "a separate --eval run, never per epoch to a target"),
        launch_check=lambda spec: _cnn_benchmarks_problem(spec),
    ),
]


def _cnn_benchmarks_problem(spec: Any) -> str | None:
    """The child's own checks of its checkout and model, asked before the launch: the same
    words the run would record (contract/tf_cnn_checkout.py)."""
    from contract.spec import Unavailable
    from contract.tf_cnn_checkout import check_model_in_checkout, find_script, script_model

    try:
        script = find_script(spec.options)  # in the child's order: its checkout first
        if spec.mode == "benchmark":
            check_model_in_checkout(script, spec.options.get("script_model")
                                    or script_model(spec.model))
    except Unavailable as exc:
        return str(exc)
    return None

PIPELINES: list[RunnerInfo] = [
    RunnerInfo("tf_data", "tf", "runners.tf.pipeline",
               "tf.data over the TFRecord shards: interleaved reads, parallel "
               "decode_jpeg and crop/flip (workers threads), batch, prefetch",
               equivalence=False),
]

# The communication probe (mode: allreduce): the family's own all-reduce alone, no model, over
# buffers from 1 MiB to the model's gradient size (contract/collectives.py).
PROBES: list[RunnerInfo] = [
    RunnerInfo("tf_allreduce", "tf", "runners.tf.allreduce_probe",
               "tf.distribute's collective all-reduce (MirroredStrategy, CollectiveAllReduce: "
               "ring on CPU, NCCL on GPUs) over N logical devices in one process, as Keras "
               "sums gradients",
               equivalence=False),
]
