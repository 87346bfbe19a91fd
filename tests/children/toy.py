"""A real child program for orchestrator tests: numpy softmax regression trained with SGD,
run through the same runners.common entry point as every runner. Its `behaviour` option makes
it misbehave the ways real frameworks do (crash, hang, garbage, OOM, NaN, wrong counts)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from runners.common import Spec, StepTimer, finite, main


def train_step(w: np.ndarray, x: np.ndarray, y: np.ndarray, lr: float) -> float:
    logits = x @ w
    logits -= logits.max(axis=1, keepdims=True)
    p = np.exp(logits)
    p /= p.sum(axis=1, keepdims=True)
    loss = -np.log(p[np.arange(len(y)), y]).mean()
    p[np.arange(len(y)), y] -= 1
    w -= lr * x.T @ p / len(y)
    return float(loss)


def benchmark(spec: Spec) -> dict[str, Any]:
    # the environment's word over the config's: a failure that goes away with the same
    # settings (a fixed machine), for --resume --retry-failed
    behaviour = os.environ.get("MGBENCH_TOY_BEHAVIOUR") or spec.options.get("behaviour", "ok")
    if spec.options.get("detached_pid_file"):  # a helper that leaves the run's session
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                  start_new_session=True)
        Path(spec.options["detached_pid_file"]).write_text(str(helper.pid))
    if behaviour == "crash":
        raise RuntimeError("the toy runner crashed on purpose")
    if behaviour == "hang" or (behaviour == "hang_above_1" and spec.num_devices > 1):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        if spec.options.get("pid_file"):
            Path(spec.options["pid_file"]).write_text(str(child.pid))
        time.sleep(600)
    if behaviour == "garbage":
        Path(sys.argv[sys.argv.index("--result") + 1]).write_text("{this is not json")
        os._exit(0)
    if behaviour == "oom":
        print("tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when "
              "allocating tensor with shape[4096,4096]", file=sys.stderr, flush=True)
        os._exit(1)
    if behaviour == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if behaviour == "oom_real":  # a real allocation past a real address-space limit
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        np.ones((1 << 31,), dtype=np.uint8)  # 2 GiB under a 1 GiB limit: MemoryError
    if behaviour == "quiet_exit":  # exits 0 without a result, after a while
        time.sleep(float(spec.options.get("busy_s") or 1.0))
        os._exit(0)
    if spec.options.get("worker_pid_file"):  # a loader worker / launcher rank of the run
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        Path(spec.options["worker_pid_file"]).write_text(str(worker.pid))
    if behaviour == "import_error":
        import tensorflow_that_is_not_installed  # noqa: F401
    rng = np.random.default_rng(0)
    batch = spec.global_batch_size
    x = rng.standard_normal((batch, 64)).astype(np.float32)
    y = rng.integers(0, 10, batch)
    w = np.zeros((64, 10), np.float32)
    for _ in range(spec.warmup_steps):
        train_step(w, x, y, 0.1)
    timer, losses, steps = StepTimer(), [], 0
    timer.start()
    busy_s = float(spec.options.get("busy_s") or 0)  # CPU burnt per step: a window to sample
    for _ in range(spec.measure_steps):
        losses.append(train_step(w, x, y, 0.1))
        end = time.perf_counter() + busy_s
        while time.perf_counter() < end:
            pass
        steps += 1
        timer.tick()
    if behaviour == "nan":
        losses[-1] = float("nan")
        return {**timer.summary(batch, steps * batch), "first_loss": losses[0],
                "last_loss": losses[-1]}
    samples = (steps - 1 if behaviour == "short" else steps) * batch
    return {**timer.summary(batch, samples), "first_loss": finite(losses[0]),
            "last_loss": finite(losses[-1]), "framework": {"numpy": np.__version__},
            "devices": [{"name": "cpu", "kind": "host"}], "placement": placement(spec, x)}


def placement(spec: Spec, x: np.ndarray) -> dict[str, int]:
    """Rows per shard of the batch as numpy splits it, one shard per device; behaviour
    `one_device` keeps every row on the first, as a strategy that never spread would."""
    parts = 1 if spec.options.get("behaviour") == "one_device" else spec.num_devices
    return {f"toy:shard{i}": len(rows) for i, rows in enumerate(np.array_split(x, parts))}


if __name__ == "__main__":
    main(benchmark)
