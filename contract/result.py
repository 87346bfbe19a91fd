"""What a runner's child reports: its result fields, declared once, and joined so that no field
is given twice.

FIELDS declares every field a child may put into its result (the runner's own, what
runners/converge.py and contract/collectives.py assemble, and what runners.common.main adds:
status, reason, math, precision_policy, threads, the memory fields): its JSON types and what it
means. runners.common.main checks a result with `mismatch` before writing it, so a misspelt
field or one of another type fails the run at once, naming the field. bench/records/columns.py
reads the meaning of the per-run fields the record copies from here.

A runner assembles its result from parts (the timed window's summary, its model fields, its
state and precision records, its own evidence); `join` merges them and fails at once, naming
the field, when two parts give the same field, where a dict literal's `{**a, **b}` would let
the later part win silently."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# JSON's types as JSON Schema names them; a number may be an integer
JSON_TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")


class FieldClash(RuntimeError):
    """Two parts of a result give the same field: the runner's bug, said at once."""


def join(*parts: Mapping[str, Any]) -> dict[str, Any]:
    """The union of `parts`; FieldClash naming every field that two of them give."""
    out: dict[str, Any] = {}
    clash: set[str] = set()
    for part in parts:
        clash.update(k for k in part if k in out)
        out.update(part)
    if clash:
        raise FieldClash(f"result fields given twice: {sorted(clash)}")
    return out


@dataclass(frozen=True)
class Field:
    """One result field: its name, the JSON types its value may have, and what it means."""

    name: str
    types: tuple[str, ...]
    meaning: str


def json_type(value: Any) -> str:
    """The JSON type of a decoded JSON value (JSON_TYPES)."""
    if value is None:
        return "null"
    for kind, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"),
                       (list, "array"), (dict, "object")):
        if isinstance(value, kind):
            return name
    raise TypeError(f"not a decoded JSON value: {type(value).__name__}")


def mismatch(written: Mapping[str, Any]) -> str | None:
    """The first field of a result, as written to JSON and read back, that FIELDS does not
    declare or (outside EVIDENCE, whose shapes differ by runner and path: the golden records
    check their types per runner) declares with other types, as one line; None when every
    field is declared."""
    for name, value in written.items():
        field = FIELDS.get(name)
        if field is None:
            return f"result field {name!r} is not declared in contract/result.py"
        kind = json_type(value)
        if name in EVIDENCE_NAMES:  # their shapes differ by runner: the goldens check them
            continue
        if kind not in field.types and not (kind == "integer" and "number" in field.types):
            return (f"result field {name!r} is {kind}, not {' or '.join(field.types)} as "
                    f"declared in contract/result.py")
    return None


def as_written(result: Mapping[str, Any], default: Any = str) -> dict[str, Any]:
    """A result as its JSON file will hold it (`default` turns what JSON lacks into JSON, as
    the writer does), read back."""
    return json.loads(json.dumps(result, default=default))


NUL, BOOL, INT, NUM, STR, ARR, OBJ = JSON_TYPES


def _fields(types: tuple[str, ...], **meanings: str) -> tuple[Field, ...]:
    return tuple(Field(name, types, meaning) for name, meaning in meanings.items())


