"""A stop signal in a command's first moments, while its modules import, ends it with its exit
code and no traceback (issue 43, item 7)."""

from __future__ import annotations

import ast
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.cli import REPO

# from the moment the command's imports reach numpy (mid-way through the 0.3-0.5 s `report`'s
# take; bench.cli itself imports them only once the command is known): these land during and
# after them (a stop inside Python's own start-up is Python's)
DELAYS_S = (0.0, 0.2, 0.5)


def importing_numpy(pid: int) -> bool:
    """Whether the process has mapped numpy's compiled core (the command's imports did)."""
    try:
        return "_multiarray_umath" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:  # it ended
        return True


def stopped_after(delay_s: float, sig: int, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen([sys.executable, "run_bench.py", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not importing_numpy(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(delay_s)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_while_the_command_starts_is_its_exit_code_and_no_traceback(
        sig: int, tmp_path: Path) -> None:
    codes = []
    for delay in DELAYS_S:
        done = stopped_after(delay, sig, "report", str(tmp_path))
        assert "Traceback" not in done.stderr, (delay, done.stderr)
        codes.append(done.returncode)
    # 128 + signal from the harness (killed by the signal itself only before Python ran), or
    # 2 where `report` of an empty folder ended before a late signal came
    assert set(codes) <= {128 + sig, -sig, 2}, codes
    assert codes[0] in (128 + sig, -sig), codes  # the first lands while the command lives


def test_every_module_a_command_imports_is_imported_before_its_stop_handling() -> None:
    """bench.cli imports a command's modules inside its functions; entry imports them first
    (COMMAND_MODULES), while run_bench.py's quiet exit on a stop still holds."""
    from bench.cli import COMMAND_MODULES

    preloaded = {name for names in COMMAND_MODULES.values() for name in names}
    local = set()
    for fn in ast.walk(ast.parse((REPO / "bench" / "cli.py").read_text())):
        if not isinstance(fn, ast.FunctionDef):
            continue
        for node in ast.walk(fn):
            if isinstance(node, ast.ImportFrom) and node.module:
                for alias in node.names:  # `from bench.run import forecast`: bench.run.forecast
                    sub = f"{node.module}.{alias.name}"
                    is_module = (REPO / (sub.replace(".", "/") + ".py")).exists()
                    local.add(sub if is_module else node.module)
    assert local, "bench.cli imports nothing inside its functions"
    assert local <= preloaded, sorted(local - preloaded)
