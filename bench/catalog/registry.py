"""Runners and framework families the harness knows, described without importing them: each
family's runners come from its contract/catalogs/<family>.py (framework-free), collected here in
one order; the families' environments are declared here."""

from __future__ import annotations

from typing import Any

from contract import catalog
from contract.catalog import Family, Option, RunnerInfo
from contract.catalogs import cntk as cntk_catalog
from contract.catalogs import jax as jax_catalog
from contract.catalogs import mxnet as mxnet_catalog
from contract.catalogs import tf as tf_catalog
from contract.catalogs import torch as torch_catalog

__all__ = ["BASELINE_PIPELINE", "COMMON_OPTIONS", "FAMILIES", "PIPELINES", "PROBES", "RUNNERS",
           "Family", "Option", "RunnerInfo", "resolved_options", "runner_options"]

# Options every runner accepts; the launcher consumes them, the child never sees them.
COMMON_OPTIONS: dict[str, Option] = {
    "python": Option(str, None, help="use this interpreter instead of the family's environment"),
}

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family("tf", "TensorFlow 2.21 with Keras 3",
               {"cpu": "envs/tf-cpu.txt", "gpu": "envs/tf-gpu.txt"}),
        Family("mxnet", "Apache MXNet 1.9.1 (Gluon) with keras-mxnet 2.2.4.3",
               {"cpu": "envs/mxnet-cpu.txt", "gpu": "envs/mxnet-gpu.txt"}),
        Family("torch", "PyTorch 2.13 with Keras 3 (torch backend) and DeepSpeed 0.19",
               {"cpu": "envs/torch-cpu.txt", "gpu": "envs/torch-gpu.txt"},
               # the C++ op DeepSpeed compiles on CPU at start-up, built once with the env
               post_install="envs/deepspeed_build.py"),
        Family("jax", "JAX with Flax and optax, and Keras 3 (jax backend)",
               {"cpu": "envs/jax-cpu.txt", "gpu": "envs/jax-gpu.txt"}),
        Family("horovod", "Horovod 0.28.1 built from source against PyTorch 2.13 (gloo)",
               {"cpu": "envs/horovod-cpu.txt", "gpu": "envs/horovod-gpu.txt"},
               post_install="envs/horovod_build.py"),
    ]
}

# the order `list`, plans and tables show: by family, then as each catalog lists them
FAMILY_ORDER = ("tf", "mxnet", "torch", "jax", "horovod", "cntk")
CATALOGS = (catalog, tf_catalog, mxnet_catalog, torch_catalog, jax_catalog, cntk_catalog)


def _collect(kind: str) -> dict[str, RunnerInfo]:
    infos = [info for cat in CATALOGS for info in getattr(cat, kind, ())]
    names = [i.name for i in infos]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:  # two catalogs naming one runner: a newcomer's slip, caught at import
        raise ValueError(f"runner names listed twice in contract/catalogs/*.py: {repeated}")
    order = {f: i for i, f in enumerate(("harness", *FAMILY_ORDER))}
    return {i.name: i for i in sorted(infos, key=lambda i: order.get(i.family, len(order)))}


RUNNERS: dict[str, RunnerInfo] = _collect("RUNNERS")

BASELINE_PIPELINE = "pil_loop"  # runs once, with 0 workers, whatever the worker counts
PIPELINES: dict[str, RunnerInfo] = _collect("PIPELINES")
# The communication probes (mode: allreduce): each family's own all-reduce, no model.
PROBES: dict[str, RunnerInfo] = _collect("PROBES")


def runner_options(runner: str) -> dict[str, Option]:
    """All options a runner accepts, its own plus the common ones."""
    return {**COMMON_OPTIONS, **RUNNERS[runner].options}


def resolved_options(runner: str, given: dict[str, Any]) -> dict[str, Any]:
    """A run's options as the child reads them: every option of the runner (or pipeline, or
    probe) at its default, under what the config gave. A name the registry does not know
    passes as given (the tests' toy runners)."""
    info = RUNNERS.get(runner) or PIPELINES.get(runner) or PROBES.get(runner)
    if info is None:
        return dict(given)
    return {**{k: o.default for k, o in info.options.items()}, **given}
