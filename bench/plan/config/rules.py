"""Rules that span keys (the batch key and scaling, what each mode needs, until_stable and
repeats, the dataset's classes), checked on the validated file; `_resolve` turns it into the
SweepConfig."""

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from bench.catalog.registry import PIPELINES, PROBES, runner_options
from bench.errors import ConfigError
from bench.plan.config.batches import batch_entries, model_batches
from bench.plan.config.custom_models import custom_entry, model_name
from bench.plan.config.messages import _fail, _show
from bench.plan.config.sections import CapacitySearch, Converge
from bench.plan.config.sweep_config import BATCH_KEYS, KEYS, SweepConfig
from models import available_models, get_spec

Batches = list[int] | dict[str, list[int]]  # one list for every model, or each model's


def _batch_key(per_device: Any, global_batch: Any, scaling: str | None) -> tuple[str, str]:
    """The scaling (given, or that of the batch key given) and the batch key it takes."""
    if per_device is not None and global_batch is not None:
        raise ConfigError(
            "batch_size_per_device and global_batch_size: both given; allowed: exactly one "
            "(batch_size_per_device with scaling: weak, global_batch_size with scaling: strong)"
        )
    if per_device is None and global_batch is None:
        raise ConfigError("batch_size_per_device: missing; give it (weak scaling) "
                          "or global_batch_size (strong scaling)")
    if scaling is None:
        scaling = "weak" if per_device is not None else "strong"
    if scaling == "weak" and per_device is None:
        raise _fail("global_batch_size", global_batch,
                    "batch_size_per_device with scaling: weak (or set scaling: strong)")
    if scaling == "strong" and global_batch is None:
        raise _fail("batch_size_per_device", per_device,
                    "global_batch_size with scaling: strong (or set scaling: weak)")
    return scaling, "batch_size_per_device" if scaling == "weak" else "global_batch_size"


def _batch_sizes(s: Any, devices: list[int]) -> tuple[str, Batches]:
    """The scaling and its batch sizes: a list, or each model's (a mapping resolved against
    the sweep's models); a global batch divides by every device count."""
    scaling, key = _batch_key(s.batch_size_per_device, s.global_batch_size, s.scaling)
    batches: Batches = getattr(s, key)
    if isinstance(batches, dict):
        batches = model_batches(key, batches, [model_name(m) for m in s.models])
    for path, own in batch_entries(key, batches) if scaling == "strong" else []:
        for b in own:
            for n in devices:
                if b % n:
                    raise ConfigError(
                        f"{path}: {b} does not divide by {n} devices; allowed: a multiple of "
                        f"every device count in {_show(devices)} (a remainder would be "
                        "dropped or give a short batch)")
    return scaling, batches


def _check_classes(dataset: dict[str, Any], models: list[Any]) -> None:
    """Labels must index the model's outputs: a dataset cannot have more classes (a token
    model takes no prepared dataset: its real-data runs are planned unavailable)."""
    try:
        classes = int(json.loads((Path(dataset["path"]) / "manifest.json").read_text())
                      ["classes"])
    except (OSError, ValueError, KeyError, TypeError, OverflowError) as exc:
        raise _fail("dataset.path", dataset["path"], f"a readable prepare-data folder ({exc})"
                    ) from None
    for model in models:
        entry = custom_entry(model)
        if entry is not None and entry["input"]["kind"] == "tokens":
            continue
        if entry is None and get_spec(model).input_kind == "tokens":
            continue
        outputs = entry["input"]["classes"] if entry else get_spec(model).num_classes
        model = model_name(model)
        if classes > outputs:
            raise _fail("dataset.path", dataset["path"],
                        f"a dataset of at most {outputs} classes for model {model} "
                        f"(this one has {classes})")


def _check_allreduce(s: Any) -> None:
    """mode allreduce: device counts given, at least one of 2 or more (a count of 1 is left
    out of the probe's runs: nothing to reduce; benchmark runs keep it), on this machine."""
    if "devices" not in s.model_fields_set:
        raise ConfigError("devices: missing; this key is required with mode allreduce (device "
                          "counts of 2 or more)")
    if max(s.devices) < 2:
        raise _fail("devices", s.devices, "a device count of 2 or more with mode allreduce (an "
                    "all-reduce needs 2 devices or more; a 1 is left out of the probe's runs)")
    if s.cluster.backend != "local":
        raise _fail("cluster.backend", s.cluster.backend, "local with mode allreduce (the "
                    "probes run on this machine's devices; none crosses nodes yet)")