# -- the outcome and the timed window (runners.common: main, StepTimer, TimedWindow) ----------
OUTCOME = (
    Field("status", (STR,), "ok, or why not: failed, oom, unavailable, invalid."),
    Field("reason", (STR, NUL), "Why a run was not ok, in one line."),
    Field("images_per_sec", (NUM, NUL), "Images (samples) per second over the timed window."),
    Field("step_times_s", (ARR,), "Each timed step's wall time (s)."),
    Field("timed_steps", (INT,), "Steps in the timed window."),
    Field("samples", (INT,), "Images in the timed window: measure_steps x the global batch."),
    Field("first_loss", (NUM, NUL), "The first timed step's loss."),
    Field("last_loss", (NUM, NUL), "The last timed step's loss."),
    Field("window_start", (NUM,), "The timed window's start (unix s)."),
    Field("window_end", (NUM,), "The timed window's end (unix s)."),
    Field("window_s", (NUM,), "The timed window's length (s)."),
    Field("math", (OBJ, NUL), "The float32 math each imported framework reports after the run "
          "(runners/math_mode.py)."),
    Field("threads", (OBJ,), "The run's thread settings and each framework's own answer "
          "(runners/threads.py)."),
    Field("precision_policy", (OBJ, NUL), "The precision policy the run followed, read back from "
          "the framework: compute, params (storage), master and reduce dtypes, loss scaling, "
          "the knobs used (how), and whether it is the harness's policy for its precision "
          "(follows; differs names each part that is not; contract/precision_policy.py)."),
)
# -- memory and model state (runners/memory.py, the families' state.py) ----------------------
MEMORY = (
    Field("memory_per_device", (OBJ, NUL), "Bytes each device held in the timed window, keyed "
          "rank<r>:<device> (a process per device) or process<r>:<device>; on CPU the rank's "
          "process's peak resident memory, once for the N virtual devices that share one "
          "process (runners/memory.py; ranks merged by bench/run/verdict.py); null where "
          "nothing was measured."),
    Field("memory_source", (STR, NUL), "What memory_per_device is, as the child read it."),
    Field("device_peak_bytes", (OBJ, NUL), "The peak each device held in the timed window as "
          "capacity mode checks it (runners/memory.py): on a GPU the allocator's peak "
          "(memory_per_device); on CPU the process's peak resident memory less its "
          "memory_baseline, a process's N virtual devices each its share; keys as "
          "memory_per_device's; null where nothing was measured."),
    Field("memory_baseline", (OBJ, NUL), "On CPU: the process's resident memory (VmRSS) just "
          "before the runner built its model, once its framework's runtime was loaded and its "
          "devices initialised (memory_source names the point), under memory_per_device's keys; "
          "null on GPUs."),
    Field("model_state", (OBJ, NUL), "The model state one device holds, in bytes: params_bytes, "
          "grads_bytes, optimizer_bytes, total_bytes and its source (runners/memory.py "
          "model_state_*); null where the runner does not report it."),
    Field("state_bytes_per_device", (OBJ, NUL), "The model state each device holds, read from "
          "the framework's own shards (DTensor local shards, the ZeroRedundancyOptimizer's "
          "partition, DeepSpeed's partitioned groups, jax arrays' addressable_shards): "
          "{device: {params, grads, optimizer: bytes}}; null where the runner does not read "
          "it."),
    Field("state_bytes_global", (OBJ, NUL), "Each part's logical (unsharded) size as the "
          "framework states it: {params, grads, optimizer: bytes}."),
    Field("state_source", (STR, NUL), "What state_bytes_per_device read, and when."),
    Field("state_granularity_bytes", (OBJ, NUL), "Where a framework shards by whole tensors (the "
          "ZeroRedundancyOptimizer assigns whole parameters): per part, how far one device's "
          "share may exceed 1/N (its largest unit), as the framework's partition gives it."),
    Field("zero_buckets", (OBJ, NUL), "deepspeed stage 1/2: ZeRO's gradient buckets as read "
          "back: reduce_bucket_size (elements) and capacity_bytes (the bucket buffers "
          "allocated, beside the state)."),
    Field("deepspeed_memory", (OBJ, NUL), "deepspeed: what a rank holds beside its state, read "
          "back from DeepSpeed: per_device {peak_bytes (device_peak_bytes), state_bytes, "
          "buffers (ZeRO's, each allocated/resident/counted_in_state bytes), buffers_bytes, "
          "unexplained_bytes}, bucket_sizes (elements and bytes), optimizer_op (the op that ran, "
          "DeepSpeed C++ ops loaded), source (runners/torch/deepspeed_memory.py)."),
)
# -- time to accuracy (runners/converge.py) --------------------------------------------------
CONVERGE = (
    Field("converge", (OBJ,), "Mode converge: the recipe as run (learning rates resolved) and "
          "the dataset's split sizes."),
    Field("curve", (ARR,), "Mode converge: one point per epoch: epoch, wall_s (since the first "
          "step), train_s, eval_s, train_loss, accuracy (held-out), lr, steps, images_per_sec "
          "and moving_stats_finite."),
    Field("epochs_run", (INT,), "Mode converge: epochs trained."),
    Field("final_accuracy", (NUM, NUL), "Mode converge: the held-out accuracy after the last "
          "epoch."),
    Field("best_accuracy", (NUM, NUL), "Mode converge: the best held-out accuracy of any epoch."),
    Field("epochs_to_target", (INT, NUL), "Mode converge: the first epoch at target_accuracy."),
    Field("time_to_target_s", (NUM, NUL), "Mode converge: wall time from the first step to the "
          "end of the evaluation that reached the target."),
    Field("target_reason", (STR, NUL), "Mode converge: why the target was not reached (null when "
          "it was)."),
    Field("train_time_s", (NUM,), "Mode converge: seconds in training epochs."),
    Field("eval_time_s", (NUM,), "Mode converge: seconds in held-out evaluations."),
    Field("converge_time_s", (NUM,), "Mode converge: seconds from the first step to the last "
          "evaluation."),
    Field("moving_stats_finite", (BOOL, NUL), "Mode converge: whether every BatchNorm moving "
          "statistic was finite after every epoch (read from the model); null where the "
          "runner does not read them."),
)
# -- the model (models.model_fields) ---------------------------------------------------------
MODEL = (
    Field("params", (INT,), "The model's parameter count, as the framework counts it."),
    Field("trainable_params", (INT,), "Its trainable parameters (tensorpack)."),
    Field("flops_per_sample", (INT, NUL), "The model's forward FLOPs per sample."),
    Field("flops_source", (STR,), "Where flops_per_sample came from."),
    Field("tokens_per_sample", (INT, NUL), "Tokens one sample trains on (a token model's "
          "sequence length; null for images)."),
    Field("workload", (STR,), "The model's workload: cnn, transformer or custom."),
)
# -- what the framework says of the run: devices, placement, data, the step -----------------
EVIDENCE = (
    *_fields((INT,), replicas="Devices (replicas) the framework reports the step ran on.",
             timed_steps_per_call="Steps one call ran (Keras steps_per_execution).",
             steps_per_execution="Keras' steps_per_execution of the timed fit.",
             moving_stat_copies="Every device's copies of the BatchNorm moving statistics.",
             convs_per_tower="Convolutions built per tower.",
             conv_backprop_filter_ops="Conv filter-gradient ops that ran in the step.",
             conv_backprop_filter_ops_built="Conv filter-gradient ops the graph holds.",
             attention_custom_calls="cuDNN fused-attention custom calls in the compiled step.",
             steps_skipped_by_grad_scaler="Steps the GradScaler skipped (fp16).",
             zero_stage="The ZeRO stage DeepSpeed ran.",
             image_size="The side of the images the model takes (real data).",
             dataset_images="Images in the real dataset.",
             dataset_classes="Classes in the real dataset.",
             loader_workers="The real-data loader's parallel decode workers.",
             cores="CPU cores the pipeline may use.",
             warmup_steps_run="Warm-up steps run (past a recompile).",
             batch_per_device="Images per device per step (tf_cnn_benchmarks).",
             gradient_copies="The gradient copies the towers' optimizer reduces.",
             num_batches="Steps the script ran (tf_cnn_benchmarks)."),
    *_fields((NUM, NUL), loss="The loss of the equivalence step.",
             cpu_seconds="CPU seconds of the process tree in the window (pipeline).",
             cores_busy="Busy CPU cores in the window (pipeline).",
             images_per_sec_per_core="Images/sec per busy core (pipeline).",
             total_images_per_sec="images/sec as the script printed it."),
    *_fields((STR, NUL), framework_note="A note on the framework versions.",
             placement_source="How placement was read from the framework.",
             placement_collapsed="The framework's note when it put N devices' work on fewer.",
             placement_step="Which step's placement was read.",
             data_placement="Where the step's input lives and how it gets there.",
             input_pipeline="The real-data input pipeline, in words.",
             input_sharding="How the input is split over the replicas.",
             loader="The real-data loader used.",
             loader_option="The loader option the run asked for.",
             input="The input path (numpy, dataset, iterator, ...) fed to the step.",
             layout="The data layout (channels_last, channels_first, tokens).",
             loss_kind="What the reported loss is.",
             train_loss_kind="What the converge curve's train_loss is.",
             batchnorm="BatchNorm statistics per device (per_device) or global.",
             batchnorm_kernel="The BatchNorm kernel the framework ran.",
             batchnorm_statistics="How the BatchNorm statistics are computed.",
             attention="The attention implementation asked (jax_native's option; none where "
                       "the model has no attention it sets).",
             attention_kernel="The attention the compiled step runs, read from its HLO.",
             dtype="The compute dtype of the step.",
             dtype_policy="The Keras dtype policy.",
             evaluation="How held-out accuracy is evaluated.",
             lr_setting="How the learning rate is set per step.",
             moving_stats_source="How the BatchNorm moving statistics are read.",
             strategy="The distribution strategy, as the framework names it.",
             backend="The collective backend.",
             controller="Horovod's controller (MPI or Gloo).",
             cross_device_ops="tf.distribute's cross-device ops.",
             kvstore="MXNet's kvstore type.",
             gradient_reduce="How gradients are reduced.",
             api="The framework API the runner drives.",
             loop="The training loop (the runner's own or the framework's).",
             memory_format="torch's memory format of the input.",
             augmentation="The real data's augmentation.",
             pipeline="The input pipeline measured (mode pipeline).",
             per_core_basis="What images_per_sec_per_core divides by.",
             merge_device="Where the towers' outputs are merged.",
             slice_device="Where the batch is sliced for the towers.",
             variables_device="Where the variables live.",
             ps="The parameter server device.",
             ps_device="tensorpack's parameter server device.",
             work_source="How expected_work was read.",
             xla_setting="The XLA setting asked for.",
             initial_weights_sha256="A hash of the initial weights.",
             images_per_sec_source="Where images_per_sec was read.",
             step_times_source="Where step_times_s were read.",
             window_source="Where the window's ends were read.",
             script_model="The model the script ran.",
             script_dataset="The dataset the script ran.",
             variable_update="The script's variable_update.",
             all_reduce="The script's all_reduce_spec.",
             checkout_commit="The script's checkout commit.",
             trainer="tensorpack's trainer.",
             allreduce_asked="tensorpack's all-reduce mode asked for.",
             gradient_packer="tensorpack's gradient packer, or why none.",
             gradients="How tensorpack reduces gradients.",
             keras_version="The Keras version.",
             template_built_on="Where the template model was built.",
             warmup_extended="Why the warm-up was extended.",
             compiled_by="What compiled the step.",
             baseline="The baseline the towers are measured against.",
             script="The script run.",
             template_device="Where the template model is built (its option).",
             moving_stats_read="What the last read of the BatchNorm moving statistics read.",
             heldout_evaluation="How the processes evaluate the held-out split (multi-node)."),
    *_fields((BOOL, NUL), compile="Whether the step was compiled (torch.compile).",
             xla="Whether XLA compiled the step.",
             loss_scaling="Whether the loss is scaled.",
             hybridize="Whether the Gluon block is hybridized.",
             fp16_allreduce="Whether Horovod compresses gradients to fp16.",
             gradient_as_bucket_view="DDP's gradient_as_bucket_view.",
             reshard_after_forward="FSDP2's reshard_after_forward.",
             cpu_merge="Whether keras' multi_gpu_model merges on the CPU.",
             cpu_relocation="Whether keras' multi_gpu_model relocates to the CPU.",
             wrapped="Whether the model was wrapped by the strategy.",
             saved_template_ok="Whether the template model saved.",
             contexts_identical="Whether every context's initial weights are equal.",
             average_gradients="Whether the towers' optimizer averages the gradients.",
             nccl="Whether the gradients are reduced with NCCL."),
    *_fields((ARR, NUL), devices="The devices the framework reports, described.",
             step_times_per_call="Each call's time (s).",
             placement_ranks="Each rank's own placement read.",
             placement_executors="The executors' devices.",
             steps_per_rank="Steps each rank ran.",
             tower_devices="Each tower's device.",
             variable_devices="The devices the variables live on.",
             split="How the batch is split over the towers.",
             departs_from_original="Options that differ from the original system's usage.",
             lr_read_back="The learning rate read back after each epoch.",
             heldout_accuracy_per_process="Each process's held-out accuracy per epoch.",
             first_batch_labels="The first batch's labels (real data).",
             first_timed_labels="The first timed batch's labels (real data).",
             labels_first_batch="The first batch's labels (real data).",
             nodes="Each node's identity (multi-node).",
             step_losses="Each step's loss.",
             losses="Each displayed step's loss (tf_cnn_benchmarks)."),
    *_fields((OBJ, NUL), framework="The framework versions.",
             placement="Work per device, as the framework reports it.",
             collectives="The collectives per step, as the framework compiled or ran them.",
             compiled_memory="XLA's memory analysis of the compiled step (argument, output, "
                             "alias, temp bytes; whether donated buffers were reused).",
             shardings="How parameters and batches are sharded.",
             layout_map="Keras' layout map.",
             compute_ops_by_type="Compute ops per type in the step.",
             traced_ops_by_type="Traced ops per type.",
             traced_op_seconds_by_type="Traced op seconds per type.",
             expected_work="The work each device was expected to do.",
             forward_convs_per_device="Forward convolutions per device.",
             backward_convs_per_device="Backward convolutions per device.",
             input_grad_convs_per_device="Input-gradient convolutions per device.",
             cudnn_benchmark="cuDNN benchmark mode, asked and in effect.",
             precision_details="The precision knobs in effect.",
             fsdp="FSDP2's mesh and units.",
             deepspeed_config="The DeepSpeed configuration.",
             optimizer_partition="The optimizer's partition over ranks.",
             parameter_copies="Parameter copies per device.",
             initial_weights="The initial weights' hash and whether copies agree.",
             rank_threads="Each rank's threads.",
             multi_node="How the nodes joined (multi-node).",
             first_batch="The first batch (labels, files or sums).",
             host_dataset="The host dataset fed to fit.",
             clock="The timing clock's own record.",
             keras_distribution="Keras' distribution.",
             variables="The variables' placement.",
             tensorpack="tensorpack's version and settings.",
             deepspeed="DeepSpeed's version and settings.",
             horovod="Horovod's build and settings."),
    Field("compiled_graphs", (INT, OBJ, NUL), "The graphs torch.compile built (TorchDynamo's "
          "unique_graphs counter)."),
    Field("window_evidence", (OBJ,), "What JAX reported of the timed window "
          "(runners/jax/window_evidence.py): its compiles (jax.monitoring's backend-compile "
          "events, each function and its seconds) and its transfers per direction (jax's "
          "transfer guard log; null where the log was not read back), over `steps` steps."),
    Field("window_recompiled", (STR, NUL), "A sentence when JAX compiled inside the timed "
          "window (the compile's seconds were timed as step time); null when it did not."),
    Field("compile_evidence", (OBJ,), "What TorchDynamo and Inductor report of the compile: "
          "mode, graphs, graph breaks, recompiles, DDP graph splitting, CUDA graphs."),
    Field("cross_entropy", (OBJ,), "The cross_entropy option (torch_ddp, jax_native), what "
          "the loss computed and the dtype it computed in, read back from the framework."),
    Field("flags", (ARR, OBJ, NUL), "The flags tf_cnn_benchmarks was run with."),
    Field("left_to_script", (OBJ, ARR, NUL), "The script's own settings left as it chose."),
    Field("batch_sharding", (STR, OBJ, NUL), "How the batch is sharded."),
    Field("params_sharding", (STR, OBJ, NUL), "How the parameters are sharded."),
    Field("fed_batch_sharding", (STR, OBJ, NUL), "How the batch fed to fit is sharded."),
    Field("rank_images_per_epoch", (INT, NUL), "Images one rank loads per epoch."),
    Field("batch_size_per_rank", (INT, ARR), "Each rank's batch (an integer, or one per rank)."),
    Field("optimizer", (STR, OBJ), "The optimizer, as the runner builds or the framework reports."),
    Field("allreduce", (STR, OBJ), "The all-reduce probe's figures (mode allreduce), or "
          "tensorpack's all-reduce mode."),
    Field("short_batch_rows_per_tower", (ARR, NUL), "Rows each tower got of a short last batch."),
)

FIELDS: dict[str, Field] = {f.name: f for f in (*OUTCOME, *MEMORY, *CONVERGE, *MODEL,
                                                  *EVIDENCE)}
EVIDENCE_NAMES = frozenset(f.name for f in EVIDENCE)
