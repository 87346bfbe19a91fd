"""The repository and its command line, run as a user would (the test process never imports a
framework: framework code runs in a child interpreter)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, timeout: float = 900, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    """Run `python run_bench.py ARGS` as a user would, from the repo root."""
    return subprocess.run([sys.executable, str(REPO / "run_bench.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


# the statuses a sweep exits 3 on by default (--fail-on; docs/CI.md)
FAILING = ("failed", "timeout", "oom", "invalid")


def sweep_exit(records: list[dict]) -> int:
    """The exit status a sweep with these records ends with under the default --fail-on."""
    return 3 if any(r.get("status") in FAILING for r in records) else 0


def main_here(*args: str) -> subprocess.CompletedProcess[str]:
    """`run_bench.py ARGS` as bench.cli.main runs it in this process, from the repo root: its
    exit code (argparse's included) and what it printed, as run_cli returns them, without a
    process's start-up. For the cases of a behaviour beside its one run_cli case (a traceback
    here is the test's exception)."""
    from bench.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(REPO), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's exits (a usage error, --help), as entry ends
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    return subprocess.CompletedProcess(["run_bench.py", *args], code, out.getvalue(),
                                       err.getvalue())


def run_child(python: str, script: str, *args: str, env: dict[str, str] | None = None,
              timeout: float = 900) -> dict:
    """Run a child script (a path from the repo root, tests/children/...) with ARGS in a framework
    interpreter, from the repo root with the repo on PYTHONPATH; the JSON of its one
    "RESULT <json>" output line (the test process itself never imports the framework)."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.run([python, str(REPO / script), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=timeout, env=full_env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])
