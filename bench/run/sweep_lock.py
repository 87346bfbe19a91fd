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
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

LOCK_NAME = ".sweep.lock"


class FolderBusy(RuntimeError):
    """Another live sweep holds the results folder; the message names it."""


def acquire(folder: Path) -> IO[str]:
    """Lock folder for this sweep (keep the returned file open until the sweep ends)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    fh = open(path, "a+")  # noqa: SIM115 - held open for the sweep's lifetime
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
