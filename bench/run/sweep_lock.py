"""One sweep per results folder at a time.

The sweep holds an exclusive flock on `<results>/.sweep.lock` for as long as it runs and writes
who it is into the file (pid, host, start time). A second sweep on the same folder is refused,
naming the holder. The kernel drops a flock when its process dies, however it dies, so a lock
left by a killed sweep is simply taken over by the next one (the file's old text is only a
note). The lock's file descriptor is not inherited by the runs' processes.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import stat
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

LOCK_NAME = ".sweep.lock"


class FolderBusy(RuntimeError):
    """Another live sweep holds the results folder, or its lock is no regular file of its
    own; the message names it."""


def acquire(folder: Path) -> IO[str]:
    """Lock folder for this sweep (keep the returned file open until the sweep ends)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    fh = _open_own(path)
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        try:
            holder = json.loads(fh.read() or "{}")
        except ValueError:
            holder = {}
        fh.close()
        raise FolderBusy(
            f"--out {folder}: another sweep is writing there (pid {holder.get('pid', '?')} on "
            f"{holder.get('host', '?')}, started {holder.get('started', '?')}); wait for it to "
            "end or choose another folder") from None
    fh.seek(0)
    fh.truncate()
    fh.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                         "started": datetime.now(timezone.utc).isoformat(timespec="seconds")}))
    fh.flush()
    return fh


def _open_own(path: Path) -> IO[str]:
    """The lock file opened for reading and writing, never through a link (one planted at the
    lock's name would have the sweep truncate its target) and only if it is a regular file."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        what = "a link" if path.is_symlink() else exc.strerror
        raise FolderBusy(f"--out {path.parent}: its lock {path.name} is {what}; remove it "
                         "(nothing of a sweep is one) or choose another folder") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FolderBusy(f"--out {path.parent}: its lock {path.name} is not a regular file; "
                         "remove it or choose another folder")
    return os.fdopen(fd, "r+")  # noqa: SIM115 - held open for the sweep's lifetime
