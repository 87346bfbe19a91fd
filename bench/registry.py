"""Runners and framework families the harness knows, described without importing them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Option:
    """One runner option: its type, default, and (optionally) the values allowed."""

    type: type | tuple[type, ...]
    default: Any
    allowed: tuple[Any, ...] | None = None
    help: str = ""


@dataclass(frozen=True)
class Family:
    """A framework family: one Python environment per device variant."""

    name: str
    description: str
    requirements: dict[str, str]  # variant ("cpu" | "gpu") -> requirements file, repo-relative


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


# Options every runner accepts; the launcher consumes them, the child never sees them.
COMMON_OPTIONS: dict[str, Option] = {
    "python": Option(str, None, help="use this interpreter instead of the family's environment"),
}

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family("tf", "TensorFlow 2.21 with Keras 3",
               {"cpu": "envs/tf-cpu.txt", "gpu": "envs/tf-gpu.txt"}),
    ]
}

RUNNERS: dict[str, RunnerInfo] = {
    r.name: r
    for r in [
        RunnerInfo(
            "tf_mirrored",
            "tf",
            "runners.tf_mirrored",
            "Keras 3 model.fit under tf.distribute.MirroredStrategy",
            options={
                "xla": Option(bool, False, help="compile the train step with XLA (jit_compile)"),
                "steps_per_execution": Option(int, 1, help="train steps per tf.function call"),
                "data_format": Option(
                    str, "channels_last", ("channels_last", "channels_first"), "tensor layout"
                ),
                "cross_device_ops": Option(
                    str,
                    "auto",
                    ("auto", "nccl", "hierarchical_copy", "reduction_to_one_device"),
                    "how MirroredStrategy all-reduces gradients",
                ),
            },
            precisions=("fp32", "bf16", "fp16"),
        ),
    ]
}


def runner_options(runner: str) -> dict[str, Option]:
    """All options a runner accepts, its own plus the common ones."""
    return {**COMMON_OPTIONS, **RUNNERS[runner].options}
