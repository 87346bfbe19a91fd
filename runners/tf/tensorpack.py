"""tensorpack 0.11's synchronous data-parallel trainers (replicated, parameter_server) on
TensorFlow 2.21 through tf.compat.v1: QueueInput feeds per-tower batches (no global-batch
split); the towers' "/gpu:k" moved to the run's devices (relocate_towers). Differs: TF 2's
resource variables are placed here where 0.11 placed them on TF 1.x.
docs/runners/tensorpack.md, "Notes from the code"."""

from __future__ import annotations

import os
import re

from contract.reasons import code

os.environ["TF_USE_LEGACY_KERAS"] = "1"  # tf.keras is tf_keras (Keras 2), never Keras 3, here
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from models import ModelSpec, get_spec, load_builder  # noqa: E402
from runners.common import Invalid, Spec, TimedWindow, Unavailable, main  # noqa: E402
from runners.real_data import RealData, describe, open_for_model  # noqa: E402
from runners.tf import data as tf_data  # noqa: E402
from runners.tf import devices as tf_devices  # noqa: E402
from runners.tf.placement import graph_placement, graph_run_options  # noqa: E402

tfv1 = tf.compat.v1
DATA_FORMAT = "channels_last"
# what train() says about the towers, the trainer and where the step ran, copied into every result
RUN_FIELDS = ("devices", "tower_devices", "variable_devices", "input", "trainer",
              "allreduce_asked", "allreduce", "gradient_packer", "ps_device", "gradients",
              "placement", "placement_source")


def framework_versions() -> dict[str, str]:
    import tensorpack
    import tf_keras

    return {"tensorflow": tf.__version__, "tf_keras": tf_keras.__version__,
            "tensorpack": tensorpack.__version__, "numpy": np.__version__}


def count_params(model: str) -> tuple[int, int]:
    """(all, trainable) variables of the tfv1 builder, built once in a scratch graph."""
    spec = get_spec(model)
    with tf.Graph().as_default():
        images = tfv1.placeholder(tf.float32, [1, *spec.input_shape])
        load_builder(model, "tfv1")(spec, images, training=True, data_format=DATA_FORMAT)
        total = sum(int(np.prod(v.shape)) for v in tfv1.global_variables())
        trainable = sum(int(np.prod(v.shape)) for v in tfv1.trainable_variables())
    return total, trainable


def relocate_towers(graph: Any, devices: list[str]) -> None:
    """Put every op tensorpack placed on "/gpu:k" on the run's device k (the identity on GPUs);
    call on the finished graph, before the session sees it."""
    targets = [tfv1.DeviceSpec.from_string(d) for d in devices]
    for op in graph.get_operations():
        if not op.device:
            continue
        spec = tfv1.DeviceSpec.from_string(op.device)
        if spec.device_type != "GPU" or spec.device_index is None:
            continue
        target = spec.make_merged_spec(targets[spec.device_index]).to_string()
        if target != spec.to_string():
            op._set_device(target)


def gradient_packer(graph: Any) -> dict[str, int] | None:
    """tensorpack's GradientPacker as it appears in the built graph: how many towers' gradients
    it concatenated and into how many splits (None when tensorpack did not pack)."""
    ops = [op for op in graph.get_operations() if "GradientPacker/" in op.name]
    # one concat per tower; the reused name scope numbers them concatenated_grads_<i>
    packs = [op for op in ops if re.search(r"/concatenated_grads(_\d+)?$", op.name)]
    if not packs:
        return None
    split = next(op for op in ops if op.type == "SplitV" and op.inputs[0].op in packs)
    return {"towers": len(packs), "splits": len(split.outputs)}


