"""Expand a sweep into one RunSpec per run (the matrix, in a stable order)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from bench.catalog.registry import (
    BASELINE_PIPELINE,
    COMMON_OPTIONS,
    PIPELINES,
    PROBES,
    RUNNERS,
    resolved_options,
)
from bench.records import grouping
from contract import settings
from contract.spec import Spec

if TYPE_CHECKING:
    from bench.plan.config import SweepConfig


@dataclass(frozen=True)
class RunSpec(Spec):
    """Everything one run needs (the fields are the child's runners.common.Spec: one
    definition for both sides), with the parent's views of it; serialised to JSON for the
    child. The runner's options are resolved here, over the registry's defaults."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", run_options(self.runner, self.device, self.options))

    @property
    def group_key(self) -> tuple[Any, ...]:
        """Runs that differ only in device count (and repeat) share this key
        (bench.records.grouping:
        the same key the summary and the loader group records on)."""
        return grouping.group_key(self)

    @property
    def variant(self) -> dict[str, Any]:
        """The options this run's configuration varies in (an option axis of the sweep), by
        name, as its run id names them; {} where none varies."""
        return grouping.variant_of_id(self.run_id, self.options)

    @property
    def data_label(self) -> str:
        """synthetic, or real-w<loader workers> (real runs differ by their worker count)."""
        return grouping.data_label(self)


def run_options(runner: str, device: str, given: dict[str, Any]) -> dict[str, Any]:
    """A run's options: `given` (the config's, every option of the runner once the config
    resolved them) over the runner's defaults on the run's device (an Option's gpu_default on
    device gpu, contract/catalog.py): a value given always wins."""
    options = resolved_options(runner, given)
    info = RUNNERS.get(runner)
    if info is not None:
        options.update({k: o.default_on(device) for k, o in info.options.items()
                        if k not in given})
    return options


@dataclass(frozen=True)
class Cell:
    """One run's place in the plan's matrix: a runner with one combination of its options, a
    model, data, precision, batch, device count and repeat; its run id names them."""

    runner: str
    model: str | dict[str, Any]  # a built-in's name, or a user's entry (config validated it)
    devices: int  # over all nodes
    batch: int  # as the sweep gives it: per device (weak scaling) or global (strong)
    precision: str = "fp32"
    repeat: int = 0
    data: str = "synthetic"
    dataset: dict[str, Any] | None = None  # real data: the prepared dataset, its worker count
    nodes: int = 1
    options: dict[str, Any] = field(default_factory=dict)
    variant: dict[str, Any] = field(default_factory=dict)  # the options of an option axis

    @property
    def label(self) -> str:
        """The data as the run id names it: synthetic, or real-w<loader workers>."""
        return f"real-w{self.dataset['workers']}" if self.dataset else self.data


def make_run_id(cell: Cell, scaling: str = "weak", mode: str = "benchmark") -> str:
    """A stable, readable id: the same run gets the same id in every sweep (for --resume).
    The cell's devices count those of all nodes; a multi-node run says nodes x devices per
    node. The options of an option axis (variant) follow the precision as <option>-<value>
    (grouping.variant_part; RunSpec.variant reads them back); none without one."""
    model, n, batch, repeat = _model(cell.model)[0], cell.devices, cell.batch, cell.repeat
    if mode == "pipeline":
        return f"pipeline__{cell.runner}__{model}__b{batch}__{cell.label}__r{repeat}"
    if mode == "allreduce":
        return f"allreduce__{cell.runner}__{model}__n{n}__r{repeat}"
    if mode == "converge":
        return CONVERGE_PREFIX + make_run_id(cell, scaling)
    b = f"b{batch}" if scaling == "weak" else f"gb{batch}"
    where = f"n{n}" if cell.nodes == 1 else f"{cell.nodes}x{n // cell.nodes}"
    varies = "".join(f"__{grouping.variant_part(k, v)}" for k, v in cell.variant.items())
    return f"{cell.runner}__{model}__{where}__{b}__{cell.label}__{cell.precision}{varies}" \
        f"__r{repeat}"


