"""Runners: one module per strategy, each run as `python -m runners.<name>` in a child process."""
