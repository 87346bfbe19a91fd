"""`run_bench.py check-model CONFIG`: each user's model of a sweep file (a `models:` mapping)
built once in a child of its framework's environment (models/check_custom.py), which counts
its parameters and FLOPs with the framework and runs a batch of 2 through it. Nothing else
runs; a bad entry is one line."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bench import REPO_ROOT
from bench.catalog.registry import RUNNERS
from bench.plan.config import SweepConfig, custom_entry
from bench.run.envs import EnvError, ensure_env
from bench.run.guard import cannot_start, run_guarded

# A user's model's framework -> (the environment's family, variables the child needs): Keras
# models are checked on JAX (as keras_jax runs them), tf ones on TensorFlow.
ENV_OF: dict[str, tuple[str, dict[str, str]]] = {
    "torch": ("torch", {}),
    "jax": ("jax", {}),
    "keras": ("jax", {"KERAS_BACKEND": "jax"}),
    "tf": ("tf", {"KERAS_BACKEND": "tensorflow"}),
    "mxnet": ("mxnet", {}),
}
TIMEOUT_S = 600


def check_entry(entry: dict[str, Any], variant: str, python: str | None = None
                ) -> dict[str, Any]:
    """The child's answer for one entry: counts and output shape, or {"error": one line}.
    `python`: the user's own interpreter (runner_options.<runner>.python), else the
    framework's environment."""
    family, extra = ENV_OF[entry["framework"]]
    if python is None:
        try:
            python = str(ensure_env(family, variant, quiet=True).python)
        except EnvError as exc:
            return {"error": f"models: {entry['name']}: the {family} environment: {exc}"}
    env = {**os.environ, **extra, "PYTHONPATH": str(REPO_ROOT)}
    if reason := cannot_start(python):
        return {"error": f"models: {entry['name']}: cannot start interpreter {python}: {reason}"}
    # under a guard: what the user's build starts (detached too) ends with it
    proc = run_guarded([python, "-m", "models.check_custom", json.dumps(entry)], REPO_ROOT,
                       env, TIMEOUT_S)
    if proc.returncode is None:
        return {"error": f"models: {entry['name']}: building it took more than {TIMEOUT_S} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("CHECK "):
            return json.loads(line[len("CHECK "):])
    tail = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    return {"error": f"models: {entry['name']}: the check died (exit {proc.returncode}): "
                     f"{tail[-1][:300] if tail else 'no output'}"}


def own_python(cfg: SweepConfig, framework: str) -> str | None:
    """The user's interpreter of the sweep's first runner that takes a `framework` model and
    names one (runner_options.<runner>.python: a model needing packages of its own), else
    None."""
    for runner in cfg.runners:
        if framework in RUNNERS[runner].custom_models \
                and cfg.runner_options.get(runner, {}).get("python"):
            return str(Path(cfg.runner_options[runner]["python"]).expanduser())
    return None


def check_models(cfg: SweepConfig, variant: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(entry, answer) for every user's model of the sweep, in the file's order."""
    return [(entry, check_entry(entry, variant, own_python(cfg, entry["framework"])))
            for m in cfg.models if (entry := custom_entry(m)) is not None]


def describe(entry: dict[str, Any], answer: dict[str, Any]) -> str:
    """One line of a checked model."""
    flops = answer["flops_per_sample"]
    return (f"{entry['name']} ({entry['framework']}, {entry['build']}): "
            f"{answer['params']:,} parameters ({answer['trainable_params']:,} trainable), "
            f"{flops / 1e9:.4g} GFLOPs per sample forward ({answer['flops_source']}), "
            f"output {answer['output_shape']} for a batch of 2: ok")
