"""The config's mappings, one pydantic model each: dataset, until_stable, telemetry, cluster,
capacity, converge, and a user's model (models: entries, with their input)."""

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import AfterValidator, Field

from bench.plan.config.declared import INT_MAX, _axis, _count, _Section
from bench.plan.config.messages import Says, _refuse
from contract.settings import MAX_REPEATS
from models.custom import FRAMEWORKS

Augmentation = Literal["none", "crop-flip"]
Backend = Literal["local", "slurm"]
LrScaling = Literal["linear", "sqrt", "none"]
Schedule = Literal["constant", "poly", "cosine", "step"]
LastBatch = Literal["drop", "pad", "keep"]
ConvergeAugmentation = Literal["none", "shift-flip"]
AUGMENTATIONS: tuple[str, ...] = get_args(Augmentation)
BACKENDS: tuple[str, ...] = get_args(Backend)
LR_SCALINGS: tuple[str, ...] = get_args(LrScaling)
SCHEDULES: tuple[str, ...] = get_args(Schedule)
LAST_BATCH: tuple[str, ...] = get_args(LastBatch)
CONVERGE_AUGMENTATIONS: tuple[str, ...] = get_args(ConvergeAugmentation)

# Counts with their bounds and words (declared._count); a type checker sees an int
if TYPE_CHECKING:
    Count0 = int
    Count1 = int
    Count2 = int
    Repeats = int
    Epochs = int
    Seed = int
    Workers = list[int]
    Framework = str
else:
    Count0, Count1, Count2 = _count(0), _count(1), _count(2)
    Repeats, Epochs, Seed = _count(1, MAX_REPEATS), _count(1, 100000), _count(0, 2**32 - 1)
    Workers = _axis(Count0, Says("an integer >= 0 or a list of them (parallel decode workers "
                                 "of the loader)"))
    Framework = Literal[FRAMEWORKS]


def _prepared(path: str) -> str:
    """A folder prepare-data or make-dataset wrote (it has a manifest.json), or one that does
    not exist yet (its runs are planned unavailable with the command that makes it:
    bench/run/sweep.dataset_missing), made absolute."""
    try:
        folder = Path(path).expanduser()
        prepared = (folder / "manifest.json").is_file()
        missing = not folder.exists()
        resolved = str(folder.resolve())
    except (OSError, RuntimeError, ValueError) as exc:  # ~nosuchuser, a NUL, a name too long
        raise _refuse("a folder written by `run_bench.py prepare-data` "
                      f"({type(exc).__name__}: {exc})") from None
    if not prepared and not missing:
        raise _refuse("a folder written by `run_bench.py prepare-data` or `make-dataset` (this "
                      "one exists and has no manifest.json), or one not made yet")
    return resolved


class Dataset(_Section):
    """Real data (data: real, mode: pipeline): what the loaders read."""

    path: Annotated[str, Field(min_length=1, description="a folder written by `run_bench.py "
                               "prepare-data`"), AfterValidator(_prepared),
                    Says("a folder written by `run_bench.py prepare-data`")]
    augmentation: Annotated[Augmentation, Says(", ".join(AUGMENTATIONS))] = "crop-flip"
    workers: Annotated[Workers, Field(description="parallel decode workers of the loader; a "
                                      "list is an axis")] = [4]


class UntilStable(_Section):
    """More repeats while the coefficient of variation of a configuration's images/sec is high
    (needs repeats >= 2)."""

    target_cv: Annotated[float, Field(gt=0, lt=1, allow_inf_nan=False),
                         Says("a number between 0 and 1 (0.02 = 2%)")] = 0.02
    max_repeats: Repeats = 10


class Telemetry(_Section):
    """The parent's sampler (GPU through NVML, host through psutil) while each run goes."""

    enabled: Annotated[bool, Says("true or false")] = True
    interval_s: Annotated[float, Field(ge=0.05, le=10, allow_inf_nan=False),
                          Says("seconds between samples, 0.05 to 10")] = 0.25
    starved_below_pct: Annotated[float, Field(ge=0, le=100, allow_inf_nan=False),
                                 Says("a GPU utilisation percentage, 0 to 100")] = 50.0