def option_variants(runner: str, given: dict[str, Any]) -> list[tuple[dict[str, Any],
                                                                      dict[str, Any]]]:
    """A runner's option combinations, as (the run's options, its variant): one per value of
    each option axis (bench.plan.config validated a list given to an option whose own type is
    no list as one, of two or more values), their product in the axes' order and each axis's;
    [(given, {})] without one. COMMON_OPTIONS (python) are left out: the launcher's."""
    opts = {k: v for k, v in given.items() if k not in COMMON_OPTIONS}
    known = RUNNERS[runner].options if runner in RUNNERS else {}
    axes = {k: v for k, v in opts.items()
            if isinstance(v, list) and not (k in known and known[k].takes_list)}
    out = []
    for values in itertools.product(*axes.values()):
        variant = dict(zip(axes, values, strict=True))
        out.append(({**opts, **variant}, variant))
    return out


def _datasets(cfg: SweepConfig, data: str) -> list[dict[str, Any] | None]:
    """One dataset mapping per loader worker count for real data; [None] for synthetic."""
    if data != "real" or cfg.dataset is None:
        return [None]
    return [{**cfg.dataset, "workers": w} for w in cfg.dataset["workers"]]


def expand(cfg: SweepConfig, sweep_id: str) -> list[RunSpec]:
    """The sweep's runs: with mode capacity each search's first probe (expand_capacity);
    otherwise pipeline runs (pipelines x models x batch x workers x repeats) first,
    then all-reduce probe runs (repeats x probes x models x device counts of 2 or more), then
    benchmark runs (repeats x runners x option variants x models x data x workers x precision
    x batch x nodes x devices per node; option_variants). Repeats are the outer loop, so the
    runners' repeats interleave: a slow spell of the machine falls on every runner alike
    instead of on all repeats of one."""
    if "capacity" in cfg.mode:  # alone (bench.plan.config): each search's first probe
        return expand_capacity(cfg, sweep_id)
    if "converge" in cfg.mode:  # alone, as capacity
        return expand_converge(cfg, sweep_id)
    runs = expand_pipelines(cfg, sweep_id) if "pipeline" in cfg.mode else []
    if "allreduce" in cfg.mode:
        runs += expand_probes(cfg, sweep_id)
    if "benchmark" not in cfg.mode:
        return runs
    for repeat, (runner, opts, variant), model, data, precision, batch, nodes, per_node in \
            _matrix(cfg, range(cfg.repeats), _strategies(cfg), MODELS, cfg.data,
                    cfg.precision, BATCHES, cfg.nodes, cfg.devices):
        for dataset in _datasets(cfg, data):
            runs.append(_benchmark_run(cfg, sweep_id, Cell(
                runner, model, nodes * per_node, batch, precision=precision, repeat=repeat,
                data=data, dataset=dataset, nodes=nodes, options=opts, variant=variant)))
    return runs