class VariableSetter:
    """Device function: variables on the least loaded of ps_devices, other ops on worker; places
    TF2's resource variables, which tensorpack 0.11's setter leaves on tower 0."""

    def __init__(self, worker: str, ps_devices: list[str], sizes: list[int]) -> None:
        self.worker, self.ps_devices, self.sizes = worker, ps_devices, sizes

    def __call__(self, op: Any) -> str:
        if op.device:
            return op.device
        if op.type not in ("VarHandleOp", "VariableV2", "Variable"):
            return self.worker
        i = int(np.argmin(self.sizes))
        self.sizes[i] += tf.TensorShape(op.get_attr("shape")).num_elements() or 1
        return self.ps_devices[i]


def parameter_server_builder(n: int, ps_device: str) -> Any:
    """tensorpack's parameter-server builder for n towers, variables where 0.11 put them on TF 1.x:
    on /cpu:0 (ps_device cpu) or spread over the tower devices (ps_device gpu)."""
    from tensorpack.graph_builder.training import (
        DataParallelBuilder,
        SyncMultiGPUParameterServerBuilder,
    )

    raw = [f"/gpu:{k}" for k in range(n)]  # tower k's device, as tensorpack 0.11 hard-codes it

    class ParameterServerBuilder(SyncMultiGPUParameterServerBuilder):
        def call_for_each_tower(self, tower_fn: Any) -> Any:
            ps = ["/cpu:0"] if self.ps_device == "cpu" else list(raw)
            sizes = [0] * len(ps)
            setters = [VariableSetter(d, ps, sizes) for d in raw]
            return DataParallelBuilder.build_on_towers(self.towers, tower_fn, setters)

    return ParameterServerBuilder(list(range(n)), ps_device)


def make_trainer(spec: Spec, n: int) -> tuple[Any, dict[str, Any]]:
    """The configured tensorpack trainer for n towers, and what it is (replicated: tensorpack's
    own; parameter_server: only where variables go changed)."""
    from tensorpack.train import SyncMultiGPUTrainerParameterServer, SyncMultiGPUTrainerReplicated

    opts = spec.options
    kind = opts["trainer"]
    if kind == "replicated":
        mode = opts["allreduce"]
        if spec.device == "cpu" and mode == "nccl":
            raise Unavailable("all-reduce mode 'nccl': NCCL all-reduces between GPUs; this run "
                              "is on CPU devices")
        trainer = SyncMultiGPUTrainerReplicated(n, average=True,
                                                mode=None if mode == "auto" else mode)
        trainer.BROADCAST_EVERY_EPOCH = False  # tensorpack's advice for benchmarks
        return trainer, {"trainer": "SyncMultiGPUTrainerReplicated", "allreduce_asked": mode,
                         "gradients": "averaged over towers"}
    ps_device = opts["ps_device"]  # parameter_server (the catalog's choices)
    trainer = SyncMultiGPUTrainerParameterServer(n, ps_device=ps_device)
    trainer._builder = parameter_server_builder(n, ps_device)
    return trainer, {"trainer": "SyncMultiGPUTrainerParameterServer", "ps_device": ps_device,
                     "gradients": "averaged next to each variable"}


def make_input(spec: Spec, feed: list[list[np.ndarray]] | RealData) -> tuple[Any, str]:
    """The trainer's InputSource and its name: QueueInput over the per-tower batches, or
    TFDatasetInput (real data), in StagingInput for `input: staging`. Call inside the graph."""
    from tensorpack.dataflow import DataFromList
    from tensorpack.input_source import QueueInput, StagingInput, TFDatasetInput

    if isinstance(feed, RealData):
        size = get_spec(spec.model).input_shape[0]
        # a V1 dataset: TFDatasetInput asks for output_types and make_initializable_iterator
        ds = tf_data.make_dataset(feed, size, spec.batch_size_per_device,
                                  dataset_cls=tfv1.data.Dataset)
        source, name = TFDatasetInput(ds), "TFDatasetInput"
    else:
        source, name = QueueInput(DataFromList(feed, shuffle=False)), "QueueInput"
    if spec.options["input"] == "staging":
        return StagingInput(source), f"StagingInput({name})"
    return source, name


