"""Expand a sweep into one RunSpec per run (the matrix, in a stable order)."""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from bench.registry import COMMON_OPTIONS, RUNNERS

if TYPE_CHECKING:
    from bench.config import SweepConfig


@dataclass(frozen=True)
class RunSpec:
    """Everything one run needs; serialised to JSON for the child."""

    run_id: str
    sweep_id: str
    runner: str
    family: str
    module: str
    model: str
    num_devices: int
    device: str
    virtual_devices: bool
    scaling: str
    batch_size_per_device: int
    global_batch_size: int
    data: str
    precision: str
    warmup_steps: int
    measure_steps: int
    repeat: int
    timeout_s: float
    options: dict[str, Any] = field(default_factory=dict)  # the runner's own options
    python: str | None = None  # the user's interpreter, if they named one
    mode: str = "benchmark"  # or "equivalence"
    launcher: str = "python"  # see RunnerInfo.launcher
    dataset: dict[str, Any] | None = None  # the prepared dataset of a data: real run
    equivalence: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def group_key(self) -> tuple[Any, ...]:
        """Runs that differ only in device count (and repeat) share this key."""
        batch = self.batch_size_per_device if self.scaling == "weak" else self.global_batch_size
        return (self.runner, self.model, self.data, self.precision, self.scaling, batch,
                self.device)


def make_run_id(runner: str, model: str, n: int, scaling: str, batch: int, data: str,
                precision: str, repeat: int) -> str:
    """A stable, readable id: the same run gets the same id in every sweep (for --resume)."""
    b = f"b{batch}" if scaling == "weak" else f"gb{batch}"
    return f"{runner}__{model}__n{n}__{b}__{data}__{precision}__r{repeat}"


def expand(cfg: SweepConfig, sweep_id: str) -> list[RunSpec]:
    """The sweep's runs: runners x models x data x precision x batch x devices x repeats."""
    runs = []
    for runner, model, data, precision, batch, n, repeat in itertools.product(
        cfg.runners, cfg.models, cfg.data, cfg.precision, cfg.batch_sizes, cfg.devices,
        range(cfg.repeats),
    ):
        info = RUNNERS[runner]
        opts = dict(cfg.runner_options.get(runner, {}))
        python = opts.get("python")
        for name in COMMON_OPTIONS:
            opts.pop(name, None)
        per_device = batch if cfg.scaling == "weak" else batch // n
        runs.append(RunSpec(
            run_id=make_run_id(runner, model, n, cfg.scaling, batch, data, precision, repeat),
            sweep_id=sweep_id,
            runner=runner,
            family=info.family,
            module=info.module,
            model=model,
            num_devices=n,
            device=cfg.device,
            virtual_devices=cfg.device == "cpu",
            scaling=cfg.scaling,
            batch_size_per_device=per_device,
            global_batch_size=per_device * n,
            data=data,
            precision=precision,
            warmup_steps=cfg.warmup_steps,
            measure_steps=cfg.measure_steps,
            repeat=repeat,
            timeout_s=cfg.timeout_s,
            options=opts,
            python=python,
            launcher=info.launcher,
            dataset=cfg.dataset if data == "real" else None,
        ))
    return runs