def _strategies(cfg: SweepConfig) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(runner, its options, their variant): each runner of the sweep with each combination
    of its options (option_variants)."""
    return [(runner, opts, variant) for runner in cfg.runners
            for opts, variant in option_variants(runner, cfg.runner_options.get(runner, {}))]


MODELS, BATCHES = object(), object()  # _matrix's axes of the models and of their batches


def _matrix(cfg: SweepConfig, *axes: Any,
            batches: Callable[[str], list[int]] | None = None) -> Iterator[tuple[Any, ...]]:
    """itertools.product(*axes), MODELS standing for cfg.models and BATCHES (an axis after
    it) for the batches of the tuple's model (`batches`, by model name; default: the sweep's,
    SweepConfig.batches_of): each model's in their order. Where every model has the same
    batches, the product over them, in its order."""
    own = batches or cfg.batches_of
    lists = [own(_model(m)[0]) for m in cfg.models]
    at_model, at_batch = axes.index(MODELS), axes.index(BATCHES)
    grid = [range(len(cfg.models)) if a is MODELS else
            range(max(map(len, lists), default=0)) if a is BATCHES else a for a in axes]
    for combo in itertools.product(*grid):
        mine = lists[combo[at_model]]
        if combo[at_batch] < len(mine):
            yield tuple(cfg.models[v] if k == at_model else mine[v] if k == at_batch else v
                        for k, v in enumerate(combo))


def _model(model: str | dict[str, Any]) -> tuple[str, dict[str, Any] | None]:
    """(name, the run's custom_model) of a `models:` value: a built-in's name, or a user's
    entry (bench.plan.config validated it, its path absolute)."""
    return (model, None) if isinstance(model, str) else (model["name"], dict(model))


def expand_pipelines(cfg: SweepConfig, sweep_id: str) -> list[RunSpec]:
    """Pipeline-mode runs: each input pipeline alone, at every loader worker count (the naive
    baseline once, with none)."""
    assert cfg.dataset is not None  # config validation requires it in pipeline mode
    runs = []
    for name, model, batch, repeat in _matrix(
        cfg, cfg.pipelines, MODELS, BATCHES, range(cfg.repeats),
    ):
        info = PIPELINES[name]
        for workers in [0] if name == BASELINE_PIPELINE else cfg.dataset["workers"]:
            dataset = {**cfg.dataset, "workers": workers}
            cell = Cell(name, model, 1, batch, repeat=repeat, data="real", dataset=dataset)
            runs.append(_run(
                cfg,
                run_id=make_run_id(cell, mode="pipeline"),
                sweep_id=sweep_id, runner=name, family=info.family, module=info.module,
                model=model, num_devices=1, virtual_devices=False, scaling="weak",
                batch_size_per_device=batch, global_batch_size=batch, data="real",
                precision="fp32", measure_steps=cfg.pipeline_steps, repeat=repeat,
                mode="pipeline", dataset=dataset,
            ))
    return runs


def expand_probes(cfg: SweepConfig, sweep_id: str) -> list[RunSpec]:
    """All-reduce probe runs (mode allreduce): each probe at every model's buffer sizes (the
    model sets the largest: its gradient bytes) and every device count of 2 or more (one
    device has nothing to reduce), repeats outermost. No batch, no precision: float32
    buffers."""
    runs = []
    for repeat, name, model, n in itertools.product(
        range(cfg.repeats), cfg.probes, cfg.models, [d for d in cfg.devices if d >= 2],
    ):
        info = PROBES[name]
        runs.append(_run(
            cfg,
            run_id=make_run_id(Cell(name, model, n, 0, repeat=repeat), mode="allreduce"),
            sweep_id=sweep_id, runner=name, family=info.family, module=info.module,
            model=model, num_devices=n, virtual_devices=cfg.device == "cpu", scaling="weak",
            batch_size_per_device=0, global_batch_size=0, data="synthetic", precision="fp32",
            repeat=repeat, mode="allreduce", launcher=info.launcher,
        ))
    return runs


def expand_capacity(cfg: SweepConfig, sweep_id: str) -> list[RunSpec]:
    """Capacity mode's searches, each as its first probe (bench/run/capacity.py makes the
    others from it, `capacity_probe`): runners x option variants x models x precision x batch
    (scale depth: the batch each probe trains at) x devices. A probe is a benchmark run at
    the search's value: the batch per device (scale batch) or the layers of the GPT (scale
    depth, model_layers)."""
    runs = []
    start = [cfg.capacity["start"]]
    for (runner, opts, variant), model, precision, batch, n in _matrix(
            cfg, _strategies(cfg), MODELS, cfg.precision, BATCHES, cfg.devices,
            batches=None if cfg.scale == "depth" else lambda model: start):
        # weak scaling (config's rule for mode capacity): the batch is per device
        run = _benchmark_run(cfg, sweep_id, Cell(runner, model, n, batch, precision=precision,
                                                 options=opts, variant=variant))
        runs.append(capacity_probe(run, cfg.scale, cfg.capacity["start"]))
    return runs


CONVERGE_PREFIX = "converge__"


def expand_converge(cfg: SweepConfig, sweep_id: str) -> list[RunSpec]:
    """Mode converge's runs (repeats x runners x option variants x models x precision x batch x
    nodes x devices per node, as benchmark runs): each trains on the dataset's training split
    to the recipe's target (runners/converge.py), its data `real` from the splits in memory
    (no loader workers: the label real-w0), the recipe in its spec."""
    assert cfg.dataset is not None  # config validation requires it in converge mode
    # the splits in memory: no loader workers; converge.augmentation is the one applied
    dataset = {"path": cfg.dataset["path"], "augmentation": "none", "workers": 0}
    assert cfg.converge is not None  # mode converge's recipe (config fills every key)
    runs = []
    for repeat, (runner, opts, variant), model, precision, batch, nodes, per_node in \
            _matrix(cfg, range(cfg.repeats), _strategies(cfg), MODELS, cfg.precision,
                    BATCHES, cfg.nodes, cfg.devices):
        cell = Cell(runner, model, nodes * per_node, batch, precision=precision, repeat=repeat,
                    data="real", dataset=dataset, nodes=nodes, options=opts, variant=variant)
        run = _benchmark_run(cfg, sweep_id, cell)
        runs.append(replace(run, mode="converge", converge=repeat_recipe(cfg.converge, repeat),
                            run_id=make_run_id(cell, cfg.scaling, mode="converge")))
    return runs


def repeat_recipe(recipe: Mapping[str, Any], repeat: int) -> dict[str, Any]:
    """The converge recipe of repeat `repeat`: its seed the recipe's plus the repeat, so that
    repeats differ in initial weights, batch order and augmentation (MLPerf: seeds differ
    between runs) while the configurations of one repeat share theirs; modulo 2^32, the
    config's bound."""
    return {**recipe, "seed": (recipe["seed"] + repeat) % 2**32}


