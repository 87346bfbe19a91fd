"""Keras 2.2 on CNTK 2.7 (seed 003): a family with no environment on this machine's Python."""
