"""Keras-CNTK and the Keras PyDataset pipeline (Keras's own, across backends), as the parent
knows them: names, modules, options. Framework-free (bench.catalog.registry imports it). A new
runner of
this family is one RunnerInfo below (docs/DESIGN.md, "Add a runner")."""

from __future__ import annotations

from contract.catalog import RunnerInfo

RUNNERS: list[RunnerInfo] = [
    RunnerInfo(
        "keras_cntk",
        "cntk",
        "runners.keras.cntk",
        "Keras 2.2 on CNTK 2.7 with MPI data parallelism (seed 003); cannot run here",
        equivalence=False,
        unavailable=("CNTK 2.7 ships wheels only for Python 2.7, 3.5 and 3.6, none for "
                     "this machine's Python; needs a Python 3.6 env with cntk 2.7, "
                     "keras 2.2.4 and MPI (runners/keras/cntk.py says how)"),
        era="a 2017 system: its builders are the 2017 CNNs; transformers are not of its era",
    ),
]

PIPELINES: list[RunnerInfo] = [
    RunnerInfo("keras_pydataset", "jax", "runners.keras.pipeline",
               "Keras 3 PyDataset over the JPEG file list (the Keras-idiomatic path): "
               "Pillow decode in workers processes", equivalence=False),
]
