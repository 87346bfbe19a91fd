"""Runners: one module per strategy, grouped by framework family (tf/, mxnet/, torch/, jax/,
keras/ for what the Keras runners share), each run as `python -m runners.<family>.<name>` in a
child process; their catalogs and what they share with the parent are in contract/. The top
level holds what every family uses: common.py (main, the timed loop), real_data.py,
peak_probe.py, math_mode.py, threads.py and the harness's own pipeline_pil.py."""
