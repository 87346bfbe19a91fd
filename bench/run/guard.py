"""A run dies with its parent: the small process between the harness and a run's child.

`python -m bench.run.guard FD -- CMD ...` starts CMD in its own process group (the guard leads a
new session, started so by bench/run/launch.py) and watches FD, the read end of a pipe whose write
end only the harness parent holds. The kernel closes that end when the parent exits for any
reason (SIGKILL, SIGTERM, a closed terminal, a crash), the guard reads EOF and kills the whole
group, launcher ranks and loader workers included, plus any descendant that left the group
(read from /proc before the kill). Without it a killed parent leaves the child training on,
re-parented to init, beside the runs a `--resume` starts (issue 14: 97.9 images/sec against
151.8 on a quiet machine, nothing in the record saying why).

The guard exits as CMD did: with its code, or by the same signal, so the parent's
classification (SIGKILL: likely the OOM killer) is unchanged. It imports only the standard
library and starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

_PARENT_PIPE: tuple[int, int] | None = None


def parent_death_fd() -> int:
    """The read end of a pipe whose write end only this process holds: it reads EOF when this
    process is gone, however it went."""
    global _PARENT_PIPE
    if _PARENT_PIPE is None:
        _PARENT_PIPE = os.pipe()  # both ends non-inheritable; a guard gets the read end
    return _PARENT_PIPE[0]


def guarded(cmd: list[str]) -> tuple[list[str], int]:
    """(the command run under a guard, the fd to pass it): start it with
    start_new_session=True and pass_fds=(fd,)."""
    fd = parent_death_fd()
    return [sys.executable, "-m", "bench.run.guard", str(fd), "--", *cmd], fd


def cannot_start(program: str | Path) -> str | None:
    """Why program cannot be executed, or None: checked before a guard is started, since the
    guard itself would start and only its child fail."""
    if os.access(program, os.X_OK):
        return None
    return "No such file" if not os.path.exists(program) else "not executable"


def descendants(pid: int) -> list[int]:
    """Every live descendant of pid, from the ppid fields of /proc/<pid>/stat."""
    children: dict[int, list[int]] = {}
    try:
        entries = list(Path("/proc").iterdir())
    except OSError:  # no /proc (macOS): the process group alone is killed
        entries = []
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_everything(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL the child's descendants (even those that left the group), then the group."""
    for pid in descendants(child.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    os.killpg(os.getpgrp(), signal.SIGKILL)  # the guard too: nothing of the run outlives it


def watch(fd: int, child: subprocess.Popen[bytes]) -> None:
    """Block until the parent's end of the pipe closes, then end the run."""
    try:
        while os.read(fd, 1):
            pass
    except OSError:
        pass
    if child.poll() is None:
        kill_everything(child)


def _default_signals() -> None:
    """In the child before exec: an ignored signal stays ignored across exec, so undo ours."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m bench.run.guard FD -- CMD ...", file=sys.stderr)
        return 2
    fd, cmd = int(argv[0]), argv[2:]
    # a SIGTERM to the group (the parent's timeout, Ctrl-C) reaches the child directly; the
    # guard stays to report how the child ended
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        child = subprocess.Popen(cmd, preexec_fn=_default_signals)
    except OSError as exc:
        print(f"bench.run.guard: cannot start {cmd[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    threading.Thread(target=watch, args=(fd, child), daemon=True).start()
    code = child.wait()
    if code < 0:  # die by the same signal, so the parent sees what the child saw
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