CAPACITY_PREFIX = "capacity__"


def is_capacity_probe(run: RunSpec) -> bool:
    """Whether the run is a capacity search's probe (its id is the search's)."""
    return run.run_id.startswith(CAPACITY_PREFIX)


def search_id(run: RunSpec, scale: str) -> str:
    """A capacity search's id: its probes' runner, model, devices, precision (and for scale
    depth the batch), the options of an option axis (as in make_run_id), what it grows."""
    fixed = f"__b{run.batch_size_per_device}" if scale == "depth" else ""
    varies = "".join(f"__{grouping.variant_part(k, v)}" for k, v in run.variant.items())
    return (f"{CAPACITY_PREFIX}{run.runner}__{run.model}__n{run.num_devices}__{run.precision}"
            f"{fixed}{varies}__{scale}")


def capacity_probe(run: RunSpec, scale: str, value: int) -> RunSpec:
    """The search's probe at `value`: run at that batch per device (scale batch) or with that
    many layers (scale depth), its run id the search's with the value."""
    if scale == "depth":
        probe = replace(run, model_layers=value)
    else:
        probe = replace(run, batch_size_per_device=value,
                        global_batch_size=value * run.num_devices)
    return replace(probe, run_id=f"{search_id(probe, scale)}{value}")


def _benchmark_run(cfg: SweepConfig, sweep_id: str, cell: Cell) -> RunSpec:
    """The benchmark run of a cell of the matrix (also a capacity probe's and a converge run's
    first form): its batch per device from the sweep's scaling."""
    info = RUNNERS[cell.runner]
    model, custom = _model(cell.model)
    n = cell.devices
    per_device = cell.batch if cfg.scaling == "weak" else cell.batch // n
    return _run(
        cfg,
        run_id=make_run_id(cell, cfg.scaling),
        sweep_id=sweep_id,
        runner=cell.runner,
        family=info.family,
        module=info.module,
        model=model,
        num_devices=n,
        virtual_devices=cfg.device == "cpu",
        batch_size_per_device=per_device,
        global_batch_size=per_device * n,
        data=cell.data,
        precision=cell.precision,
        repeat=cell.repeat,
        options=cell.options,
        python=cfg.runner_options.get(cell.runner, {}).get("python"),
        launcher=info.launcher,
        dataset=cell.dataset,
        num_nodes=cell.nodes,
        custom_model=custom,
    )


def _run(cfg: SweepConfig, **fields: Any) -> RunSpec:
    """A run of the sweep: `fields` over the settings every run takes from the config as it
    gives them (contract/settings.py: device, scaling, warmup_steps, ...) and its telemetry."""
    copied = {s.name: getattr(cfg, s.key_name) for s in settings.copied()}
    return RunSpec(**{**copied, "telemetry": _telemetry(cfg), **fields})


def _telemetry(cfg: SweepConfig) -> dict[str, Any] | None:
    assert cfg.telemetry is not None  # the config's mapping (its default: {})
    return dict(cfg.telemetry) if cfg.telemetry.get("enabled", True) else None


def config_id(run_id: str) -> str:
    """A run id without its repeat: the runs of one configuration share it."""
    return run_id.rsplit("__r", 1)[0]


def another_repeat(spec: RunSpec, repeat: int) -> RunSpec:
    """The same run as spec, as repeat number `repeat` (an extra until_stable run; a converge
    run's seed moves with its repeat, as repeat_recipe gives it)."""
    converge = spec.converge and repeat_recipe(spec.converge, repeat - spec.repeat)
    return replace(spec, repeat=repeat, run_id=f"{config_id(spec.run_id)}__r{repeat}",
                   converge=converge)
