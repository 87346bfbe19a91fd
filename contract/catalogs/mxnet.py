"""The MXNet family's runners (native Module/Gluon, Keras-MXNet) and its ImageRecordIter
pipeline, as the parent knows them: names, modules, options. Framework-free (bench.catalog.registry
imports it). A new runner of this family is one RunnerInfo below (docs/DESIGN.md, "Add a
runner")."""

from __future__ import annotations

from contract.catalog import LOADER_OPTION, Option, RunnerInfo

RUNNERS: list[RunnerInfo] = [
    RunnerInfo(
        "mxnet_native",
        "mxnet",
        "runners.mxnet.native",
        "native MXNet: hybridised Gluon net, a context per device, kvstore gradient reduce",
        options={
            "kvstore": Option(str, "device", ("device", "local", "nccl"),
                              "where gradients are summed (nccl: GPUs only)"),
            "hybridize": Option(bool, True, help="compile the Gluon net to a static graph"),
        },
        precisions=("fp32", "fp16"),  # fp16: GPUs only (no fp16 convolutions on CPU)
        equivalence_options=({"kvstore": "local"}, {"hybridize": False}),
        multi_node="a dist_sync kvstore: scheduler and servers beside the workers (ps-lite)",
        era="a 2017 system: its builders are the 2017 CNNs; transformers are not of its era",
        converges=True,
    ),
    RunnerInfo(
        "keras_mxnet",
        "mxnet",
        "runners.mxnet.keras_mxnet",
        "Keras 2.2 (keras-mxnet) compiled with a context list, trained with fit",
        options={
            "loader": LOADER_OPTION,
            "input": Option(str, "generator", ("generator", "arrays"),
                            "fit_generator on a batch generator, or fit on numpy arrays"),
            "gradient_reduce": Option(str, "mean", ("mean", "sum"),
                                      "mean: lr / N so N contexts step as 1 device; sum: "
                                      "keras-mxnet as is (N x the gradient)"),
        },
        # gradient_reduce sum steps N x as far by design: tests/test_mxnet_runners.py
        equivalence_options=({"input": "arrays"},),
        era="a 2017 system: its builders are the 2017 CNNs; transformers are not of its era",
        no_converge="not wired to the converge recipe (MXNet's own converges: mxnet_native)",
    ),
]

PIPELINES: list[RunnerInfo] = [
    RunnerInfo("mxnet_record_iter", "mxnet", "runners.mxnet.pipeline",
               "MXNet's C++ ImageRecordIter over train.rec (workers decode threads)",
               equivalence=False),
]

# The communication probe (mode: allreduce): the family's own all-reduce alone, no model, over
# buffers from 1 MiB to the model's gradient size (contract/collectives.py).
PROBES: list[RunnerInfo] = [
    RunnerInfo("mxnet_allreduce", "mxnet", "runners.mxnet.allreduce_probe",
               "MXNet kvstore 'device' pushpull (sum) over N contexts in one process, as "
               "Gluon's Trainer reduces gradients",
               equivalence=False),
]
