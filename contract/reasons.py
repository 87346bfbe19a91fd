"""Reason codes: the short dotted codes a runner writes into its descriptive result fields
(placement_source, memory_source, state_source, data_placement, loss_kind, optimizer, the
probes' source, ...), each with its sentence kept once, here.

A runner calls `code(c)` where it defines such a constant, so a misspelt code fails at import.
A field may join codes and free text with "; " (memory_source adds its notes that way);
`sentence(v)` gives each code in it its sentence and leaves the rest (old records, free text,
a run's own failure reason) as it is. The parent shows fields through `sentence` wherever a
person reads them. `python -m contract.reasons --markdown [PATH]` writes the table into
docs/RESULTS.md between its markers; `--check` exits 1 when that table is out of date."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TypeVar

from contract.generated_block import Block

RESULTS_MD = Path(__file__).resolve().parent.parent / "docs" / "RESULTS.md"
BEGIN = "<!-- reasons:begin: python -m contract.reasons --markdown writes what follows -->"
END = "<!-- reasons:end -->"
JOIN = "; "
T = TypeVar("T")

SENTENCES: dict[str, str] = {
    "jax.allreduce_probe_source": (
        "replicas: len(output.sharding.device_set) of the all-reduce; devices: .device of each "
        "block of the input (addressable_shards); world_size: Mesh.size; hlo_collectives: the "
        "collective ops of each jitted function's compiled HLO "
        "(jit(...).lower(x).compile().as_text()), from the last size checked"),
    "jax.batch_rows_first_epoch": (
        "rows per device of the first epoch's training batches, from each batch jax.Array's "
        "addressable_shards (summed over the epoch)"),
    "jax.compiled_in_window": (
        "a compile inside the timed window: its seconds are timed as step time; raise "
        "warmup_steps (runners/jax/window_evidence.py read it from jax.monitoring)"),
    "jax.compiled_memory_source": (
        "jax: memory_analysis() of the timed step's compiled executable (XLA's buffer "
        "assignment of one device's program), read after the window"),
    "jax.cross_entropy_jaxpr": (
        "jax.make_jaxpr of the step's loss on the logits' shape and dtype (traced with the "
        "step): the dtype of each exp over the vocabulary axis, the checkpoint calls, "
        "lax.map's blocks"),
    "jax.window_evidence_source": (
        "read from jax between the clock's start and its last reading: compiles from "
        "jax.monitoring's backend-compile duration events (the function each names), transfers "
        "from jax's transfer guard set to log_explicit (its log lines on stderr counted, one per "
        "transfer and destination device; a canary transfer checks the log is read; CPU devices "
        "log no device-to-host copies)"),
    "jax.xla_attention": (
        "no cuDNN fused-attention custom call (__cudnn$fmha*) in the compiled step: attention, "
        "where the model has any, is XLA's own ops"),
    "jax.flax_batchnorm_per_device": (
        "per-device statistics (shard_map: each device's B/N rows); running statistics averaged "
        "over devices after each step (pmean)"),
    "jax.flax_token_batch_on_devices": (
        "one synthetic global batch of token ids (B, T + 1) generated under jit into the batch "
        "sharding (inputs ids[:, :-1], targets ids[:, 1:]); no host copy per step"),
    "jax.fsdp_state_source": (
        "jax: every array's addressable_shards (shard.data.nbytes per device) after the timed "
        "window: the params and optax state of the train state, sharded over the fsdp axis (a "
        "leaf with no dimension divisible by N is replicated and counted whole on every device; "
        "batch_stats not counted), and the gradients from one extra untimed call of a jitted "
        "gradient function with the step's input shardings and its constraint of the gradients to"
        " the params' shardings, on the first timed batch"),
    "jax.keras_batchnorm_global": (
        "global-batch statistics (Keras' BatchNormalization under DataParallel's jit: XLA "
        "all-reduces the moments)"),
    "jax.keras_batchnorm_per_device": (
        "per-device statistics (BatchNormalization subclass: moments and normalisation under "
        "shard_map over each device's B/N rows); moving statistics updated with the mean over "
        "devices"),
    "jax.keras_converge_device_put": (
        "the recipe's batches device_put into DataParallel's batch layout by a generator, one per"
        " step; Keras' device_put of them is a no-op"),
    "jax.keras_converge_rows": (
        "rows per device of every batch Keras' trainer passed its jitted train step in the first "
        "epoch, from those jax.Arrays' addressable_shards (summed)"),
    "jax.keras_fit_rows_first_timed": (
        "rows per device of the batch Keras' trainer passed its jitted train step at the first "
        "timed step, from that jax.Array's addressable_shards"),
    "jax.keras_grain_device_put": (
        "Grain's batches device_put into DataParallel's batch layout one batch ahead, yielded by "
        "a generator; Keras' device_put of them is a no-op"),
    "jax.keras_grain_host_batches": (
        "Grain's numpy batches yielded by a generator to fit; Keras lays each out over the "
        "devices itself (no look-ahead under a distribution)"),
    "jax.keras_loss_from_logits": (
        "global mean sparse cross-entropy from the logits (the model's softmax input, as Keras on"
        " TensorFlow takes it)"),
    "jax.keras_model_parallel_state_source": (
        "keras on jax: each variable's jax Array (.value) addressable_shards (shard.data.nbytes "
        "per device) after fit (ModelParallel: a variable the LayoutMap shards holds its 1/N "
        "slice on each device, the others a full copy): params the trainable variables "
        "(non-trainable ones, BatchNorm's moving statistics, not counted), optimizer state the "
        "optimizer's variables (momentum, iteration, learning rate); the gradients from one extra"
        " untimed call, after fit, of a jitted jax.value_and_grad of the model's "
        "compute_loss_and_updates (what Keras' train_step differentiates) on a synthetic batch in"
        " the distribution's layout, laid out as XLA returns them"),
    "jax.keras_numpy_arrays": (
        "numpy arrays in host memory given to fit with batch_size; Keras slices each batch and "
        "lays it out over the devices itself (a host-to-device copy per step, no look-ahead under"
        " a distribution)"),
    "jax.keras_numpy_arrays_per_process": (
        "each process's own numpy arrays in its host memory (its share of every global batch) "
        "given to fit with batch_size = its rows; Keras' jax trainer makes each global batch with"
        " jax.make_array_from_process_local_data over DataParallel's layout (a host-to-device "
        "copy per step, no look-ahead under a distribution)"),
    "jax.keras_pydataset_batches": (
        "numpy batches from the PyDataset's workers; Keras' jax trainer device_puts each into "
        "DataParallel's batch layout (no look-ahead under a distribution)"),
    "jax.keras_second_epoch_compiles": (
        "at the second epoch Keras' jax trainer compiles its train step again: that step is "
        "warm-up, not timed"),
    "jax.keras_settle_compiles": (
        "JAX compiled in the last warm-up call (jax.monitoring's backend-compile events): "
        "Keras' jax trainer at 1 device compiles its train step again at step 2, its first input "
        "state on one device unsharded, the next in the step's out_shardings; the window opens "
        "after a warm-up call that compiled nothing (3 extra train-function calls at most, "
        "each steps_per_execution steps)"),
    "jax.keras_sgd_lr_callback": (
        "keras.optimizers.SGD(momentum); learning_rate assigned per step by a callback "
        "(on_train_batch_begin)"),
    "jax.keras_state_source": (
        "keras on jax: each variable's jax Array (.value) addressable_shards (shard.data.nbytes "
        "per device) after fit: params the trainable variables (non-trainable ones, BatchNorm's "
        "moving statistics, not counted), optimizer state the optimizer's variables (momentum, "
        "iteration, learning rate); the gradients from one extra untimed call, after fit, of a "
        "jitted jax.value_and_grad of the model's compute_loss_and_updates (what Keras' "
        "train_step differentiates) on a synthetic batch in the distribution's layout, laid out "
        "as XLA returns them"),
    "jax.keras_synthetic_on_devices": (
        "one synthetic global batch generated on the devices in DataParallel's batch layout, "
        "yielded by a generator; Keras' device_put of it is a no-op, no host copy per step"),
    "jax.multihost_source": (
        "jax.process_count(), jax.device_count(), jax.local_device_count(), "
        "jax._src.distributed.global_state.coordinator_address, "
        "jax.config.jax_cpu_collectives_implementation; nodes gathered with "
        "jax.experimental.multihost_utils.process_allgather"),
    "jax.native_state_source": (
        "jax: every array's addressable_shards (shard.data.nbytes per device) after the timed "
        "window: the params and optax state of the train state (replicated: a full copy on each "
        "device; batch_stats not counted), and the gradients from one extra untimed call of a "
        "jitted gradient function with the step's input shardings on the first timed batch, laid "
        "out as XLA returns them (all-reduced, replicated)"),
    "jax.optax_sgd_weight_decay": (
        "optax.inject_hyperparams(chain(add_decayed_weights(weight_decay), sgd(lr, momentum))): "
        "torch.optim.SGD's update; lr set in the optax state before every step"),
    "memory.baseline_before_benchmark": (
        "memory_baseline read by runners.common.main before the runner's benchmark (its device "
        "setup reads none): whatever the runner loads later, its framework's runtime included, "
        "is counted in the device peak"),
    "memory.baseline_horovod_init": (
        "memory_baseline read after torch was imported and hvd.init() joined the ranks, before "
        "the model was built"),
    "memory.baseline_jax_devices": (
        "memory_baseline read after jax was imported and its backend initialised (jax.devices()), "
        "before the model was built"),
    "memory.baseline_keras_jax": (
        "memory_baseline read after jax's backend was initialised (jax.devices()) and Keras "
        "imported on it, before the model was built"),
    "memory.baseline_mxnet_contexts": (
        "memory_baseline read after MXNet was imported and the run's contexts made, before the "
        "model was built"),
    "memory.baseline_tf_devices": (
        "memory_baseline read after TensorFlow (and Keras) were imported and the run's devices "
        "listed and configured (tf.config), before the model was built"),
    "memory.baseline_tf_multi_worker": (
        "memory_baseline read after TensorFlow (and Keras) were imported and the "
        "MultiWorkerMirroredStrategy made over the workers, before the model was built"),
    "memory.baseline_torch_process_group": (
        "memory_baseline read after torch was imported and its process group joined "
        "(torch.distributed.init_process_group), before the model was built"),
    "memory.device_peak_less_baseline": (
        "device_peak_bytes: that peak less the process's resident memory before the model was "
        "built (memory_baseline, VmRSS)"),
    "memory.jax_peak_bytes_in_use": (
        "jax Device.memory_stats()['peak_bytes_in_use']: the peak since the process started (XLA "
        "cannot reset it), not the window's alone"),
    "memory.jax_state": (
        "jax: the params (and batch_stats) and optax state trees' arrays (nbytes), per device "
        "(replicated: each device holds a copy); gradients: the params' shapes, computed inside "
        "the jitted step"),
    "memory.keras_state": (
        "keras: model.weights, the trainable weights' shapes for the gradients (computed each "
        "step), optimizer.variables; per replica (a mirrored or replicated variable's one copy: "
        "each device holds it)"),
    "memory.mxnet_gpu_memory_info": (
        "mx.context.gpu_memory_info: the device's used memory (total - free, as the driver sees "
        "the whole device) at the window's end, not a peak"),
    "memory.no_gpu_allocator": (
        "no GPU allocator was read (no framework this module reads had initialised one in this "
        "process): the host process's memory, not the GPUs'"),
    "memory.no_timed_window": (
        "no timed window ran in this process (an external program's, or a mode without one): "
        "nothing measured"),
    "memory.tf_memory_info_peak": (
        "tf.config.experimental.get_memory_info(device)['peak'] over the timed window (reset at "
        "its start by reset_memory_stats)"),
    "memory.torch_max_allocated": (
        "torch.cuda.max_memory_allocated over the timed window (peak reset at its start by "
        "torch.cuda.reset_peak_memory_stats)"),
    "memory.torch_state": (
        "torch: module.parameters() and buffers(), the .grad tensors held after the last step, "
        "optimizer.state's tensors; what this rank holds (a replica, or a sharded strategy's "
        "local shards)"),
    "memory.vmhwm_timed_window": (
        "peak resident memory over the timed window (VmHWM of /proc/self/status, reset at its "
        "start through /proc/self/clear_refs) of the process itself: DataLoader/Grain/loader "
        "workers are processes of their own"),
    "mxnet.allreduce_probe_source": (
        "replicas: kv.num_workers x the distinct NDArray.context of the arrays pushed; devices: "
        "NDArray.context of each pushed array; kv.type, kv.num_workers, kv.rank; NDArray.context "
        "of the outputs pulled (the last size's)"),
    "mxnet.batchnorm_list_data": (
        "every context's copy of each BatchNorm running_mean and running_var Parameter "
        "(Parameter.list_data())"),
    "mxnet.converge_context_rows": (
        "NDArray.context and rows of each slice's loss array, summed over the last epoch's steps "
        "(its training rows); parameter_copies: contexts of each Parameter's data()"),
    "mxnet.converge_evaluation": (
        "inference mode, the held-out split over the contexts (split_and_load), each context's "
        "own moving statistics, as MXNet's Gluon examples' test()"),
    "mxnet.converge_loss": (
        "mean sparse cross-entropy over each global batch (contexts' summed losses, "
        "trainer.step(global rows))"),
    "mxnet.converge_split_and_load": (
        "each global batch split over the contexts by split_and_load (even_split=False: a short "
        "kept batch as numpy.array_split)"),
    "mxnet.dist_converge_evaluation": (
        "inference mode, the held-out split over the workers (numpy.array_split by kv.rank), "
        "each worker's share over its contexts (split_and_load), each context's own moving "
        "statistics; the correct predictions summed through the kvstore, so every worker reads "
        "the same accuracy"),
    "mxnet.dist_converge_loss": (
        "mean sparse cross-entropy over each global batch: each worker's summed losses over the "
        "global rows (trainer.step(global rows) after dist_sync's sum), the workers' shares "
        "summed through the kvstore"),
    "mxnet.dist_converge_placement": (
        "each worker's own read (NDArray.context and rows of each slice's loss array, summed "
        "over the last epoch's steps; parameter_copies: contexts of each Parameter's data()), "
        "gathered through the dist kvstore; keys worker<kv.rank>:<context>"),
    "mxnet.dist_converge_share": (
        "worker kv.rank's share of each global batch (numpy.array_split over kv.num_workers, "
        "runners.converge.epoch_batches), split over its contexts by split_and_load "
        "(even_split=False)"),
    "mxnet.dist_initial_weights": (
        "each worker's SHA-256 of Parameter.list_data() (names sorted) after its seeded "
        "initialisation and after the Trainer's kvstore init broadcast worker 0's, before the "
        "first step, gathered through the kvstore"),
    "mxnet.dist_kvstore_source": (
        "kv.type, kv.num_workers, kv.rank of each worker's kvstore (mx.kv.create), gathered "
        "through the kvstore with each worker's DMLC settings and the roles it started; "
        "scheduler: ps-lite's own log of the nodes it registered (PS_VERBOSE=1) and its exit "
        "status; servers: running at the gather, and the exit status of node rank 0's"),
    "mxnet.dist_sync_mechanism": (
        "MXNet dist_sync kvstore over ps-lite: a scheduler on node rank 0 and a server on every "
        "node, started by that node's process, which is the node's worker"),
    "mxnet.dist_workers_placement": (
        "each worker's own read (NDArray.context and rows of each slice's loss array of the last "
        "timed step; parameter_copies: contexts of each Parameter's data()), gathered through the"
        " dist kvstore (push/pull of the encoded JSON); keys worker<kv.rank>:<context>"),
    "mxnet.keras_executor_rows": (
        "context and rows of the data array bound to each executor of the keras-mxnet Module's "
        "train executor group (_exec_group.execs)"),
    "mxnet.keras_numpy_generator": (
        "batches copied to numpy by a Python generator read by fit_generator (Keras' queue, 1 "
        "worker thread)"),
    "mxnet.ndarray_context_rows": (
        "NDArray.context and rows of each slice's loss array of the step; parameter_copies: "
        "contexts of each Parameter's data()"),
    "mxnet.real_split_and_load": (
        "each global batch from the ImageRecordIter split over the contexts (split_and_load) "
        "inside the timed step"),
    "mxnet.real_worker_share": (
        "each worker's batch from its own share of the records (ImageRecordIter part_index "
        "kv.rank of num_parts nodes) split over its contexts (split_and_load) inside the timed "
        "step"),
    "mxnet.synthetic_worker_rows": (
        "worker r's rows r x B/N .. (r+1) x B/N of the synthetic global batch, one slice per "
        "context, copied once before timing"),
    "mxnet.trainer_optimizer_source": (
        "the Trainer's optimizer: its momentum, wd, num_update (steps applied) and learning_rate "
        "read after set_learning_rate at each epoch's first step"),
    "tf.allreduce_probe_source": (
        "replicas: strategy.num_replicas_in_sync; devices: .device of each replica's buffer; "
        "strategy.extended._cross_device_ops and ._communication_options.implementation; .device "
        "of each reduced value (strategy.experimental_local_results: on CPU TensorFlow reports "
        "every host-memory output of a function on CPU:0); the collective ops per device in the "
        "partition graphs of the instantiated tf.function (eager RunMetadata of the last size's "
        "check)"),
    "tf.cluster_source": (
        "strategy.cluster_resolver (task_type, task_id), strategy.extended (_cluster_spec, "
        "_num_workers, worker_devices, _communication_options), strategy.num_replicas_in_sync; "
        "the cluster spec before adjustment from SlurmClusterResolver.cluster_spec(); collective "
        "ops from the partition graphs; nodes gathered with strategy.gather"),
    "tf.cnn_memory_unreadable": (
        "not readable: the script's TF allocator is in its own process (tf_cnn_benchmarks prints "
        "no memory figure)"),
    "tf.cnn_process_maxrss": (
        "the tf_cnn_benchmarks.py process's peak resident memory over its whole run (ru_maxrss of"
        " this runner's children; its own loop has no window of ours)"),
    "tf.cnn_trace_executed_nodes": (
        "nodes executed per device in the step stats of the script's --trace_file (a FULL_TRACE "
        "warm-up step, step -2, as TF's Chrome timeline)"),
    "tf.cnn_window_source": (
        "wall times when this runner read the script's 'Done warm up' line (printed just before "
        "its timed loop starts) and its 'total images/sec' line (printed just after it ends)"),
    "tf.distributed_variables_state": (
        "tf.distribute: each Keras variable's DistributedVariable components (.values) and the "
        "device each is on, after the timed window (model.weights, optimizer.variables); "
        "gradients: the trainable weights' components, as each replica computes a full set per "
        "step"),
    "tf.fit_reduce_patch": (
        "Keras 3's fit calls strategy.reduce with a nested (x, y) batch and with axis=0 on "
        "per-replica scalar logs, neither of which MultiWorkerMirroredStrategy.reduce takes "
        "(keras-team/keras#20585); this strategy subclass maps reduce over the structure, as "
        "MirroredStrategy does, and reduces scalars across replicas (axis=None), the mean Keras "
        "computes on one worker"),
    "tf.function_partition_graphs": (
        "compute ops per device in the partition graphs of the tf.functions TensorFlow "
        "instantiated for the step (eager RunMetadata)"),
    "tf.keras3_sgd_weight_decay": (
        "Keras 3 SGD (m = momentum x m - lr x g; w += m), the recipe's weight_decay added to the "
        "gradient (runners/tf/common.py RecipeSGD)"),
    "tf.keras_epoch_loss": (
        "Keras' epoch loss: its loss tracker's mean over the epoch's rows (each replica's mean "
        "cross-entropy weighted by its rows)"),
    "tf.mirrored_converge_distributed": (
        "each epoch's global batches of the recipe (runners/converge.py) in tf.data on the host; "
        "Keras' distributed iterator splits each into per-replica slices and prefetches them to "
        "the replicas' devices"),
    "tf.mirrored_converge_first_batch": (
        "the first batch of a fresh iterator over the first epoch's dataset fit is given "
        "(distribute_datasets_from_function), what this worker's replicas got, before fit"),
    "tf.mirrored_converge_per_worker": (
        "each worker's share of each global batch of the recipe (runners/converge.py "
        "epoch_batches by worker index) in tf.data on its host, cut into one slice per local "
        "replica and given to fit by strategy.distribute_datasets_from_function (one input "
        "pipeline per worker; no rebatching, no auto-shard)"),
    "tf.mirrored_probe_first_batch": (
        "the first batch of a fresh iterator over the dataset fit is given, distributed as fit "
        "distributes it (experimental_distribute_dataset), before fit"),
    "tf.mirrored_real_distributed": (
        "global batches from the input pipeline on the host; Keras' distributed iterator splits "
        "each into per-replica slices and prefetches them to the replicas' devices"),
    "tf.mirrored_tokens_prefetched": (
        "one synthetic batch of token ids (inputs, next-token targets) in tf.data, prefetched to "
        "each replica's device"),
    "tf.multi_worker_mechanism": (
        "tf.distribute.MultiWorkerMirroredStrategy, its cluster from "
        "tf.distribute.cluster_resolver.SlurmClusterResolver"),
    "tf.multi_worker_sharding": (
        "each element is one global batch; MultiWorkerMirroredStrategy's distributed dataset "
        "rebatches it into one slice per replica of every worker and, with auto-shard policy "
        "DATA, each worker keeps only its own replicas' slices (with OFF every worker would train"
        " on the same rows)"),
    "tf.native_converge_per_replica": (
        "each epoch's global batches of the recipe (runners/converge.py) in tf.data on the host, "
        "split into per-replica slices and prefetched to each replica's device by "
        "experimental_distribute_dataset"),
    "tf.native_real_per_replica": (
        "global batches from tf.data on the host, split into per-replica slices and prefetched to"
        " each replica's device by experimental_distribute_dataset"),
    "tf.native_synthetic_sharding": (
        "synthetic: each replica makes its own global-batch / replicas rows, seeded by its "
        "replica id in sync (experimental_distribute_values_from_function)"),
    "tf.native_synthetic_slices": (
        "one synthetic slice per replica, created on its device once "
        "(experimental_distribute_values_from_function); no host copy per step"),
    "tf.session_partition_graphs": (
        "compute ops per device in the partition graphs of a session.run "
        "(RunOptions.output_partition_graphs)"),
    "tf.slurm_resolver_cpu_gpus": (
        "num_accelerators() answers no GPU: on CPU, SlurmClusterResolver counts GPUs from "
        "CUDA_VISIBLE_DEVICES, where '' counts as 1 GPU, and cannot be told 0 GPUs per task (its "
        "cluster_spec() steps a range by gpus_per_task); MultiWorkerMirroredStrategy takes its "
        "local devices from num_accelerators(), and with no GPU uses the worker's CPU"),
    "tf.strategy_evaluation": (
        "model(x, training=False) under strategy.run (runners/tf/common.py StrategyAccuracy): "
        "each replica predicts its share of the held-out split from its own copy of the BatchNorm"
        " moving statistics; the correct counts summed"),
    "tf.tensorpack_staged": (
        "each tower stages its batch on its device (StagingArea)"),
    "tf.tensorpack_staging_queue": (
        "one synthetic per-tower batch, enqueued from numpy by tensorpack's EnqueueThread into a "
        "FIFOQueue on /cpu:0; each tower dequeues its own"),
    "tf.tensorpack_tower_get_next": (
        "per-tower batches from tf.data on the host; each tower calls the iterator's get_next for"
        " its own batch"),
    "tf.towers_full_trace_work": (
        "nodes executed per device in the step stats of one FULL_TRACE fit step before the "
        "warm-up (the timed steps run the same graph), by op kind (runners/tf/op_kinds.py); "
        "convs_per_tower from the template's convolution layers"),
    "tf.towers_partition_graphs": (
        "compute ops per device in the partition graphs of one traced fit step before the warm-up"
        " (session.run RunOptions.output_partition_graphs)"),
    "tf.worker_partition_graphs": (
        "compute ops per device in each worker's partition graphs of the step's tf.functions "
        "(eager RunMetadata), gathered from every worker by a collective all-gather "
        "(strategy.gather)"),
    "torch.ddp_converge_loop": (
        "torchrun ranks' own loop over the recipe's batches (this rank's rows of each), "
        "optimizer.param_groups' lr set before each step"),
    "torch.ddp_strategy": (
        "torch.nn.parallel.DistributedDataParallel, one process per device (torchrun); gradients "
        "all-reduced in buckets during backward"),
    "torch.fsdp2_param_group_source": (
        "each FSDPModule's fully_shard.state(module)._fsdp_param_group: its fsdp_params, "
        "_reshard_after_forward and mp_policy"),
    "torch.fsdp2_read_after_window": (
        "read after the timed window (the last timed step's backward and optimizer.step() done; "
        "the gradient shards are kept until the next zero_grad; the parameters resharded after "
        "backward)"),
    "torch.fsdp2_strategy": (
        "torch.distributed.fsdp.fully_shard (FSDP2) per block and on the root over a 1-D "
        "DeviceMesh, one process per device (torchrun); parameters, gradients and optimizer state"
        " sharded (DTensor Shard(0))"),
    "torch.horovod_gloo_rendezvous": (
        "horovodrun's gloo rendezvous (RendezvousServer + slot environment), ranks started by "
        "srun instead of ssh (runners/torch/horovod_launch.py)"),
    "torch.horovod_probe_source": (
        "replicas: hvd.size(); devices: each rank's hvd.rank() and its buffer's device, gathered "
        "with hvd.allgather_object; hvd.local_size(), hvd.gloo_enabled()/mpi_enabled() (the "
        "controller), hvd.*_built(); activities of Horovod's timeline (rank 0) for the last "
        "size's check"),
    "torch.horovod_strategy": (
        "horovod.torch.DistributedOptimizer, one process per device (horovodrun); gradients "
        "all-reduced (Average) as backward produces them"),
    "torch.horovod_threads": (
        "horovodrun leaves thread pools alone; the harness sets OMP_NUM_THREADS to cores // N "
        "(or, unset, each rank sets torch threads to cores // ranks), so N ranks share the cores "
        "one process would use"),
    "torch.keras_ddp_strategy": (
        "Keras model (torch backend) in torch DistributedDataParallel, one process per device "
        "(torchrun), trained by the PyTorch loop of Keras' guide"),
    "torch.keras_guide_loop": (
        "the guide's loop over the recipe's batches (this rank's rows of each): torch.optim.SGD, "
        "its param groups' lr set before each step, cross-entropy on the float32 logits, model(x,"
        " training=True); not fit (see the module's docstring)"),
    "torch.keras_sgd_cross_entropy": (
        "torch.optim.SGD + torch.nn.functional.cross_entropy on the float32 logits (every "
        "position of a token model's), model(x, training=True)"),
    "torch.log_softmax_dtype": (
        "the dtype of each LogSoftmaxBackward0 node's saved result (the log-softmax the loss "
        "took) in the first step's autograd graph"),
    "torch.rank_loss": (
        "global mean cross-entropy of each step's batch (each rank's summed cross-entropy x world"
        " / the global batch's rows; DDP averages the ranks' gradients)"),
    "torch.rank_rows_all_gather_object": (
        "each rank's input-batch rows and device and its parameters' device, read from the "
        "tensors it stepped on and gathered with all_gather_object"),
    "torch.rank_rows_hvd_allgather_object": (
        "each rank's input-batch rows and device and its parameters' device, read from the "
        "tensors it stepped on and gathered with hvd.allgather_object"),
    "torch.read_after_window": (
        "read after the timed window (the last timed step's backward and optimizer.step() done; "
        "the gradients are kept until the next step's zero_grad)"),
    "torch.torchrun_threads": (
        "each rank's intra-op threads follow OMP_NUM_THREADS as it found it: the harness's share "
        "of the host's cores per rank, or, if nothing set it, torchrun's default of 1 per rank "
        "when it starts more than one (all cores for one rank)"),
    "torch.zero1_partition_source": (
        "ZeroRedundancyOptimizer._partition_parameters() (whole parameters, greedy by size); each"
        " rank's optim.param_groups and optim.state checked against its share"),
    "torch.zero1_strategy": (
        "torch.nn.parallel.DistributedDataParallel with "
        "torch.distributed.optim.ZeroRedundancyOptimizer (ZeRO-1: optimizer state partitioned "
        "over the ranks), one process per device (torchrun)"),
    "torch.zero_global_numel": (
        "global: the numel of the parameters in ZeRO's groups (stage 1/2: bit16_groups, without "
        "the flat buffers' alignment padding; stage 3: ds_numel) times each tensor's itemsize; "
        "gathered with all_gather_object"),
    "torch.zero_grads_averaged": (
        "grads: optimizer.averaged_gradients (this rank's reduced partition; the module's .grad "
        "are freed)"),
    "torch.zero_grads_at_reduction": (
        "grads: what the rank holds as engine.backward begins its end-of-backward reduction "
        "(engine.allreduce_gradients): every parameter's gradient storage once, the filled part "
        "of ZeRO's buckets (full gradients not reduced yet) and the partition buffer; stage 1 "
        "holds every full gradient there, stage 2 its partition and one bucket at most"),
    "torch.zero_memory_beyond_state": (
        "peak: device_peak_bytes; state: state_bytes_per_device; buffers from the ZeRO "
        "optimizer's tensors (ipg_buckets: stage 1/2 as the reduction began, stage 3 after it; "
        "bit16_groups_flat's padding; ds_persist parameters) and the /dev/shm mappings' smaps "
        "Rss: allocated nbytes, resident = its pages present in /proc/self/pagemap, counted at "
        "resident (else allocated) less the gradients the state counts in them; unexplained: "
        "peak less state and buffers (activations, temporaries, the collectives' and "
        "allocator's own); held_after_step: after the state reading, on CPU VmRSS less "
        "memory_baseline, on a GPU the allocator's memory_allocated; transient: peak less "
        "held_after_step"),
    "torch.zero_read_before_step": (
        "read on every rank after the timed window in one extra untimed step stopped between "
        "engine.backward and engine.step (where ZeRO holds its gradient partitions)"),
}


def code(c: str) -> str:
    """c itself, once it is in SENTENCES; KeyError naming it otherwise."""
    if c not in SENTENCES:
        raise KeyError(f"reason code {c!r} is not in contract/reasons.py SENTENCES")
    return c


def sentence(value: T) -> T:
    """value with each "; "-joined part that is a code replaced by its sentence; anything
    else (None, numbers, free text, a code this table no longer has) as it is."""
    if not isinstance(value, str):
        return value
    return JOIN.join(SENTENCES.get(part, part) for part in value.split(JOIN))  # type: ignore[return-value]


def markdown() -> str:
    """The table of docs/RESULTS.md: one row a code, by code."""
    def cell(text: str) -> str:  # a markdown table cell: | escaped, < > as entities
        return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")

    rows = [f"| `{c}` | {cell(SENTENCES[c])} |" for c in sorted(SENTENCES)]
    return "\n".join(["| code | sentence |", "|---|---|", *rows])


BLOCK = Block("python -m contract.reasons", RESULTS_MD, BEGIN, END, markdown)


def main(argv: list[str] | None = None) -> int:
    """`python -m contract.reasons --markdown [PATH]`: write the table into PATH
    (docs/RESULTS.md) between its markers; --check: exit 1 if PATH is out of date."""
    return BLOCK.main(argv, main.__doc__)


if __name__ == "__main__":
    sys.exit(main())
