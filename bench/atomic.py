"""Files that appear whole or not at all, with the umask's permissions: the one writer of the
results folder's files (records, reports, charts). A leaf: stdlib only, imported by any stage
(bench.plotting's charts, bench.records.store's records)."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "w", **kwargs: Any) -> Iterator[IO[Any]]:
    """A file to write that appears at path only whole: a temporary name beside it, fsynced
    and renamed; created with the process umask's permissions (mkstemp's 0600 would hide the
    results from a colleague). A failed write (a full disk) removes the temporary and leaves
    the last good file; the OSError names path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # 0o666 & ~umask
        with os.fdopen(fd, mode, **kwargs) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError) and exc.filename in (None, str(tmp), tmp):
            exc.filename = str(path)  # the file the user knows, not the temporary
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Write text through atomic_file: never half a file."""
    with atomic_file(path) as fh:
        fh.write(text)
