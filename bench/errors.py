"""Bad input, as every stage reports it: one line naming the key, the value and what is
allowed (the cli prints it as the single line of stderr and exits 2); and what to do about a
write that failed (`write_remedy`). A leaf: imports nothing from bench, so every stage may
use it."""

from __future__ import annotations

import errno

# a write that failed for want of room: freeing space is the remedy
NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def write_remedy(exc: OSError) -> str:
    """What to do before trying again after exc: free space where the disk (or a size limit)
    was full; else what is wrong with the path (a folder where a file belongs, a permission)."""
    if exc.errno in NO_ROOM:
        return "free space"
    where = exc.filename or "the results folder"
    if exc.errno == errno.EISDIR:
        return f"move the folder {where} away (a file is written there)"
    if exc.errno == errno.ENOTDIR:
        return f"move the file in the path {where} away (a folder belongs there)"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"let this user write {where}"
    return f"make {where} writable"


class ConfigError(ValueError):
    """A bad config: the message is one line naming the key, the value and what is allowed."""

    def __init__(self, message: str) -> None:
        # one line whatever went into it: the CLI prints it as the single line of stderr
        super().__init__(" ".join(str(message).splitlines()))
