#!/usr/bin/env python3
"""Entry point: `python run_bench.py --config configs/cpu-smoke.yaml` (see README.md)."""

import os
import signal


def _stopped_while_starting(signum: int, _frame: object) -> None:
    os._exit(128 + signum)  # nothing is written yet: end quietly, as the command would


if __name__ == "__main__":
    # a stop while the modules import ends the command with one exit code, no traceback;
    # bench.cli.entry puts the command's own handling in place before anything is written
    for _sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(_sig, _stopped_while_starting)
    from bench.cli import entry

    entry()
