"""Child-side code every runner shares: the typed spec, the one timed loop, the result.

A runner module defines `benchmark(spec) -> dict` (and `equivalence`, `converge` where it takes
part) and ends with `main(benchmark, ...)`; the parent resolves every option, so a runner reads
`spec.options["name"]` and repeats no default. Imports no framework (numpy only)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from contract import precision_policy
from contract import result as declared
from contract.launch_env import side_file

# the contract's spec and refusals, re-exported: a runner imports what it uses from here
from contract.spec import Invalid, Spec, Unavailable, rows_per_device  # noqa: F401
from runners import math_mode, memory
from runners.threads import observed as observed_threads

OOM_NAMES = ("ResourceExhaustedError", "OutOfMemoryError", "MemoryError")


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


class TimedWindow:
    """The bookkeeping of the one timed loop: `warmup` steps uncounted, then `measure` steps timed,
    each reading taken once the step is finished on the device. `timed_loop` drives it, or a
    framework's own loop through `step_begin`/`step_done`; `per_call`: steps per call (Keras
    steps_per_execution); `on_start` runs just before the clock starts."""

    def __init__(self, warmup: int, measure: int, per_call: int = 1,
                 on_start: Callable[[], None] | None = None) -> None:
        if per_call < 1 or warmup % per_call or measure % per_call:
            raise Invalid(f"{per_call} steps per call must divide warmup_steps={warmup} and "
                          f"measure_steps={measure} so the timed window starts and ends on a "
                          f"call")
        self.warmup, self.measure, self.per_call = warmup, measure, per_call
        self.on_start = on_start
        self.timer, self.losses, self.calls = StepTimer(), [], 0
        self.started = False

    def start(self) -> None:
        """Start the clock (done by step_done after the last warm-up step; call it yourself
        before the first step when there is no warm-up)."""
        memory.window_start()  # the peaks reset before the clock (runners/memory.py)
        if self.on_start is not None:
            self.on_start()
        self.started = True
        self.timer.start()

    @property
    def done(self) -> bool:
        return self.timer.steps >= self.measure if self.started else False

    def step_begin(self) -> None:
        """A call is about to run: with no warm-up, the clock starts before the first one."""
        if not self.started and self.warmup == 0:
            self.start()

    def step_done(self, loss: float | None = None) -> None:
        """One call (per_call steps) has finished on the device; `loss` its last loss."""
        self.calls += 1
        if not self.started:
            if self.calls * self.per_call >= self.warmup:
                self.start()
            return
        self.timer.tick(self.per_call)
        if self.done:  # the peaks read after the last clock reading
            memory.window_end()
        if loss is not None:
            self.losses.append(float(loss))

    def summary(self, global_batch: int, samples: int) -> dict[str, Any]:
        """The timer's summary (images/sec over the window, per-step times) and the first
        and last measured losses, checked finite."""
        out = self.timer.summary(global_batch, samples)
        if self.losses:
            out.update(first_loss=finite(self.losses[0]), last_loss=finite(self.losses[-1]))
        return out


def timed_loop(step: Callable[[], Any], sync: Callable[[Any], float | None], warmup: int,
               measure: int, on_start: Callable[[], None] | None = None) -> TimedWindow:
    """The timed loop every explicit-loop runner runs: `warmup` steps, then `measure` timed
    ones. `step()` launches one training step and returns what `sync` needs; `sync(out)`
    waits until that step has finished on the device and returns its loss (or None)."""
    if measure < 1:
        raise Invalid("measure_steps is 0: nothing was timed")
    window = TimedWindow(warmup, measure, on_start=on_start)
    while not window.done:
        window.step_begin()
        window.step_done(sync(step()))
    return window


def synthetic_fp32_only(spec: Spec, loader: str) -> None:
    """What a runner made from a template (runners/templates/) runs until it is given more:
    synthetic data in fp32. Unavailable for anything else, saying where the family's loader
    is (`loader`)."""
    if spec.data != "synthetic":
        raise Unavailable(f"{spec.runner} runs synthetic data only (add a loader: {loader})")
    if spec.precision != "fp32":
        raise Unavailable(f"{spec.runner} runs fp32 only, not {spec.precision}")


def finite(value: Any) -> float:
    """A loss as a float; Invalid if it is NaN or infinite (BatchNorm on a short batch, say)."""
    v = float(value)
    if not math.isfinite(v):
        raise Invalid(f"loss is {v}")
    return v


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Write JSON through a temporary name and a rename, with the umask's permissions (not
    mkstemp's 0600: a colleague reads the results folder too)."""
    path = Path(path)
    text = json.dumps(data, indent=2, default=_plain)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # 0o666 & ~umask
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:  # a full disk: no half-written temporary left beside the result
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return str(value)


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
    """This process's rank when a launcher (torchrun, horovodrun) started one per device, or
    the harness one per node (MGBENCH_PROCESS_RANK, bench/run/slurm_job.py); 0 for a
    single-process runner."""
    for var in ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "MGBENCH_PROCESS_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def node_identity() -> dict[str, Any]:
    """Where this process runs, as SLURM and the OS say: the SLURM node name (SLURMD_NODENAME;
    the host name outside SLURM), the host name, the SLURM task id and job id. A multi-node
    runner gathers every process's through its framework's collectives for the record."""
    import socket

    return {"node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
            "host": socket.gethostname(), "slurm_procid": os.environ.get("SLURM_PROCID"),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"), "pid": os.getpid()}


def main(benchmark: Callable[[Spec], dict[str, Any]],
         equivalence: Callable[[Spec], dict[str, Any]] | None = None,
         converge: Callable[[Spec], dict[str, Any]] | None = None) -> None:
    """Entry point of every runner: run the spec's mode and write the result, whatever happens.
    `converge`: the runner's mode converge (train to accuracy: runners/converge.py), if it has
    one."""
    args = _arguments()
    spec = Spec.from_dict(json.loads(Path(args.spec).read_text()))
    rank = process_rank()
    tag = "[runner]" if rank == 0 else f"[runner rank {rank}]"
    print(f"{tag} {spec.runner} {spec.run_id} mode={spec.mode}", flush=True)
    code = 0
    memory.expect(spec.family)
    try:
        # float32 math of the frameworks imported so far; JAX's from the environment
        math_mode.apply(spec.precision, spec.device)
        if spec.mode == "equivalence":
            if equivalence is None:
                raise Unavailable(f"{spec.runner} does not implement the equivalence mode")
            result = equivalence(spec)
        elif spec.mode == "converge":
            if converge is None:
                raise Unavailable(f"{spec.runner} does not train to accuracy (mode converge)")
            memory.baseline()
            result = converge(spec)
        else:
            memory.baseline()  # read again by the family's device setup (runners/memory.py)
            result = benchmark(spec)
        result.setdefault("status", "ok")
        result["math"] = math_mode.read_back()  # as the frameworks report it after the run
        if spec.mode in ("benchmark", "converge") and result["status"] == "ok":
            result.setdefault("precision_policy", precision_policy.declared(spec.precision))
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
    measured = memory.for_result(spec, rank)  # each rank's own (runners/memory.py)
    for key, value in measured.items():
        result.setdefault(key, value)
    result, undeclared = _declared(result, ("threads", *measured))
    code = 1 if undeclared else code
    if rank == 0:  # one result per run: the other ranks' figures are rank 0's by construction
        write_json_atomic(args.result, result)
    else:  # but memory is each rank's own: beside the result, merged by the parent
        with contextlib.suppress(OSError):
            write_json_atomic(side_file(args.result, rank), {"rank": rank, **measured})
    print(f"{tag} {_outcome(result)}", flush=True)
    sys.stdout.flush()
    os._exit(code)  # skip framework atexit hooks that can hang after a failure


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    parser.add_argument("--result", required=True)
    return parser.parse_args()


def _declared(result: dict[str, Any], kept: tuple[str, ...]) -> tuple[dict[str, Any], bool]:
    """The result, or when a field of it is not declared in contract/result.py (or is of
    another JSON type: a misspelt field, the runner's bug) a failed one naming the field, with
    the `kept` fields main added; and whether it failed so."""
    problem = declared.mismatch(declared.as_written(result, _plain))
    if problem is None:
        return result, False
    return {"status": "failed", "reason": problem, **{k: result[k] for k in kept}}, True


def _outcome(result: dict[str, Any]) -> str:
    """The log's last line of a run: its status, images/sec and reason."""
    return (f"status={result['status']}"
            + (f" images_per_sec={result['images_per_sec']:.2f}"
               if result.get("images_per_sec") else "")
            + (f" reason={result['reason']}" if result.get("reason") else ""))