class Towers:
    """The tower function tensorpack calls per tower: the tfv1 model on the tower's batch (BatchNorm
    statistics updated in the main tower only), its mean cross-entropy; keeps losses and labels."""

    def __init__(self, model: str, per_tower: int) -> None:
        self.model_spec: ModelSpec = get_spec(model)
        self.build = load_builder(model, "tfv1")
        self.signature = [
            tf.TensorSpec((per_tower, *self.model_spec.input_shape), tf.float32, "image"),
            tf.TensorSpec((per_tower,), tf.int32, "label")]
        self.losses: list[tf.Tensor] = []
        self.labels: list[tf.Tensor] = []

    def cost(self, images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        from tensorpack.tfutils import get_current_tower_context

        ctx = get_current_tower_context()
        logits = self.build(self.model_spec, images, training=True, data_format=DATA_FORMAT,
                            update_stats=ctx.is_main_training_tower)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(
            labels=labels, logits=logits), name="loss")
        self.losses.append(loss)
        self.labels.append(labels)
        return loss


class Clock:
    """Drives the timed window after each step's session.run; the first step also fetches the
    towers' labels and the partition graphs; after training, the global step and read_vars.
    Its methods are tensorpack Callback hooks (clock_callback makes it one)."""

    trainer: Any  # the tensorpack trainer, set by Callback.setup_graph

    def __init__(self, steps: tuple[int, int], device: str, towers: Towers,
                 read_vars: list[str] | None) -> None:
        self.window = TimedWindow(*steps, on_start=self._start)
        self.device, self.towers, self.read_vars = device, towers, read_vars or []
        self.gs0 = self.gs1 = None
        self.placement: dict[str, Any] = {}
        self.values: dict[str, np.ndarray] = {}
        self.first_labels: list[int] = []

    def _start(self) -> None:
        self.gs0 = int(self.trainer.sess.run(self.gs))

    def _setup_graph(self) -> None:
        from tensorpack.tfutils import get_global_step_var

        with tf.device(self.device):
            self.loss = tf.add_n(self.towers.losses) / len(self.towers.losses)
        self.gs = get_global_step_var()
        by_name = {v.op.name: v for v in tfv1.global_variables() + tfv1.local_variables()}
        self.read = {k: by_name[k] for k in self.read_vars}

    def _before_run(self, ctx: Any) -> Any:
        self.window.step_begin()
        options = None
        fetches: dict[str, Any] = {"loss": self.loss}
        if self.window.calls == 0:  # the labels the towers trained on in the first step
            fetches["labels"] = self.towers.labels
            options, _ = graph_run_options()  # the hooked session fills its RunMetadata
        return tfv1.train.SessionRunArgs(fetches=fetches, options=options)

    def _after_run(self, ctx: Any, values: Any) -> None:
        self.window.step_done(float(values.results["loss"]))
        if "labels" in values.results:
            self.first_labels = [int(v) for t in values.results["labels"] for v in t]
        metadata = values.run_metadata
        if self.window.calls == 1 and metadata is not None:
            self.placement = graph_placement(metadata)

    def _after_train(self) -> None:
        sess = self.trainer.sess
        self.gs1 = int(sess.run(self.gs))
        self.values = sess.run(self.read) if self.read else {}


def clock_callback(steps: tuple[int, int], device: str, towers: Towers,
                   read_vars: list[str] | None) -> Clock:
    """A Clock that is the trainer's tensorpack Callback (tensorpack imported here, as
    everywhere in this module; the class name is the callback's name scope)."""
    from tensorpack.callbacks import Callback

    class ClockCallback(Clock, Callback):
        """Clock's hooks, called by tensorpack's Callback."""

    return ClockCallback(steps, device, towers, read_vars)