class Cluster(_Section):
    """Where the runs execute: here (backend local), or each as its own SLURM job (slurm)."""

    backend: Annotated[Backend, Says("local, slurm", choices=BACKENDS)] = "local"
    partition: Annotated[str | None, Field(min_length=1, description="sbatch --partition "
                                           "(default: the cluster's default partition)"),
                         Says("a partition name")] = None
    account: Annotated[str | None, Field(min_length=1, description="sbatch --account"),
                       Says("an account name")] = None
    gpus_per_node: Annotated[int | None, Field(ge=1, description="GPUs requested per node as "
                             "gres (--gres=gpu:N; default: the run's devices per node on GPU "
                             "runs, none on CPU runs)"), Says("an integer >= 1")] = None
    exclusive: Annotated[bool, Field(description="sbatch --exclusive: no run shares a node"),
                         Says("true or false")] = True
    sbatch_args: Annotated[list[Annotated[str, Field(pattern=r"^[^\x00\n]*$")]], Field(
        description="extra sbatch arguments, each one string (e.g. --qos=high, "
        "--constraint=a100)"), Says("a list of strings")] = []
    max_jobs: Annotated[int, Field(ge=1, le=INT_MAX, description="jobs of the sweep in flight "
                                   "at once (later jobs wait on earlier ones: SLURM "
                                   "dependencies, so the cap holds with --detach too)"),
                        Says("an integer >= 1")] = 8
    poll_s: Annotated[float, Field(ge=0.5, le=600, allow_inf_nan=False, description="seconds "
                                   "between looks at the queue while the sweep waits"),
                      Says("a number of seconds from 0.5 to 600")] = 5.0


class CapacitySearch(_Section):
    """Capacity mode's search (bench/run/capacity.py): doubling from `start` until a probe does
    not fit or `max` is reached, then bisection between the largest fit and the first misfit
    until they are `resolution` apart."""

    start: Annotated[Count1, Field(description="the first value probed (a batch per device "
                                      "or a layer count)")] = 1
    max: Annotated[Count1, Field(description="the largest value probed")] = 4096
    resolution: Annotated[Count1, Field(description="bisection stops once the first misfit "
                                           "is within this of the largest fit (1: exact)")] = 1


class Converge(_Section):
    """Mode converge's training recipe (runners/converge.py): the same for every runner and
    device count of the sweep, every key recorded in each run."""

    target_accuracy: Annotated[float | None, Field(gt=0, le=1, allow_inf_nan=False,
                               description="held-out top-1 accuracy at which a run stops "
                               "(0.9 = 90%); null: train max_epochs"),
                               Says("a number in (0, 1] or null")] = None
    max_epochs: Annotated[Epochs, Field(description="epochs at most; the "
                          "schedules' horizon")] = 10
    optimizer: Annotated[Literal["sgd"], Field(description="SGD with momentum (the seeds' "
                         "and Goyal et al.'s; the one every runner implements alike)"),
                         Says("sgd")] = "sgd"
    momentum: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False),
                        Says("a number in [0, 1)")] = 0.9
    weight_decay: Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False, description="L2 "
                            "penalty added to the gradient (SGD's weight_decay)"),
                            Says("a number in [0, 1)")] = 0.0
    base_lr: Annotated[float, Field(gt=0, le=100, allow_inf_nan=False, description="the "
                       "learning rate for reference_batch images per step"),
                       Says("a number in (0, 100]")] = 0.01
    reference_batch: Annotated[Count1, Field(description="the global batch base_lr is "
                               "for (lr_scaling scales it to each run's)")] = 64
    lr_scaling: Annotated[LrScaling, Field(description="linear (x B/ref, Goyal et "
                          "al. 2017), sqrt (x sqrt(B/ref)) or none"),
                          Says(", ".join(LR_SCALINGS))] = "none"
    warmup_epochs: Annotated[float, Field(ge=0, le=100000, allow_inf_nan=False,
                             description="linear warm-up per step from base_lr to the scaled "
                             "rate"), Says("a number of epochs >= 0")] = 0.0
    schedule: Annotated[Schedule, Field(description="constant, poly (seed 004's "
                        "polynomial decay), cosine or step, set at each epoch's start"),
                        Says(", ".join(SCHEDULES))] = "poly"
    poly_power: Annotated[float, Field(gt=0, le=100, allow_inf_nan=False),
                          Says("a number in (0, 100]")] = 1.0
    step_epochs: Annotated[Epochs, Field(description="schedule step: epochs "
                           "between decays")] = 30
    step_gamma: Annotated[float, Field(gt=0, le=1, allow_inf_nan=False, description="schedule "
                          "step: the factor of each decay"), Says("a number in (0, 1]")] = 0.1
    last_batch: Annotated[LastBatch, Field(description="a short last batch: drop "
                          "it (seed 002's advice), pad it from the epoch's first images, or "
                          "keep it short"), Says(", ".join(LAST_BATCH))] = "drop"
    augmentation: Annotated[ConvergeAugmentation, Field(description="none, or "
                            "shift-flip (seed 004's shifts up to 10% and horizontal flips)"),
                            Says(", ".join(CONVERGE_AUGMENTATIONS))] = "none"
    seed: Annotated[Seed, Field(description="the batches' order and "
                    "augmentation, and the model's initial weights; repeat r runs with "
                    "seed + r (modulo 2^32), so repeats differ")] = 0


