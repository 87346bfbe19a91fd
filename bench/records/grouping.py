"""What a configuration is: the one definition of the grouping key.

Runs that differ only in their device and node counts and repeat are one configuration (runs
of an option axis, `runner_options.<runner>.<option>: [a, b]`, differ in their variant: the
options that vary, and are never one); the
runs of a configuration at one device count on one node count are a row of the summary, and
its 1-device, 1-node row is the speedup baseline of the others. bench.plan.runs
(RunSpec.group_key), bench.analysis.stats (summary, speedup, real vs synthetic) and
bench.analysis.loader (the
notebooks' frame) all read it from here.

A key can be read from a record (a dict from runs/<run>.json), a summary row (a dict from
bench.analysis.stats.summarise) or a RunSpec: every field is read by the function in READERS.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

SYNTHETIC = "synthetic"


def _get(obj: Any, name: str) -> Any:
    """A required field of a record or row (KeyError if missing) or a RunSpec's attribute."""
    return obj[name] if isinstance(obj, Mapping) else getattr(obj, name)


def label_of(data: str, dataset: Mapping[str, Any] | None) -> str:
    """synthetic, or real-w<loader workers>: real runs differ by their worker count."""
    return f"real-w{dataset['workers']}" if data == "real" and dataset else data


def data_label(obj: Any) -> str:
    """The data a run was fed, as label_of names it. A record or row that carries its
    data_label gives that one; records from before real data carry only data."""
    if isinstance(obj, Mapping):
        if obj.get("data_label"):
            return obj["data_label"]
        return label_of(obj["data"], obj.get("dataset"))
    return label_of(obj.data, obj.dataset)


def show_value(value: Any) -> str:
    """An option's value as the sweep file writes it: true, false, null, 3, channels_last."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return "null" if value is None else str(value)


def variant_part(name: str, value: Any) -> str:
    """An option's value in a run id: <option>-<value> (stage-3, reshard_after_forward-false),
    any character but letters, digits, . and - as _ and no __ (the ids' separator)."""
    text = re.sub(r"[^A-Za-z0-9.-]+", "_", show_value(value)).strip("_") or "_"
    return f"{name}-{text}"


def variant_of_id(run_id: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options a run id names (bench.plan.runs.make_run_id puts a varying option's
    variant_part right before its last part: the repeat, or a capacity search's scale), with
    their values from options; {} for a run of no option axis. The parts before them (the
    precision, a batch) have no `-`, so they never read as an option."""
    parts, found = run_id.split("__")[1:-1], []
    by_part = {variant_part(name, value): name for name, value in options.items()}
    for part in reversed(parts):
        if part not in by_part:
            break
        found.append(by_part[part])
    return {name: options[name] for name in reversed(found)}


def variant_label(variant: Mapping[str, Any] | str | None) -> str:
    """A variant as `stage=3` (options joined by spaces, in the sweep's order); "" for none."""
    if isinstance(variant, str):
        return variant
    return " ".join(f"{k}={show_value(v)}" for k, v in (variant or {}).items())


def variant_of(obj: Any) -> str:
    """The options a run's configuration varies in (an option axis) as variant_label says
    them: a record's or a row's `variant` ("" for records from before option axes), a
    RunSpec's from its id."""
    if isinstance(obj, Mapping):
        return variant_label(obj.get("variant"))
    return variant_label(obj.variant)


def runner_label(obj: Any) -> str:
    """The runner with its variant, the tables' and charts' name of a strategy: `deepspeed
    stage=3`; the runner alone where no option varies."""
    variant = variant_of(obj)
    return f"{_get(obj, 'runner')} {variant}" if variant else _get(obj, "runner")


def batch_of(obj: Any) -> int:
    """The batch held fixed across device counts: per device (weak scaling) or global."""
    return _get(obj, "batch_size_per_device" if _get(obj, "scaling") == "weak"
                else "global_batch_size")


def mode_of(obj: Any) -> str:
    """benchmark, pipeline or equivalence; records and rows without one are benchmark runs."""
    mode = obj.get("mode") if isinstance(obj, Mapping) else obj.mode
    return mode or "benchmark"


# The grouping key, field by field, each with how it is read.
READERS: dict[str, Callable[[Any], Any]] = {
    "runner": lambda o: _get(o, "runner"),
    "variant": variant_of,
    "model": lambda o: _get(o, "model"),
    "data_label": data_label,
    "precision": lambda o: _get(o, "precision"),
    "scaling": lambda o: _get(o, "scaling"),
    "batch": batch_of,
    "device": lambda o: _get(o, "device"),
    "mode": mode_of,
}
GROUP_FIELDS = tuple(READERS)
DATA_INDEX = GROUP_FIELDS.index("data_label")


def group_key(obj: Any) -> tuple[Any, ...]:
    """Runs that differ only in device count (and repeat) share this key."""
    return tuple(read(obj) for read in READERS.values())


def nodes_of(obj: Any) -> int:
    """The nodes a run spanned; records and rows from before multi-node runs had one."""
    nodes = obj.get("num_nodes") if isinstance(obj, Mapping) else obj.num_nodes
    return nodes or 1


def config_key(obj: Any) -> tuple[Any, ...]:
    """One configuration at one device count (over all nodes) and node count: a row of the
    summary (2 nodes x 1 device and 1 node x 2 devices are two rows)."""
    return (*group_key(obj), nodes_of(obj), _get(obj, "num_devices"))


def baseline_key(obj: Any) -> tuple[Any, ...]:
    """The speedup baseline of a run or row: its configuration at 1 device on 1 node."""
    return (*group_key(obj), 1, 1)


def synthetic_key(obj: Any) -> tuple[Any, ...]:
    """The same configuration and device count on synthetic data (the real/syn twin)."""
    key = list(config_key(obj))
    key[DATA_INDEX] = SYNTHETIC
    return tuple(key)
