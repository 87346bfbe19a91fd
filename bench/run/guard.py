"""A run dies with its parent: the small process between the harness and a run's child.

`python -m bench.run.guard FD -- CMD ...` starts CMD in its own process group (the guard leads a
new session, started so by bench/run/launch.py) and watches FD, the read end of a pipe whose write
end only the harness parent holds. The kernel closes that end when the parent exits for any
reason (SIGKILL, SIGTERM, a closed terminal, a crash), the guard reads EOF and kills the whole
group, launcher ranks and loader workers included, plus any descendant that left the group
(read from /proc before the kill). Without it a killed parent leaves the child training on,
re-parented to init, beside the runs a `--resume` starts (issue 14: 97.9 images/sec against
151.8 on a quiet machine, nothing in the record saying why).

The guard is also the run's child subreaper (Linux prctl PR_SET_CHILD_SUBREAPER): a descendant
that detaches (a double fork, setsid) is re-parented to the guard, not to init, so it stays in
the tree the guard walks. When CMD ends, normally too, the guard kills every descendant still
alive, reaps them, and (given a report FD) tells the parent how many there were and how many had
left the group, for the record's `left_running`. A cgroup would hold them too; it needs a
delegated hierarchy that an unprivileged sweep rarely has, and the subreaper needs nothing.

The guard exits as CMD did: with its code, or by the same signal, so the parent's
classification (SIGKILL: likely the OOM killer) is unchanged. It imports only the standard
library and starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

_PARENT_PIPE: tuple[int, int] | None = None


def parent_death_fd() -> int:
    """The read end of a pipe whose write end only this process holds: it reads EOF when this
    process is gone, however it went."""
    global _PARENT_PIPE
    if _PARENT_PIPE is None:
        _PARENT_PIPE = os.pipe()  # both ends non-inheritable; a guard gets the read end
    return _PARENT_PIPE[0]


def guarded(cmd: list[str], report_fd: int | None = None) -> tuple[list[str], int]:
    """(the command run under a guard, the fd to pass it): start it with
    start_new_session=True and pass_fds=(fd,) (and report_fd, the write end of a pipe the
    guard writes what it found left running into, as JSON, when given)."""
    fd = parent_death_fd()
    report = [] if report_fd is None else [str(report_fd)]
    return [sys.executable, "-m", "bench.run.guard", str(fd), *report, "--", *cmd], fd


def cannot_start(program: str | Path) -> str | None:
    """Why program cannot be executed, or None: checked before a guard is started, since the
    guard itself would start and only its child fail."""
    if os.access(program, os.X_OK):
        return None
    return "No such file" if not os.path.exists(program) else "not executable"


def descendants(pid: int) -> list[int]:
    """Every live descendant of pid (zombies left out: they are dead, only not yet reaped),
    from the ppid fields of /proc/<pid>/stat."""
    children: dict[int, list[int]] = {}
    dead: set[int] = set()
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
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        children.setdefault(int(ppid), []).append(int(entry.name))
        if state in ("Z", "X"):
            dead.add(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in dead:
                found.append(child)
            todo.append(child)
    return found


@dataclass(frozen=True)
class Finished:
    """How a guarded helper command ended: its exit code (None: killed at its timeout) and its
    output, decoded with replacement (a child's stray bytes are text, never an error)."""

    returncode: int | None
    stdout: str
    stderr: str


def run_guarded(cmd: list[str], cwd: str | Path, env: dict[str, str], timeout_s: float
                ) -> Finished:
    """Run a short helper command (the peak probe, check-model's build) under a guard in its
    own session: whatever it starts, detached or not, ends with it, at its timeout and on
    Ctrl-C too."""
    guarded_cmd, watch_fd = guarded(cmd)
    proc = subprocess.Popen(guarded_cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", start_new_session=True, pass_fds=(watch_fd,))
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        return Finished(None, "", "")
    except BaseException:  # Ctrl-C: leave nothing behind
        kill_tree(proc)
        raise
    return Finished(proc.returncode, out, err)


def kill_tree(proc: subprocess.Popen[str]) -> None:
    """SIGKILL a guard's tree (the descendants that left its group first), then its group."""
    for pid in descendants(proc.pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()


def become_subreaper() -> bool:
    """Make this process the child subreaper of its descendants (Linux): orphans, those that
    detached with setsid included, are re-parented to it. False where it is not available."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def end_left_running(report_fd: int | None) -> None:
    """After CMD ended: SIGKILL every descendant still alive (the subreaper holds those that
    left the group), reap them, and write {"left": n, "detached": m} to report_fd."""
    left = descendants(os.getpid())
    detached = 0
    for pid in left:
        with contextlib.suppress(OSError):
            detached += os.getpgid(pid) != os.getpgrp()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while left and time.monotonic() < deadline:  # reap what was re-parented to us
        try:
            reaped, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if not reaped:
            if not descendants(os.getpid()):
                break
            time.sleep(0.02)
    if report_fd is not None:
        with contextlib.suppress(OSError):
            os.write(report_fd, json.dumps({"left": len(left), "detached": detached}).encode())
            os.close(report_fd)


def kill_everything(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL the guard's descendants (the child's, even those that left the group and were
    re-parented to the guard), then the group."""
    for pid in descendants(os.getpid()):
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
    report_fd = None
    if len(argv) >= 4 and argv[1].isdigit() and argv[2] == "--":  # FD REPORT_FD -- CMD
        report_fd, argv = int(argv[1]), [argv[0], *argv[2:]]
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m bench.run.guard FD [REPORT_FD] -- CMD ...", file=sys.stderr)
        return 2
    fd, cmd = int(argv[0]), argv[2:]
    # a SIGTERM to the group (the parent's timeout, Ctrl-C) reaches the child directly; the
    # guard stays to report how the child ended
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    become_subreaper()  # before the child starts: all it detaches stays below the guard
    try:
        child = subprocess.Popen(cmd, preexec_fn=_default_signals)
    except OSError as exc:
        print(f"bench.run.guard: cannot start {cmd[0]}: {exc.strerror}", file=sys.stderr)
        return 127
    threading.Thread(target=watch, args=(fd, child), daemon=True).start()
    code = child.wait()
    end_left_running(report_fd)  # nothing of the run outlives it, a normal end included
    if code < 0:  # die by the same signal, so the parent sees what the child saw
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
