"""torch_ddp: native PyTorch DistributedDataParallel, one process (rank) per device started by
torchrun (NCCL between GPUs, gloo between virtual CPU devices), each rank stepping on its own B/N
slice. GPU defaults (channels_last, torch.compile, cudnn.benchmark, fused SGD, bucket views) are
recorded as torch reports them back. Differs from PyTorch 2.13's DDP tutorials: synthetic data
made on each device once; converge holds the splits in memory. docs/runners/torch_ddp.md."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from contract.reasons import code
from contract.result import join
from models import ModelSpec, spec_of
from runners.common import Invalid, Spec, main
from runners.converge import Recipe, fitting_splits
from runners.memory import model_state_torch
from runners.torch import dist as td
from runners.torch.compile_evidence import compile_record
from runners.torch.cross_entropy import CrossEntropy
from runners.torch.equivalence import probe_equivalence
from runners.torch.rank_converge import ConvergeModel, RankConverge, torch_bn_stats
from runners.torch.state import AFTER_WINDOW, autocast_precision, state_bytes

OPTIMIZER_IMPLS = {"foreach": {"foreach": True}, "fused": {"fused": True},
                   "for-loop": {"foreach": False}}
STRATEGY = code("torch.ddp_strategy")


def start(spec: Spec) -> tuple[td.Ranks, dict[str, Any]]:
    """Every mode's first steps: the ranks (the run's backend), the precision checked,
    torch.backends.cudnn.benchmark as the run's option says (GPUs), read back; on CPUs there
    is no cuDNN and the option does nothing, recorded as such. A compile_mode other than
    default without compile is Invalid (as keras_tf_avolkov1's nccl without average_gradients)."""
    if spec.options["compile_mode"] != "default" and not spec.options["compile"]:
        raise Invalid(f"compile_mode {spec.options['compile_mode']} is torch.compile's mode: "
                      "set compile: true (or leave compile_mode default)")
    ranks = td.init_ranks(spec, spec.options["backend"], check=True)
    wanted = spec.options["cudnn_benchmark"]
    if ranks.cuda:
        torch.backends.cudnn.benchmark = wanted
    return ranks, {"cudnn_benchmark": {
        "option": wanted, "torch.backends.cudnn.benchmark": torch.backends.cudnn.benchmark,
        "in_effect": ranks.cuda and torch.backends.cudnn.is_available(),
        **({} if ranks.cuda else {"note": "no-op on CPU (no cuDNN)"})}}


def ddp_parts(spec: Spec, ranks: td.Ranks, net: nn.Module, lr: float, momentum: float,
              weight_decay: float = 0.0) -> tuple[td.StepParts, dict[str, Any]]:
    """Every mode's step parts: `net` (on the rank's device) in DDP (gradients as bucket views
    when the run says so), compiled in its `compile_mode` when it says `compile`; SGD in the
    run's `optimizer_impl` (counted); fp16's GradScaler; the loss in the run's `cross_entropy`
    (read back: `parts.loss.record()`). With what DDP and the optimizer report of those
    settings."""
    ddp = td.wrap_ddp(net, ranks, spec.options["gradient_as_bucket_view"])
    compiled = spec.options["compile"]
    model: nn.Module = torch.compile(ddp, mode=spec.options["compile_mode"]) if compiled else ddp
    impl = spec.options["optimizer_impl"]
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum,
                                weight_decay=weight_decay, **OPTIMIZER_IMPLS[impl])
    scaler = torch.amp.GradScaler("cuda") if spec.precision == "fp16" else None
    parts = td.StepParts(model, td.StepCounter(optimizer), td.PlacementTracker(net), scaler,
                         loss=CrossEntropy(spec.options["cross_entropy"]))
    model.train()
    reported = {"optimizer": {"impl": impl, "class": "torch.optim.SGD",
                              "foreach": optimizer.defaults.get("foreach"),
                              "fused": optimizer.defaults.get("fused")},
                "gradient_as_bucket_view": bool(ddp.gradient_as_bucket_view)}
    return parts, reported


