"""SweepConfig, a validated sweep, written out: one field per key of the sweep file (an axis: a
list), both batch keys as batch_sizes (one list, or a mapping of model name to its own).
`sweep_fields()` derives the same fields from contract/settings.py; tests/test_settings.py
holds the two equal. Stdlib and contract only."""

from dataclasses import asdict, dataclass
from types import GenericAlias
from typing import Any

from contract import settings

# the top-level keys, in the order of the model's fields (the schema's properties)
KEYS = tuple(s.key_name for s in settings.config_settings())
# both batch keys resolve to one SweepConfig field, batch_sizes (scaling says which it holds)
BATCH_KEYS = ("batch_size_per_device", "global_batch_size")
# SweepConfig's fields (config.yaml's keys) in the order they had before contract/settings.py
# declared them; a key not named here follows them, in declaration order
SWEEP_ORDER = (
    "name", "runners", "models", "devices", "scaling", "batch_sizes", "data", "precision",
    "device", "warmup_steps", "measure_steps", "repeats", "timeout_s", "runner_options",
    "description", "dataset", "mode", "pipelines", "pipeline_steps", "probes", "until_stable",
    "telemetry", "nodes", "cluster",
)


def sweep_fields() -> list[tuple[str, Any]]:
    """SweepConfig's fields as the declaration gives them, (name, type) in order: one per key
    of the sweep file (an axis: a list), the batch keys as batch_sizes."""
    types: dict[str, Any] = {
        s.key_name: GenericAlias(list, s.type) if s.key and s.key.axis else s.type
        for s in settings.config_settings() if s.key_name not in BATCH_KEYS}
    # per device (weak) or global (strong): one list for every model, or each model's
    types["batch_sizes"] = list[int] | dict[str, list[int]]
    return [(name, types[name]) for name in settings.in_order(list(types), SWEEP_ORDER)]


@dataclass
class SweepConfig:
    """A validated sweep: the matrix and the settings shared by every run."""

    name: str
    runners: list[str]
    models: list[str]
    devices: list[int]
    scaling: str
    batch_sizes: list[int] | dict[str, list[int]]
    data: list[str]
    precision: list[str]
    device: str
    warmup_steps: int
    measure_steps: int
    repeats: int
    timeout_s: float
    runner_options: dict[str, Any]
    description: str
    dataset: dict[str, Any] | None
    mode: list[str]
    pipelines: list[str]
    pipeline_steps: int
    probes: list[str]
    until_stable: dict[str, Any] | None
    telemetry: dict[str, Any] | None
    nodes: list[int]
    cluster: dict[str, Any]
    device_memory: int | None
    scale: str
    capacity: dict[str, Any]
    converge: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        """The resolved config in the user's key names (it loads back unchanged)."""
        d = asdict(self)
        batch_key = "batch_size_per_device" if self.scaling == "weak" else "global_batch_size"
        batch_sizes = d.pop("batch_sizes")
        if batch_sizes:  # an all-reduce-only sweep has no batch
            d[batch_key] = batch_sizes
        return d

    def batches_of(self, model: str) -> list[int]:
        """The batch sizes of a model of the sweep (by its name)."""
        return self.batch_sizes[model] if isinstance(self.batch_sizes, dict) \
            else self.batch_sizes