def relocating_session_creator(names: list[str], config: Any) -> Any:
    """tensorpack's session creator, moving its "/gpu:k" ops to the run's devices first."""
    from tensorpack.tfutils.sesscreate import NewSessionCreator

    class RelocatingSessionCreator(NewSessionCreator):
        def create_session(self) -> Any:
            relocate_towers(tfv1.get_default_graph(), names)
            return super().create_session()

    return RelocatingSessionCreator(config=config)


def train(spec: Spec, model: str, feed: list[list[np.ndarray]] | RealData, optimizer: Any,
          steps: tuple[int, int], initial: dict[str, np.ndarray] | None = None,
          read_vars: list[str] | None = None) -> dict[str, Any]:
    """Build the towers and train for warm-up + measured steps: the clock and what it saw. The
    first step asks TF for its partition graphs (the placement)."""
    from tensorpack.tfutils.sessinit import DictRestore, JustCurrentSession

    config = tf_devices.session_config(spec)  # before anything else touches TF's devices
    names, devices = tf_devices.setup_devices(spec)
    tfv1.disable_eager_execution()
    towers = Towers(model, spec.batch_size_per_device)
    trainer, trainer_info = make_trainer(spec, len(names))
    source, input_name = make_input(spec, feed)
    trainer.setup_graph(towers.signature, source, towers.cost,
                        lambda: optimizer() if callable(optimizer) else optimizer)
    packer = gradient_packer(tfv1.get_default_graph())
    if hasattr(trainer._builder, "_mode"):  # the mode tensorpack's builder settled on
        trainer_info["allreduce"] = trainer._builder._mode
        trainer_info["gradient_packer"] = packer or packer_absent(trainer._builder._mode)
    clock = clock_callback(steps, names[0], towers, read_vars)
    warmup, measure = steps
    trainer.train(callbacks=[clock], monitors=[],
                  session_creator=relocating_session_creator(names, config),
                  session_init=DictRestore(initial) if initial else JustCurrentSession(),
                  steps_per_epoch=warmup + measure, starting_epoch=1, max_epoch=1)

    def canonical(device: str) -> str:
        return tfv1.DeviceSpec.from_string(device).to_string()

    variable_devices = sorted({canonical(v.device) for v in tfv1.trainable_variables()
                               if not v.name.startswith("tower")})
    ran = clock.window.calls
    if ran != warmup + measure or clock.gs0 is None or clock.gs1 is None:
        raise Invalid(f"tensorpack ran {ran} of {warmup + measure} steps")
    tower_devices = [canonical(loss.op.device) for loss in towers.losses]
    check_towers_ran(tower_devices, clock.placement.get("placement", {}))
    return {"clock": clock, "devices": devices, "input": input_name,
            "tower_devices": tower_devices, "variable_devices": variable_devices,
            **clock.placement, **trainer_info}


def packer_absent(mode: str) -> str:
    """Why the built graph has no GradientPacker."""
    if mode != "hierarchical":
        return f"not used: tensorpack 0.11 packs only in mode 'hierarchical', not {mode!r}"
    return ("skipped by tensorpack: fewer than 1024 gradient elements per split, or mixed "
            "gradient dtypes")


def check_towers_ran(tower_devices: list[str], placement: dict[str, int]) -> None:
    """Invalid unless TF ran compute ops on every tower's device (tensorpack's towers are asked
    for by name; soft placement would move a tower it cannot place without a word)."""
    def short(device: str) -> str:
        return device.split("device:")[-1].upper()

    ran = {short(d) for d in placement}
    missing = [d for d in tower_devices if short(d) not in ran]
    if missing:
        raise Invalid(f"towers on {missing} ran no compute ops there; TensorFlow placed the "
                      f"step's work on {sorted(placement)}")


def _check_batch(spec: Spec) -> int:
    n, per = spec.num_devices, spec.batch_size_per_device
    if per * n != spec.global_batch_size:
        raise Unavailable(f"tensorpack feeds every tower its own batch of batch_size_per_device "
                          f"rows: global batch {spec.global_batch_size} is not {per} x {n}")
    return per