class ModelInput(_Section):
    """What a user's model takes: an image (one sample's shape as the framework takes it, and
    the classes of its logits) or token ids (the sequence length and the vocabulary)."""

    kind: Annotated[Literal["image", "tokens"], Says("image, tokens", choices=("image",
                                                                           "tokens"))]
    shape: Annotated[list[Count1] | None, Field(min_length=1, max_length=3, description=(
        "image: one sample's shape as the framework takes it (C, H, W for torch and mxnet; "
        "H, W, C for jax, keras, tf)")), Says("a list of 1 to 3 integers >= 1")] = None
    classes: Annotated[Count2 | None, Field(description="image: the classes the model's "
                                               "logits score")] = None
    seq_len: Annotated[Count1 | None, Field(description="tokens: the sequence length")
                       ] = None
    vocab: Annotated[Count2 | None, Field(description="tokens: the vocabulary (the "
                                             "next-token logits' size)")] = None


def _folder(path: str) -> str:
    """An existing folder, made absolute (put on the child's sys.path)."""
    try:
        folder = Path(path).expanduser()
        ok, resolved = folder.is_dir(), str(folder.resolve())
    except (OSError, RuntimeError, ValueError) as exc:
        raise _refuse(f"an existing folder ({type(exc).__name__}: {exc})") from None
    if not ok:
        raise _refuse("an existing folder (the one holding the build's module)")
    return resolved


class CustomModel(_Section):
    """A user's own model (models/custom.py): built in the child by `build` from `path`, with
    the harness's loss, optimizer and data."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", description="the "
                    "model's name in run ids and tables"), Says(
        "a name of letters, digits, _ . - (it goes into run ids)")]
    framework: Annotated[Framework, Says(", ".join(FRAMEWORKS), choices=FRAMEWORKS)]
    build: Annotated[str, Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", description=(
        "module:function, the function returning the framework's model object")), Says(
        "module:function (e.g. mynets:make_model)")]
    path: Annotated[str, Field(min_length=1, description="the folder put on the child's "
                    "sys.path (outside the repo is fine)"), AfterValidator(_folder),
                    Says("an existing folder (the one holding the build's module)")]
    args: Annotated[dict[str, Any], Field(description="keyword arguments for build"),
                    Says("a mapping of argument name to value")] = {}
    input: Annotated[ModelInput, Says("a mapping with kind (image: shape, classes; tokens: "
                                      "seq_len, vocab)")]


def _telemetry_shorthand(value: Any) -> Any:
    """`telemetry: false` turns the sampler off; true or nothing: the defaults."""
    if value is False:
        return {"enabled": False}
    return {} if value is None or value is True else value
