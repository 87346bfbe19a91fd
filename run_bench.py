#!/usr/bin/env python3
"""Entry point: `python run_bench.py --config configs/cpu-smoke.yaml` (see README.md)."""

import os
import signal
import sys

from bench.cli import main


def _quiet_exit(code: object) -> None:
    """Exit once the command is done: a Ctrl-C (or SIGTERM, SIGHUP) that lands while the
    interpreter finalizes would run a Python handler with no thread state (a fatal error,
    SIGABRT); everything is written by now, so they are ignored from here on."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    sys.exit(code)


if __name__ == "__main__":
    try:
        code = main()
    except BrokenPipeError:  # output piped into `head` and closed early: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    except SystemExit as exc:  # argparse's exits (--help, a usage error) keep their code
        _quiet_exit(exc.code)  # type: ignore[arg-type]
    _quiet_exit(code)