def benchmark(spec: Spec) -> dict[str, Any]:
    if spec.data not in ("synthetic", "real"):
        raise Unavailable(f"data {spec.data!r} is neither synthetic nor real")
    if spec.precision != "fp32":
        raise Unavailable(f"precision {spec.precision!r}: this runner builds fp32 graphs")
    per = _check_batch(spec)
    model_spec = get_spec(spec.model)
    params, trainable = count_params(spec.model)
    if (params, trainable) != (model_spec.params, model_spec.trainable_params):
        raise Invalid(f"tfv1 {spec.model} has {params} params ({trainable} trainable); the "
                      f"spec says {model_spec.params} ({model_spec.trainable_params})")
    feed: list[list[np.ndarray]] | RealData
    data_info: dict[str, Any] = {}
    if spec.data == "real":
        feed = open_for_model(spec, model_spec)
        size = model_spec.input_shape[0]
        data_info = {**describe(feed, size),
                     "input_pipeline": tf_data.describe_pipeline(feed, per)
                     + "; each tower takes its own batch (get_next per tower)"}
    else:
        rng = np.random.default_rng(0)
        x = rng.standard_normal((per, *model_spec.input_shape), dtype=np.float32)
        y = rng.integers(0, model_spec.num_classes, per).astype(np.int32)
        feed = [[x, y]]
    run = train(spec, spec.model, feed,
                lambda: tfv1.train.MomentumOptimizer(0.01, 0.9),
                (spec.warmup_steps, spec.measure_steps))
    clock = run["clock"]
    global_batch = spec.global_batch_size
    staged = "; " + code("tf.tensorpack_staged") if "Staging" in run["input"] else ""
    if spec.data == "real":
        data_info["labels_first_batch"] = clock.first_labels
        placement = code("tf.tensorpack_tower_get_next") + staged
    else:
        placement = code("tf.tensorpack_staging_queue") + staged
    return {
        **clock.window.summary(global_batch, (clock.gs1 - clock.gs0) * global_batch),
        "loss_kind": "mean of the towers' cross-entropy on the measured step's batches",
        "layout": DATA_FORMAT,
        "data_placement": placement,
        **data_info,
        "params": params,
        "trainable_params": trainable,
        "flops_per_sample": model_spec.flops_per_sample,
        **run_fields(spec, run),
    }


def run_fields(spec: Spec, run: dict[str, Any]) -> dict[str, Any]:
    """What benchmark and equivalence both report of train()'s towers, trainer and placement."""
    return {"replicas": spec.num_devices, "framework": framework_versions(),
            **{k: run[k] for k in RUN_FIELDS if k in run}}


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step on the probe model: the global batch in N per-tower slices from the
    queue, initial weights restored by name, weights saved after the step."""
    weights, x, y, lr = spec.equivalence_inputs()
    n = spec.num_devices
    per = _check_batch(spec)
    slices = [[x[i * per:(i + 1) * per], y[i * per:(i + 1) * per].astype(np.int32)]
              for i in range(n)]
    names = sorted(weights)
    replicated = spec.options["trainer"] == "replicated"
    copies = [f"tower{i}/{k}" for i in range(1, n) for k in names] if replicated else []
    run = train(spec, "probe", slices, tfv1.train.GradientDescentOptimizer(lr), (0, 1),
                initial=weights, read_vars=names + copies)
    after = run["clock"].values
    for key in copies:  # every replica applied the same averaged update
        main_copy = after[key.split("/", 1)[1]]
        if not np.allclose(after[key], main_copy, rtol=1e-6, atol=1e-7):
            raise Invalid(f"replica {key} differs from tower 0's copy after the step")
    spec.save_equivalence_output({k: after[k] for k in names})
    return run_fields(spec, run)


if __name__ == "__main__":
    main(benchmark, equivalence)
