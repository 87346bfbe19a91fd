#!/usr/bin/env python3
"""Entry point: `python run_bench.py --config configs/cpu-smoke.yaml` (see README.md)."""

from bench.cli import entry

if __name__ == "__main__":
    entry()