CAPACITY_KEYS = ("device_memory", "scale", "capacity")  # capacity mode's alone


def depth_models() -> tuple[str, ...]:
    """The models a capacity search of scale depth can deepen: the built-in GPTs (their
    TransformerShape's layers, models.with_layers)."""
    return tuple(m for m in available_models()
                 if getattr(get_spec(m).transformer, "kind", None) == "gpt")


def _check_capacity(s: Any) -> None:
    """mode capacity: alone; runners and devices given; synthetic data, weak scaling, one
    repeat, on this machine; the batch given for depth only (the search sets it for batch),
    deepened models that are built-in GPTs; a device_memory budget on cpu; start <= max.
    Without it, none of its keys."""
    given = s.model_fields_set
    if "capacity" not in s.mode:  # their defaults are fine (a resolved config gives them all)
        defaults = {"device_memory": None, "scale": "batch",
                    "capacity": CapacitySearch().model_dump()}
        for key in CAPACITY_KEYS:
            value = getattr(s, key)
            value = value.model_dump() if isinstance(value, BaseModel) else value
            if value != defaults[key]:
                raise _fail(key, value, "nothing without mode capacity")
        return
    if s.mode != ["capacity"]:
        raise _fail("mode", s.mode, "capacity alone (its probes are benchmark runs of their "
                    "own; run the other modes in a sweep of their own)")
    for key in ("runners", "devices"):
        if key not in given:
            raise ConfigError(f"{key}: missing; this key is required with mode capacity")
    if not s.runners:
        raise _fail("runners", s.runners, "a non-empty list or a single value")
    if s.data != ["synthetic"]:
        raise _fail("data", s.data, "synthetic with mode capacity (a loader's host memory is "
                    "no device's)")
    if s.global_batch_size is not None or s.scaling == "strong":
        raise _fail("global_batch_size" if s.global_batch_size is not None else "scaling",
                    s.global_batch_size if s.global_batch_size is not None else s.scaling,
                    "weak scaling with mode capacity (a search is per device)")
    if s.scale == "batch" and s.batch_size_per_device is not None:
        raise _fail("batch_size_per_device", s.batch_size_per_device, "nothing with mode "
                    "capacity and scale batch (the search sets the batch per device; give it "
                    "with scale depth)")
    if s.scale == "depth":
        if s.batch_size_per_device is None:
            raise ConfigError("batch_size_per_device: missing; this key is required with scale "
                              "depth (the batch each probe trains at)")
        deep = depth_models()
        for model in s.models:
            if model_name(model) not in deep:
                raise _fail("models", model_name(model), f"{', '.join(deep)} with scale depth "
                            "(the built-in GPTs, whose layers a probe sets)")
    if s.device == "cpu" and s.device_memory is None:
        raise ConfigError("device_memory: missing; this key is required with mode capacity on "
                          "device cpu (the budget each virtual device's peak is checked "
                          "against, e.g. 512MiB)")
    if s.capacity.start > s.capacity.max:
        raise _fail("capacity.start", s.capacity.start,
                    f"an integer <= capacity.max ({s.capacity.max})")
    if s.repeats != 1 or s.until_stable is not None:
        raise _fail("repeats" if s.repeats != 1 else "until_stable", s.repeats if
                    s.repeats != 1 else s.until_stable.model_dump(), "1 (and no until_stable) "
                    "with mode capacity (each probe runs once)")
    if s.cluster.backend != "local":
        raise _fail("cluster.backend", s.cluster.backend, "local with mode capacity (each probe "
                    "follows from the one before, on this machine's devices)")


