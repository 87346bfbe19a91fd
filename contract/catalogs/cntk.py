"""Keras-CNTK (seed 003), as the parent knows it: its name, module and why it cannot run here.
Framework-free (bench.catalog.registry imports it)."""

from __future__ import annotations

from contract.catalog import RunnerInfo

RUNNERS: list[RunnerInfo] = [
    RunnerInfo(
        "keras_cntk",
        "cntk",
        "runners.cntk.keras_cntk",
        "Keras 2.2 on CNTK 2.7 with MPI data parallelism (seed 003); cannot run here",
        equivalence=False,
        unavailable=("CNTK 2.7 ships wheels only for Python 2.7, 3.5 and 3.6, none for "
                     "this machine's Python; needs a Python 3.6 env with cntk 2.7, "
                     "keras 2.2.4 and MPI (runners/cntk/keras_cntk.py says how)"),
        era="a 2017 system: its builders are the 2017 CNNs; transformers are not of its era",
    ),
]
