"""The run's spec as both sides read it: the frozen `Spec`, the two refusals a runner raises
(`Unavailable`, `Invalid`) and the batch split. Stdlib and numpy only: the parent's RunSpec
subclasses Spec, the child reads it from JSON."""

from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np


class Unavailable(RuntimeError):
    """This run cannot happen here (missing GPU, package, checkout); the message says why."""


class Invalid(RuntimeError):
    """The run happened but its numbers cannot be trusted; the message says why."""


@dataclass(frozen=True)
class Spec:
    """Everything one run needs, as the parent resolved it; the child reads it from JSON.
    Its fields are the spec settings of contract/settings.py (names, types, defaults) in the
    spec JSON's order (settings.spec_settings()); tests/test_settings.py holds them equal."""

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
    options: dict[str, Any] = field(default_factory=dict)
    python: str | None = None
    mode: str = "benchmark"
    launcher: str = "python"
    dataset: dict[str, Any] | None = None
    equivalence: dict[str, Any] | None = None
    telemetry: dict[str, Any] | None = None
    num_nodes: int = 1
    custom_model: dict[str, Any] | None = None
    model_layers: int | None = None
    converge: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def devices_per_node(self) -> int:
        """The devices each node drives (config key devices); num_devices is over all nodes."""
        return self.num_devices // self.num_nodes

    def split_batch(self, n: int, over: str = "devices", rows: int | None = None) -> int:
        """The rows each of n devices (ranks, contexts, replicas: `over`) gets of the global
        batch, or of `rows` (the equivalence batch); Invalid when they cannot all get the
        same."""
        if rows is None:
            return rows_per_device(self.global_batch_size, n, over)
        return rows_per_device(rows, n, over, "equivalence batch")

    def equivalence_inputs(self) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray,
                                          float]:
        """The equivalence test's initial weights (canonical names), batch x, labels y, lr."""
        eq = self.equivalence or {}
        with np.load(eq["inputs"]) as data:
            weights = {k[2:]: data[k] for k in data.files if k.startswith("w:")}
            return weights, data["x"], data["y"], float(eq["learning_rate"])

    def save_equivalence_output(self, weights: dict[str, np.ndarray]) -> None:
        """Write the weights after the equivalence step, under their canonical names."""
        arrays: dict[str, Any] = {f"w:{k}": np.asarray(v) for k, v in weights.items()}
        np.savez((self.equivalence or {})["output"], **arrays)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Spec":
        """The spec the parent wrote; a key it does not know is the parent's bug, said so."""
        known = {f.name for f in fields(Spec)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TypeError(f"spec has keys the runner contract does not know: {unknown}")
        return Spec(**data)


def spec_for(**fields: Any) -> Spec:
    """A Spec with placeholder identity and matrix fields under `fields`: for checks and tools
    that call a runner's functions outside a sweep (a sweep's specs come from bench.plan.runs)."""
    base: dict[str, Any] = {
        "run_id": "check", "sweep_id": "check", "runner": "check", "family": "check",
        "module": "check", "model": "minigooglenet", "num_devices": 1, "device": "cpu",
        "virtual_devices": True, "scaling": "weak", "batch_size_per_device": 8,
        "global_batch_size": 8, "data": "synthetic", "precision": "fp32", "warmup_steps": 1,
        "measure_steps": 1, "repeat": 0, "timeout_s": 600.0}
    return Spec.from_dict({**base, **fields})


def rows_per_device(batch: int, n: int, over: str = "devices", kind: str = "global batch"
                    ) -> int:
    """The rows each of n devices (ranks, contexts, replicas: `over`) gets of a batch;
    Invalid when they cannot all get the same."""
    if batch % n:
        raise Invalid(f"{kind} {batch} does not divide by {n} {over}")
    return batch // n


