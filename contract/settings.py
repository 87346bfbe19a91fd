"""The run settings, each declared once: what a sweep file sets and what each run is told.

One `Setting` per setting: its name, the type of one value, its default, one sentence of help,
and where it goes:

- `key`: the sweep file's key that sets it (a `Key`: the key's name where it differs, whether
  it is an axis, its default where that differs, its bounds or allowed values, the JSON
  Schema's description); None: the plan works it out (run_id, family, ...).
- `spec`: a field of the run's Spec (runners.common.Spec, the JSON the child reads); False: the
  sweep's alone (name, pipelines, cluster, ...).
- `record`: the spec field is copied into the run's record (bench/records/columns.py, view
  `spec`), with `help` as its meaning there.
- `planned`: the plan works the run's value out from the key (bench/plan/runs.py); a spec
  setting with a one-value key and not planned is copied to every run as the sweep gives it
  (device, warmup_steps, ...).

Derived from SETTINGS: the sweep file's keys, their pydantic model and JSON Schema
(bench/plan/config/model.py; a key whose validation is its own, a nested mapping say, has its
type there, named by key), what the plan copies into every run (bench/plan/runs.py) and the
record's spec fields (bench/records/columns.py). Written out, and held equal to SETTINGS by
tests/test_settings.py: SweepConfig (bench/plan/config/sweep_config.py) and the child's Spec
(contract/spec.py). Adding a setting is one Setting here, its field in those two, plus the
code that reads it (docs/DESIGN.md, "Add a setting").

Stdlib only: framework environments read this module (the child's contract).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any


class _Marker:
    """A default that is no value: REQUIRED, or a key's SAME."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


REQUIRED: Any = _Marker("REQUIRED")  # no default: every run is given it, the file must give it
SAME: Any = _Marker("SAME")  # a key's default that is its setting's

SCALING = ("weak", "strong")
DATA = ("synthetic", "real")
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
DEVICES = ("cpu", "gpu")
MODES = ("benchmark", "pipeline", "allreduce", "capacity", "converge")  # the sweep's; a Spec's
# mode may be equivalence (a capacity sweep's probes are benchmark runs)
SCALES = ("batch", "depth")  # what a capacity search grows
# repeats multiply the whole plan: a typo of 10**9 would plan (and dry-run print) forever
MAX_REPEATS = 1000


@dataclass(frozen=True)
class Key:
    """How the sweep file gives a setting: its config key."""

    name: str = ""  # the key; "": the setting's name
    default: Any = SAME  # the key's default (REQUIRED: the file must give it)
    help: str = ""  # the key's description in the JSON Schema ("": none)
    axis: bool = False  # one value or a list of them, each value its own runs
    empty_ok: bool = False  # an axis that may be an empty list
    minimum: int | float | None = None  # a number's bounds
    maximum: int | float | None = None
    # the values allowed; a key of strings without any takes any string, unless the parent
    # knows them (runners, models, pipelines, probes: bench/plan/config.py)
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Setting:
    """One setting; see the module docstring."""

    name: str  # the Spec field, or (spec=False) the sweep file's key
    type: Any  # the type of one value (a spec field's type; an axis key takes a list of it)
    default: Any = REQUIRED
    help: str = ""
    key: Key | None = None
    spec: bool = True
    record: bool = True
    planned: bool = False

    @property
    def key_name(self) -> str:
        """The config key ("" when the sweep file has none)."""
        return "" if self.key is None else self.key.name or self.name

    @property
    def key_default(self) -> Any:
        """The key's default: its own, else the setting's."""
        if self.key is None or self.key.default is SAME:
            return self.default
        return self.key.default

    @property
    def recorded(self) -> bool:
        """A spec field the record holds (bench/records/columns.py's view spec)."""
        return self.spec and self.record

    @property
    def copied(self) -> bool:
        """A spec field every run takes from the config as it is (bench/plan/runs.py)."""
        return (self.spec and self.key is not None and not self.key.axis
                and not self.planned)

    def dataclass_field(self) -> tuple[str, Any, Any]:
        """(name, type, field) for dataclasses.make_dataclass: a list or dict default is a
        factory of a copy of it."""
        if self.default is REQUIRED:
            return self.name, self.type, dataclasses.field()
        if isinstance(self.default, (list, dict)):
            value = self.default
            factory = type(value) if not value else lambda: copy.deepcopy(value)
            return self.name, self.type, dataclasses.field(default_factory=factory)
        return self.name, self.type, dataclasses.field(default=self.default)


