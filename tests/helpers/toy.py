"""The toy runner's CLI (tests/children/cli_with_toy.py: the harness with a numpy runner that
crashes, hangs or leaks on request) and the processes a run leaves behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from bench.records.store import runs_dir
from tests.helpers.cli import REPO

TOY = [sys.executable, "-m", "tests.children.cli_with_toy"]


def config(tmp_path: Path, behaviour: str = "ok", **extra: object) -> Path:
    """A toy sweep's YAML under tmp_path: runner toy at 1 and 2 devices behaving as
    `behaviour`, `options` added to its runner options, other keys in `extra` over the rest."""
    options = {"python": sys.executable, "behaviour": behaviour}
    options.update(extra.pop("options", {}))  # type: ignore[arg-type]
    cfg = {"name": "toy", "runners": ["toy"], "models": ["probe"], "devices": [1, 2],
           "batch_size_per_device": 8, "warmup_steps": 1, "measure_steps": 3,
           "timeout_s": 60, "runner_options": {"toy": options}}
    cfg.update(extra)
    path = tmp_path / f"toy-{behaviour}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def toy(*args: str, timeout: float = 180, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess[str]:
    """The toy CLI with ARGS to its end, from the repo root."""
    return subprocess.run([*TOY, *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=env)


def start_toy(*args: str) -> subprocess.Popen[str]:
    """The toy CLI with ARGS started in the background."""
    return subprocess.Popen([*TOY, *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that name text (every run's process names its folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if text in cmd and state != "Z":
                found.append(cmd)
    return found


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def nothing_left(out: Path, worker_pid_file: Path | None = None, within_s: float = 10) -> None:
    """Wait up to within_s for no process naming `out` and no live worker; else fail."""
    deadline = time.monotonic() + within_s
    while True:
        left = processes_mentioning(str(out))
        worker = int(worker_pid_file.read_text()) if worker_pid_file and \
            worker_pid_file.exists() else None
        if not left and not (worker and alive(worker)):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"still running: {left} worker={worker}")
        time.sleep(0.2)


def run_until_second_run(tmp_path: Path) -> tuple[subprocess.Popen[str], Path, Path, Path]:
    """A two-run sweep started in the background, returned once run 1 is recorded and run 2
    (with a worker process of its own) is under way."""
    out, pids = tmp_path / "out", tmp_path / "worker.pid"
    cfg = config(tmp_path, measure_steps=4,
                 options={"busy_s": 0.5, "worker_pid_file": str(pids)})
    proc = start_toy("--config", str(cfg), "--out", str(out))
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the sweep never reached its second run"
        spec2 = list(runs_dir(out).glob("*__n2__*.spec.json")) if out.exists() else []
        if spec2 and pids.exists() and pids.stat().st_mtime_ns >= spec2[0].stat().st_mtime_ns:
            break  # run 2's own worker is up
        time.sleep(0.1)
    time.sleep(0.3)  # run 2 is training (for 4 x 0.5 s)
    return proc, out, pids, cfg
