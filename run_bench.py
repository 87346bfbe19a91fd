#!/usr/bin/env python3
"""Entry point: `python run_bench.py --config configs/cpu-smoke.yaml` (see README.md)."""

import os
import sys

from bench.cli import main

if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:  # output piped into `head` and closed early: not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