# In the sweep file's order (the JSON Schema's, and the one its messages list keys in).
SETTINGS: tuple[Setting, ...] = (
    Setting("run_id", str, help="The run's id (results/README.md: run ids)."),
    Setting("sweep_id", str, help="The sweep's id: its results folder's name."),
    Setting("name", str, None, "The sweep's name: its results folder is <name>-<time>.",
            Key(help="the sweep's name (default: the file's stem)"), spec=False),
    Setting("description", str, "", "What the sweep is for, in words.", Key(), spec=False),
    Setting("runner", str, help="The runner: a framework and its data-parallel strategy "
            "(`run_bench.py list`).",
            key=Key("runners", None, "required with mode benchmark", axis=True,
                    empty_ok=True)),
    Setting("family", str, help="The runner's framework family, whose environment ran it."),
    Setting("module", str, help="The runner's module (`python -m <module>`).", record=False),
    Setting("launcher", str, "python", "How the parent starts the run: python (one process), "
            "torchrun or horovodrun (one per device; bench.catalog.registry.RunnerInfo).",
            record=False),
    Setting("model", str, help="The model (`models/<name>`).",
            key=Key("models", help="Built-in models by name (`run_bench.py list`) or your own "
                    "(a mapping: docs/MODELS.md).", axis=True)),
    Setting("num_devices", int, help="The device count N, over all nodes.",
            key=Key("devices", [1], "device counts; required with mode benchmark", axis=True,
                    minimum=1)),
    Setting("batch_size_per_device", int, help="The batch on each device in one step.",
            key=Key(default=None, help="weak scaling: global batch = this x devices; a "
                    "mapping of model name (or default) to it: each model's own", axis=True,
                    minimum=1)),
    Setting("global_batch_size", int, help="The batch over all devices in one step.",
            key=Key(default=None, help="strong scaling: a fixed global batch, divided by "
                    "every device count; a mapping of model name (or default) to it: each "
                    "model's own", axis=True, minimum=1)),
    Setting("scaling", str, help="weak (the batch per device is fixed) or strong (the global "
            "batch is fixed).", key=Key(default=None, choices=SCALING)),
    Setting("data", str, help="synthetic or real (the tables show the data label, which "
            "names a real-data run's loader workers).",
            key=Key(default=["synthetic"], axis=True, choices=DATA)),
    Setting("precision", str, help="fp32, tf32, bf16 or fp16 (mixed precision).",
            key=Key(default=["fp32"], axis=True, choices=PRECISIONS)),
    Setting("device", str, help="The device kind: cpu (N virtual CPU devices) or gpu.",
            key=Key(default="cpu", choices=DEVICES)),
    Setting("virtual_devices", bool, help="True when the devices are virtual CPU devices of "
            "one host: the harness and the strategies at work, not GPU scaling."),
    Setting("warmup_steps", int, help="Untimed steps before the timed window.",
            key=Key(default=5, minimum=0)),
    Setting("measure_steps", int, help="Timed steps.", key=Key(default=20, minimum=1)),
    Setting("repeat", int, help="The run's repeat number within its configuration, from 0.",
            key=Key("repeats", 1, "Runs of each configuration, each a fresh process (the summary "
                    "takes their median).", minimum=1, maximum=MAX_REPEATS), planned=True),
    Setting("timeout_s", float, help="Seconds the run may take; then its process group is "
            "killed (status timeout).", key=Key(default=600.0), record=False),
    Setting("options", dict[str, Any], {}, "The runner's options, defaults filled (the loader "
            "has a column `opt_<option>` each).", Key("runner_options"), planned=True),
    Setting("python", str | None, None, "The user's interpreter for the run "
            "(runner_options.<runner>.python), if they named one.", record=False),
    # the sweep's: the folder prepare-data wrote, the augmentation, the loader worker counts (an
    # axis of real-data and pipeline runs); a run's: one worker count
    Setting("dataset", dict[str, Any] | None, None, "A real-data run's prepared dataset: "
            "path, augmentation, workers.", Key(), planned=True),
    # benchmark trains the runners' models, pipeline times the input pipelines alone,
    # allreduce each family's own all-reduce alone (the communication probe)
    Setting("mode", str, "benchmark", "benchmark, pipeline (the input pipeline alone), "
            "allreduce (the all-reduce probe alone), capacity (the largest batch or depth that "
            "fits, found by probes that are benchmark runs), converge (train to a held-out "
            "accuracy: runners/converge.py) or equivalence.",
            Key(default=["benchmark"], axis=True, choices=MODES)),
    Setting("equivalence", dict[str, Any] | None, None, "The equivalence mode's probe inputs "
            "and output (runners.common.Spec.equivalence_inputs).", record=False),
    Setting("pipelines", str, None, "The input pipelines a sweep with mode pipeline times "
            "(contract/catalogs/*.py PIPELINES); none named: all.",
            Key(help="with mode pipeline; default: all", axis=True, empty_ok=True),
            spec=False),
    Setting("pipeline_steps", int, 200, "Timed batches of a pipeline run: many, so buffers "
            "that fill during warm-up (MXNet runs up to 16 batches ahead) are a small share of "
            "the window.", Key(minimum=1), spec=False),
    Setting("probes", str, None, "The all-reduce probes a sweep with mode allreduce times "
            "(contract/catalogs/*.py PROBES) at every device count of 2 or more, over buffers "
            "from 1 MiB to each model's gradient size (warmup_steps and measure_steps: the "
            "untimed and timed iterations per size); none named: all.",
            Key(help="with mode allreduce: the all-reduce probes (`run_bench.py list`); "
                "default: all", axis=True, empty_ok=True), spec=False),
    Setting("until_stable", dict[str, Any] | None, None, "Repeat a configuration beyond "
            "repeats until the CV of its images/sec is at most target_cv, or it has "
            "max_repeats runs; None: exactly repeats.", Key(), spec=False),
    Setting("telemetry", dict[str, Any] | None, None, "The parent's sampler settings (config "
            "key telemetry: GPU through NVML, host through psutil); None: the sampler is off.",
            Key(default={}), record=False, planned=True),
    Setting("num_nodes", int, 1, "The nodes the run spanned (config key nodes; 1 for a run "
            "on one machine); the tables' devices cell says 2x4 for 2 nodes of 4.",
            Key("nodes", [1], "nodes per run (an axis); devices then counts devices per node; "
                "more than one node needs cluster.backend: slurm", axis=True, minimum=1)),
    Setting("cluster", dict[str, Any], {}, "Where runs execute: this machine (backend local) "
            "or one SLURM job each (slurm).", Key(), spec=False),
    Setting("model_layers", int | None, None, "The layers of a built-in GPT's depth variant "
            "(capacity mode's scale: depth; models.spec_of builds it); null: the model's own.",
            planned=True),
    Setting("device_memory", int | None, None, "Capacity mode: the memory each device may "
            "hold (bytes; \"512MiB\", \"2GiB\" or an integer in the file), checked against "
            "the peak each probe's framework reports; required on cpu, on gpu the device's own "
            "limit (an out-of-memory error) applies and this one too where given.",
            Key(help="capacity mode: bytes per device, e.g. 512MiB or 2GiB (required on "
                "device cpu)"), spec=False),
    Setting("scale", str, "batch", "Capacity mode: what each search grows: batch (the batch "
            "per device) or depth (the layers of a built-in GPT at batch_size_per_device).",
            Key(choices=SCALES), spec=False),
    Setting("capacity", dict[str, Any], {}, "Capacity mode's search: start (the first value "
            "probed), max (the largest), resolution (bisection stops once the first misfit is "
            "within it of the largest fit; 1: exact).", Key(), spec=False),
    Setting("converge", dict[str, Any] | None, None, "Mode converge's training recipe, every "
            "key filled (target_accuracy, max_epochs, optimizer, momentum, weight_decay, "
            "base_lr, reference_batch, lr_scaling, warmup_epochs, schedule, poly_power, "
            "step_epochs, step_gamma, last_batch, augmentation, seed: runners/converge.py); "
            "null in the other modes.", Key(default={}), planned=True),
    Setting("custom_model", dict[str, Any] | None, None, "A user's own model: the sweep file's "
            "`models:` entry of this run's model (framework, build, absolute path, args, input;"
            " models/custom.py), null for a built-in model.", planned=True),
)

