#!/usr/bin/env python3
"""Entry point: `python run_bench.py --config configs/cpu-smoke.yaml` (see README.md)."""

import sys

from bench.cli import main

if __name__ == "__main__":
    sys.exit(main())
