"""Bad input, as every stage reports it: one line naming the key, the value and what is
allowed (the cli prints it as the single line of stderr and exits 2). A leaf: imports nothing
from bench, so every stage may raise it."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad config: the message is one line naming the key, the value and what is allowed."""

    def __init__(self, message: str) -> None:
        # one line whatever went into it: the CLI prints it as the single line of stderr
        super().__init__(" ".join(str(message).splitlines()))