def run_fields(spec: Spec, ranks: td.Ranks, net: nn.Module, model_spec: ModelSpec,
               parts: td.StepParts, when: str) -> dict[str, Any]:
    """What a benchmark and a converge result say of the run alike: versions, layout,
    precision, compilation, the model, its state (read `when`)."""
    layout, scaler, optimizer = spec.options["memory_format"], parts.scaler, parts.optimizer
    return join({
        "framework": td.framework_versions(),
        "layout": layout,
        "memory_format": str(td.MEMORY_FORMATS[layout]),
        "precision_details": {"autocast": {"fp32": None, "tf32": None, "bf16": "bfloat16",
                                           "fp16": "float16"}[spec.precision],
                              "grad_scaler": scaler is not None,
                              "weights": "float32"},
        "strategy": STRATEGY,
    }, compile_record(spec.options, ranks.device), td.model_record(net, model_spec),
        model_state_torch(net, optimizer),
        state_bytes(ranks, net.parameters(), optimizer.state.values(), when),
        autocast_precision(spec.precision, ranks, parts, net))


def benchmark(spec: Spec) -> dict[str, Any]:
    ranks, cudnn = start(spec)
    model_spec, feed, net = td.rank_model(spec, ranks, spec.options["memory_format"])
    parts, reported = ddp_parts(spec, ranks, net, 0.01, 0.9)
    result = td.timed_steps(spec, ranks, td.sgd_step(ranks, spec.precision, parts, feed),
                         parts.counter, parts.tracker, feed)
    return td.closing(ranks, result, run_fields(spec, ranks, net, model_spec, parts, AFTER_WINDOW),
                      cudnn, reported, parts.loss.record())


def converge(spec: Spec) -> dict[str, Any]:
    """Mode converge: the benchmark's model and step parts (ddp_parts), SGD with the recipe's
    momentum and weight decay, initial weights from torch.manual_seed(recipe.seed) (DDP
    broadcasts rank 0's anyway), through RankConverge; rank 0 evaluates the plain module in
    eval mode (outside DDP, whose broadcast_buffers leaves the ranks' statistics differing)."""
    layout = spec.options["memory_format"]
    recipe = Recipe.of(spec)
    ranks, cudnn = start(spec)
    model_spec = spec_of(spec)
    splits = fitting_splits(spec, model_spec)
    torch.manual_seed(recipe.seed)
    net = td.build_model(spec, model_spec, layout, ranks.device)
    parts, reported = ddp_parts(spec, ranks, net, recipe.base_lr, recipe.momentum,
                                recipe.weight_decay)

    def to_input(x: np.ndarray) -> torch.Tensor:  # NHWC pixels -> NCHW in the memory format
        t = torch.from_numpy(x).to(ranks.device).permute(0, 3, 1, 2)
        return t.contiguous(memory_format=td.MEMORY_FORMATS[layout])

    def infer(x: torch.Tensor) -> torch.Tensor:
        net.eval()
        try:
            return net(x)
        finally:
            net.train()

    loop = RankConverge(ranks, spec.precision, parts,
                        ConvergeModel(to_input, infer, lambda: torch_bn_stats(net)))
    return td.closing(ranks, loop.run(spec, splits),
                      run_fields(spec, ranks, net, model_spec, parts,
                                 "read after the last epoch's last step"), cudnn, reported,
                      {"loop": code("torch.ddp_converge_loop")})


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step (momentum 0) of the benchmark's step function on the probe, each rank
    on its slice of the batch, resident on its device; weights saved."""
    ranks, cudnn = start(spec)
    reported: dict[str, Any] = {}
    held: list[td.StepParts] = []

    def make_step(net: nn.Module, feed: td.Feed, lr: float) -> tuple[td.Step, td.StepParts]:
        parts, own = ddp_parts(spec, ranks, net, lr, 0.0)
        reported.update(own)
        held.append(parts)
        return td.sgd_step(ranks, spec.precision, parts, feed), parts

    result = probe_equivalence(spec, ranks, make_step, spec.options["memory_format"])
    return join(result, compile_record(spec.options, ranks.device), cudnn, reported,
                held[0].loss.record())


if __name__ == "__main__":
    main(benchmark, equivalence, converge)
