"""How a runner is described to the parent, without importing it: Option, RunnerInfo, Family,
the options several families share, and the harness's own pipeline. Each family's runners are
listed in contract/catalogs/<family>.py; bench.catalog.registry collects them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class _SameAsDefault:
    """Option.gpu_default's own default: on GPUs too, the option's default."""

    def __repr__(self) -> str:
        return "SAME_AS_DEFAULT"


SAME_AS_DEFAULT: Any = _SameAsDefault()


@dataclass(frozen=True)
class Option:
    """One runner option: its type, default, and (optionally) the values allowed.
    `gpu_default` is its default in a run on device gpu, where the fastest setting there is
    not the CPU's (a value the config gives wins on both). A number (int or float) without
    `allowed` gives its range, `minimum` to `maximum` (bench/plan/config.py checks it and puts
    it in the JSON Schema; tests/test_bounded_input.py checks every runner's give one).
    `needs` (option, value): a value other than the default is used only where that option of
    the runner has that value; the config refuses it elsewhere (bench/plan/config/rules.py)."""

    type: type | tuple[type, ...]
    default: Any
    allowed: tuple[Any, ...] | None = None
    help: str = ""
    gpu_default: Any = SAME_AS_DEFAULT
    minimum: int | float | None = None
    maximum: int | float | None = None
    needs: tuple[str, Any] | None = None

    def default_on(self, device: str) -> Any:
        """The default of a run on `device` ("cpu" | "gpu")."""
        if device == "gpu" and self.gpu_default is not SAME_AS_DEFAULT:
            return self.gpu_default
        return self.default

    @property
    def has_gpu_default(self) -> bool:
        return self.gpu_default is not SAME_AS_DEFAULT

    @property
    def takes_list(self) -> bool:
        """Its own value is a list: a list given to it is that value, never an option axis
        (bench/plan/config.py)."""
        types = self.type if isinstance(self.type, tuple) else (self.type,)
        return any(t is list or getattr(t, "__origin__", None) is list for t in types)


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
    # Option sets that change the reduction or placement only on GPUs (on virtual CPU devices
    # they name the same device, or need a GPU kernel): (options, why), listed as "GPU only"
    # in the coverage table (docs/EQUIVALENCE.md), never counted as run here.
    equivalence_gpu_only: tuple[tuple[dict[str, Any], str], ...] = ()
    # How the parent starts the run: "python" (one process), "torchrun" (one process per
    # device, torch.distributed.run) or "horovodrun" (one per device, over gloo).
    launcher: str = "python"
    unavailable: str | None = None  # why this runner can never run here (list shows it)
    # How a run spans several nodes (config key nodes > 1), in the framework's own words
    # ("torchrun, c10d rendezvous"); None: single-machine by design, planned invalid.
    multi_node: str | None = None
    # Why a multi_node runner cannot cross nodes here although it could by design (planned
    # unavailable with this reason before anything is launched).
    multi_node_unavailable: str | None = None
    # The model workloads it builds (models.ModelSpec.workload): "cnn" (the 2017 CNNs of
    # models/), "transformer" (gpt2, vit_b16 and their tiny versions); a run of another is
    # planned unavailable, saying so.
    workloads: tuple[str, ...] = ("cnn",)
    # The frameworks of a user's own model (a `models:` entry's framework) it takes; () none.
    custom_models: tuple[str, ...] = ()
    # Why it takes no transformer (a 2017 system: "not of its era"); None: the plain reason.
    era: str | None = None
    # What the strategy shards over the devices (the rest is replicated): a tuple of
    # "params", "grads", "optimizer" (() for plain data parallelism), or one that an option
    # decides: {"option": name, "values": {value: tuple}}. The parent holds each 2+ device
    # record's state_bytes_per_device (read from the framework's shards) to it
    # (bench/run/verdict.py); expected_shards gives it for a run's options.
    shards: Any = ()
    # Its strategy's collectives per step (contract/communication.StepCollectives), or, as in
    # `shards`, ones an option decides: {"option": name, "values": {value: StepCollectives}}.
    # bench/analysis/strategies.py prices them (predict --strategies); None: not priced there.
    collectives: Any = None
    # The probe (a PROBES name, mode allreduce) measuring the collectives it runs: the forecast
    # prices its collectives on that probe's links.
    probe: str | None = None
    # Whether it trains to a held-out accuracy (mode converge, runners/converge.py); where it
    # does not, `no_converge` says why (the dry run shows it, the run is planned unavailable).
    converges: bool = False
    no_converge: str = ""
    # What the parent can check before a launch on this host, without a framework (a
    # checkout the runner needs, a model it cannot map): called with the run's spec, it
    # returns why the run cannot go (planned unavailable, in the dry run too) or None.
    launch_check: Any = None


def deciding_option(info: RunnerInfo, declared: Any,
                    options: dict[str, Any]) -> tuple[str, Any] | None:
    """The option (name, value) that decides a declaration of `info` (its `shards`, its
    `collectives`: {"option": name, "values": {...}}) in a run with these options, the
    value its default where not given; None where no option decides it."""
    if not isinstance(declared, dict):
        return None
    name = declared["option"]
    return name, options.get(name, info.options[name].default if name in info.options else None)


def for_options(info: RunnerInfo, declared: Any, options: dict[str, Any]) -> Any:
    """What `info` declares for a run with these options: the declaration itself, or the
    entry of the deciding option's value (None for a value not listed)."""
    option = deciding_option(info, declared, options)
    return declared if option is None else declared["values"].get(option[1])


def expected_shards(info: RunnerInfo, options: dict[str, Any]) -> tuple[str, ...]:
    """The parts of the model state `info`'s strategy shards in a run with these options."""
    return tuple(for_options(info, info.shards, options) or ())


# Why a sharded strategy (ZeRO, FSDP) is not run in mode converge
SHARDED_NO_CONVERGE = ("a sharded strategy, not wired to the converge recipe: its updates are "
                       "data parallelism's (the same global-batch gradient), so time to "
                       "accuracy is torch_ddp's or jax_native's figure plus its own step time")

DATA_FORMAT_OPTION = Option(str, "channels_last", ("channels_last", "channels_first"),
                            "tensor layout")
LOADER_OPTION = Option(str, "framework", ("framework", "keras"),
                       "real data: the framework's fast pipeline, or the Keras-idiomatic "
                       "Sequence/PyDataset a Keras user writes (runners/keras_data.py)")

# Input pipelines measured on their own (mode: pipeline): decode, augment, batch; no model.
# Family "harness" is the harness's own interpreter (numpy and Pillow, no framework).
PIPELINES: list[RunnerInfo] = [
    RunnerInfo("pil_loop", "harness", "runners.pipeline_pil",
               "the naive baseline: one Python process, Pillow decode, numpy crop/flip, "
               "workers ignored", equivalence=False),
]