# The Spec's fields (the spec JSON's keys) in the order they had before SETTINGS declared them,
# so spec files stay byte for byte the same; a field not named here follows them, in SETTINGS'
# order (and a dataclass puts the fields without a default first).
SPEC_ORDER = (
    "run_id", "sweep_id", "runner", "family", "module", "model", "num_devices", "device",
    "virtual_devices", "scaling", "batch_size_per_device", "global_batch_size", "data",
    "precision", "warmup_steps", "measure_steps", "repeat", "timeout_s", "options", "python",
    "mode", "launcher", "dataset", "equivalence", "telemetry", "num_nodes", "custom_model",
    "model_layers", "converge",
)


def in_order(names: list[str] | tuple[str, ...], first: tuple[str, ...]) -> list[str]:
    """names with those in `first` first, in its order, then the rest as they come."""
    place = {n: i for i, n in enumerate(first)}
    return sorted(names, key=lambda n: place.get(n, len(place)))


def setting(name: str) -> Setting:
    """The setting of a name (KeyError if none)."""
    for s in SETTINGS:
        if s.name == name:
            return s
    raise KeyError(name)


def config_settings() -> tuple[Setting, ...]:
    """The settings a sweep file gives, in its key order."""
    return tuple(s for s in SETTINGS if s.key is not None)


def spec_settings() -> tuple[Setting, ...]:
    """The Spec's fields, in its order: SPEC_ORDER, then SETTINGS' order, those without a
    default first."""
    specs = {s.name: s for s in SETTINGS if s.spec}
    ordered = [specs[n] for n in in_order(list(specs), SPEC_ORDER)]
    return tuple(sorted(ordered, key=lambda s: s.default is not REQUIRED))


def recorded() -> tuple[str, ...]:
    """The spec fields a run's record holds (bench/records/columns.py's view spec)."""
    return tuple(s.name for s in spec_settings() if s.recorded)


def copied() -> tuple[Setting, ...]:
    """The spec fields every run takes from the config as they are (bench/plan/runs.py)."""
    return tuple(s for s in spec_settings() if s.copied)