def _check_converge(s: Any) -> None:
    """mode converge: alone; runners and devices given; a dataset with its splits (make-dataset
    wrote splits.npz) whose classes the models have; data real (the splits); warm-up within
    max_epochs. Without it, no converge key."""
    if "converge" not in s.mode:
        if "converge" in s.model_fields_set and s.converge != Converge():
            raise _fail("converge", s.converge.model_dump(), "nothing without mode converge")
        return
    if s.mode != ["converge"]:
        raise _fail("mode", s.mode, "converge alone (its runs train to accuracy; run the other "
                    "modes in a sweep of their own)")
    for key in ("runners", "devices", "dataset"):
        if key not in s.model_fields_set or getattr(s, key) in (None, []):
            raise ConfigError(f"{key}: missing; this key is required with mode converge"
                              + (" (a folder written by `run_bench.py make-dataset --source "
                                 "digits|cifar10`)" if key == "dataset" else ""))
    if "data" in s.model_fields_set and s.data != ["real"]:
        raise _fail("data", s.data, "real with mode converge (it trains on the dataset's "
                    "training split)")
    for key in ("augmentation", "workers"):
        if key in s.dataset.model_fields_set:
            raise _fail(f"dataset.{key}", getattr(s.dataset, key), "nothing with mode converge "
                        "(it trains on the splits in memory; converge.augmentation sets its "
                        "augmentation)")
    path = Path(s.dataset.path) / "splits.npz"
    if Path(s.dataset.path).exists() and not path.is_file():
        raise _fail("dataset.path", s.dataset.path, "a folder with a training and held-out "
                    "split (splits.npz) with mode converge: one written by `run_bench.py "
                    "make-dataset --source digits|cifar10`")
    if s.converge.warmup_epochs > s.converge.max_epochs:
        raise _fail("converge.warmup_epochs", s.converge.warmup_epochs,
                    f"a number <= converge.max_epochs ({s.converge.max_epochs})")
    if path.is_file():  # not made yet: its runs are planned unavailable (sweep.dataset_missing)
        _check_classes(s.dataset.model_dump(), s.models)


def _resolve(s: Any, default_name: str) -> SweepConfig:
    """The validated file as a SweepConfig, once the rules that span keys hold."""
    _check_modes(s)
    scaling, batch_sizes = _scaling_and_batches(s)
    name = s.name if s.name is not None else default_name
    # the name is a folder name (results/<name>-<time>) and printed: printable characters
    if not name or not name.isprintable() or any(c in name for c in "/\\ "):
        raise _fail("name", name, "a non-empty string of printable characters without spaces "
                    "or slashes")
    dataset = _dataset(s)
    if s.until_stable is not None and s.repeats < 2:
        raise _fail("repeats", s.repeats, "an integer >= 2 with until_stable (the coefficient "
                    "of variation of one run is undefined)")
    if s.until_stable is not None and s.until_stable.max_repeats < s.repeats:
        raise _fail("until_stable.max_repeats", s.until_stable.max_repeats,
                    f"an integer >= {s.repeats}")
    # a pipeline-only sweep needs no runners (but checks those of the file it came from)
    runners = s.runners or []
    # every key as the file gave it (a mapping as a dict), but those resolved here
    given = {key: getattr(s, key) for key in KEYS if key not in BATCH_KEYS}
    resolved: dict[str, Any] = {
        **{k: v.model_dump() if isinstance(v, BaseModel) else v for k, v in given.items()},
        "name": name, "runners": runners, "scaling": scaling, "batch_sizes": batch_sizes,
        **({"data": ["real"]} if "converge" in s.mode else {}),
        "runner_options": {r: s.options_of(r) for r in runners}, "dataset": dataset,
        # every pipeline unless named (named ones are checked even when mode leaves them out,
        # so a typo never waits for the day they run)
        "pipelines": s.pipelines or (list(PIPELINES) if "pipeline" in s.mode else []),
        # every probe unless named (named ones are checked whatever the mode, as pipelines)
        "probes": s.probes or (list(PROBES) if "allreduce" in s.mode else []),
    }
    return SweepConfig(**resolved)


