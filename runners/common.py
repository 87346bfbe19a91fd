"""Child-side code every runner shares: read the spec, time the steps, write the result.

A runner module defines `benchmark(spec) -> dict` (and `equivalence(spec) -> dict` when it
takes part in the data-parallel equivalence test) and ends with `main(benchmark, equivalence)`.
This module imports no framework; numpy is the only dependency beyond the stdlib.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from runners import math_mode
from runners.threads import observed as observed_threads

Spec = dict[str, Any]
OOM_NAMES = ("ResourceExhaustedError", "OutOfMemoryError", "MemoryError")


class Unavailable(RuntimeError):
    """This run cannot happen here (missing GPU, package, checkout); the message says why."""


class Invalid(RuntimeError):
    """The run happened but its numbers cannot be trusted; the message says why."""


class StepTimer:
    """Clock readings taken after the device is synchronised; the timed window runs from
    start() to the last tick()."""

    def __init__(self) -> None:
        self._t0: float | None = None
        self._wall0: float | None = None
        self._ticks: list[tuple[float, int]] = []

    def start(self) -> None:
        """Call right after the last warm-up step has finished on the device."""
        self._t0, self._wall0 = time.perf_counter(), time.time()
        self._ticks = []

    def tick(self, steps: int = 1) -> None:
        """Call after `steps` more steps have finished on the device."""
        if self._t0 is None:
            raise RuntimeError("StepTimer.tick() before start()")
        self._ticks.append((time.perf_counter(), steps))

    @property
    def steps(self) -> int:
        return sum(s for _, s in self._ticks)

    def summary(self, global_batch: int, samples: int) -> dict[str, Any]:
        """images/sec over the window, per-step times, and the window in wall-clock time.

        `samples` is what the runner counted independently (e.g. from the optimizer's step
        counter); the parent checks it equals measure_steps x global batch."""
        if self._t0 is None or self._wall0 is None or not self._ticks:
            raise Invalid("no timed steps were recorded")
        elapsed = self._ticks[-1][0] - self._t0
        if elapsed <= 0:
            raise Invalid(f"timed window of {elapsed} s")
        step_times, prev = [], self._t0
        for t, steps in self._ticks:
            step_times.extend([(t - prev) / steps] * steps)
            prev = t
        return {
            "images_per_sec": self.steps * global_batch / elapsed,
            "step_times_s": [round(s, 6) for s in step_times],
            "timed_steps": self.steps,
            "samples": samples,
            "window_start": self._wall0,
            "window_end": self._wall0 + elapsed,
            "window_s": elapsed,
        }


def finite(value: Any) -> float:
    """A loss as a float; Invalid if it is NaN or infinite (BatchNorm on a short batch, say)."""
    v = float(value)
    if not math.isfinite(v):
        raise Invalid(f"loss is {v}")
    return v


def write_json_atomic(path: str | Path, data: Any) -> None:
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2, default=_plain)
    os.replace(tmp, path)


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


def load_equivalence_inputs(spec: Spec) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray,
                                                   float]:
    """The equivalence test's initial weights (canonical names), batch x, labels y, and lr."""
    eq = spec["equivalence"]
    with np.load(eq["inputs"]) as data:
        weights = {k[2:]: data[k] for k in data.files if k.startswith("w:")}
        return weights, data["x"], data["y"], float(eq["learning_rate"])


def save_equivalence_output(spec: Spec, weights: dict[str, np.ndarray]) -> None:
    """Write the weights after the step, under their canonical names."""
    np.savez(spec["equivalence"]["output"], **{f"w:{k}": np.asarray(v) for k, v in
                                               weights.items()})


def one_line(message: str, limit: int = 300) -> str:
    """A multi-line error as one line: its first line, and when that only introduces the detail
    (TensorFlow's "Graph execution error:"), the first status line after it."""
    lines = [ln.strip() for ln in message.strip().splitlines() if ln.strip()]
    if not lines:
        return ""
    text = lines[0]
    if text.endswith(":") and len(lines) > 1:
        detail = next((ln for ln in lines[1:] if re.match(r"^(\(\d+\) )?[A-Z_]{4,}: ", ln)),
                      lines[-1])
        text = f"{text} {detail}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def process_rank() -> int:
    """This process's rank when a launcher (torchrun, horovodrun) started one per device; 0
    for a single-process runner."""
    for var in ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def main(benchmark: Callable[[Spec], dict[str, Any]],
         equivalence: Callable[[Spec], dict[str, Any]] | None = None) -> None:
    """Entry point of every runner: run the spec's mode and write the result, whatever happens."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    parser.add_argument("--result", required=True)
    args = parser.parse_args()
    spec: Spec = json.loads(Path(args.spec).read_text())
    rank = process_rank()
    tag = "[runner]" if rank == 0 else f"[runner rank {rank}]"
    print(f"{tag} {spec['runner']} {spec['run_id']} mode={spec.get('mode', 'benchmark')}",
          flush=True)
    code = 0
    try:
        # float32 math of the frameworks imported so far; JAX's from the environment
        math_mode.apply(spec.get("precision", "fp32"), spec.get("device", "cpu"))
        if spec.get("mode", "benchmark") == "equivalence":
            if equivalence is None:
                raise Unavailable(f"{spec['runner']} does not implement the equivalence mode")
            result = equivalence(spec)
        else:
            result = benchmark(spec)
        result.setdefault("status", "ok")
        result["math"] = math_mode.read_back()  # as the frameworks report it after the run
    except (Unavailable, math_mode.MathModeUnavailable) as exc:
        result = {"status": "unavailable", "reason": str(exc)}
    except ModuleNotFoundError as exc:  # the environment lacks a package this run needs
        result = {"status": "unavailable", "reason": f"{exc} in {sys.executable}"}
    except Invalid as exc:
        result = {"status": "invalid", "reason": str(exc)}
    except BaseException as exc:  # a crash is data: say what it was, keep the traceback in the log
        traceback.print_exc()
        name = type(exc).__name__
        status = "oom" if name in OOM_NAMES or "out of memory" in str(exc).lower() else "failed"
        message = one_line(str(exc))
        result = {"status": status, "reason": f"{name}: {message}" if message else name}
        code = 1
    result["threads"] = observed_threads()  # what the run used, whatever its status
    if rank == 0:  # one result per run: the other ranks' figures are rank 0's by construction
        write_json_atomic(args.result, result)
    print(f"{tag} status={result['status']}"
          + (f" images_per_sec={result['images_per_sec']:.2f}"
             if result.get("images_per_sec") else "")
          + (f" reason={result['reason']}" if result.get("reason") else ""), flush=True)
    sys.stdout.flush()
    os._exit(code)  # skip framework atexit hooks that can hang after a failure