def _check_modes(s: Any) -> None:
    """What each mode needs (capacity, converge, allreduce, benchmark), and what nodes and
    until_stable need of the cluster."""
    benchmark, pipeline = "benchmark" in s.mode, "pipeline" in s.mode
    allreduce = "allreduce" in s.mode
    _check_capacity(s)
    _check_converge(s)
    custom = [model_name(m) for m in s.models if custom_entry(m)]
    if custom and (pipeline or allreduce):
        raise _fail("models", custom[0], "a built-in model with mode "
                    f"{'pipeline' if pipeline else 'allreduce'} (your own model's input size "
                    "and gradient bytes are known only in its run; mode benchmark runs it)")
    if allreduce:
        _check_allreduce(s)
    if benchmark:
        for key in ("runners", "devices"):
            if key not in s.model_fields_set:
                raise ConfigError(f"{key}: missing; this key is required")
        if not s.runners:
            raise _fail("runners", s.runners, "a value or a list of values" if s.runners is None
                        else "a non-empty list or a single value")
        _check_steps_per_call(s)
    for runner in s.runners or []:
        _check_needed_options(runner, s.options_of(runner))
    if max(s.nodes) > 1 and s.cluster.backend != "slurm":
        raise _fail("nodes", s.nodes, "[1] unless cluster.backend is slurm (a run over "
                    "several nodes is one SLURM job; set cluster: {backend: slurm})")
    if s.until_stable is not None and s.cluster.backend == "slurm":
        raise _fail("until_stable", s.until_stable.model_dump(), "nothing with cluster.backend: "
                    "slurm (its repeats are decided run by run; use repeats)")


def _check_steps_per_call(s: Any) -> None:
    """A runner's steps_per_execution (Keras: steps per call) divides warmup_steps and
    measure_steps: the timed window counts whole calls (runners/common.py TimedWindow)."""
    for runner in s.runners:
        value = s.options_of(runner).get("steps_per_execution")
        for per_call in value if isinstance(value, list) else [value]:
            if isinstance(per_call, int) and per_call > 1 and (
                    s.warmup_steps % per_call or s.measure_steps % per_call):
                raise _fail(f"runner_options.{runner}.steps_per_execution", per_call,
                            f"a divisor of warmup_steps ({s.warmup_steps}) and measure_steps "
                            f"({s.measure_steps}): the timed window counts whole calls")


def _check_needed_options(runner: str, given: dict[str, Any]) -> None:
    """An option whose Option.needs another option's value (torch_ddp's compile_mode needs
    compile: true) takes a value other than its default only where that option has it, in
    every run of an option axis."""
    for name, option in runner_options(runner).items():
        if option.needs is None:
            continue
        other, wanted = option.needs
        values, others = (v if isinstance(v, list) else [v] for v in (given[name], given[other]))
        for value in values:
            if value != option.default and any(o != wanted for o in others):
                raise _fail(f"runner_options.{runner}.{name}", value,
                            f"{_show(option.default)} unless {other} is "
                            f"{json.dumps(wanted)} ({name} is used only with it)")


def _scaling_and_batches(s: Any) -> tuple[str, Batches]:
    """The scaling and its batch sizes; none for the probes alone (mode allreduce)."""
    # strong scaling divides the global batch by the devices of all nodes
    totals = s.devices if s.nodes == [1] else sorted({n * d for n in s.nodes for d in s.devices})
    if not ({"benchmark", "pipeline", "converge"} & set(s.mode)) \
            and s.batch_size_per_device is None and s.global_batch_size is None:
        return s.scaling or "weak", []  # the probe alone: no batch
    return _batch_sizes(s, totals)


def _dataset(s: Any) -> dict[str, Any] | None:
    """The dataset as the runs take it (converge: its path alone), given where the modes and
    data need it, its classes within the models' (real-data benchmark runs)."""
    benchmark, pipeline = "benchmark" in s.mode, "pipeline" in s.mode
    if s.dataset is None and (pipeline or (benchmark and "real" in s.data)):
        why = "mode includes pipeline" if pipeline else "data includes real"
        raise _fail("dataset", None, "a mapping with path: <a folder written by "
                    f"`run_bench.py prepare-data`> when {why}")
    dataset: dict[str, Any] | None = s.dataset.model_dump() if s.dataset is not None else None
    if dataset and "converge" in s.mode:  # its path alone (the splits in memory)
        dataset = {"path": dataset["path"]}
    if dataset and "real" in s.data and benchmark and Path(dataset["path"]).exists():
        _check_classes(dataset, s.models)
    return dataset
