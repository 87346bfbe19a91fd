"""FSDP2 in native PyTorch: torch.distributed.fsdp.fully_shard on each block and on the root, as
torchtitan's parallelize step applies it (apply_fsdp: fully_shard per TransformerBlock, then on
the whole model), one process (rank) per device, started by torchrun.

Processes: as torch_ddp (runners/torch/ddp.py): torchrun starts N ranks, each joins the
process group (backend auto: NCCL between GPUs, gloo between virtual CPU devices) and drives
one device; a 1-D DeviceMesh over the N ranks (init_device_mesh(device type, (N,),
mesh_dim_names=("dp_shard",)), torchtitan's name for the FSDP dimension) is the mesh every
fully_shard shards over. The ranks, their input, the step counter, the timed steps and the
placement are runners/torch/dist.py's, shared with torch_ddp.
Split: every rank holds its own B/N slice of the global batch, made on its device once (or
its DistributedSampler share of the real data, as torch_ddp).
Parameters: each parameter becomes a DTensor sharded on dim 0 over the mesh (Shard(0)); each
rank keeps 1/N of every parameter (FSDP2 pads dim 0 to a multiple of N internally), its
gradients likewise (p.grad is a DTensor shard after the reduce-scatter) and the optimizer's
momentum buffers too (torch.optim.SGD over the DTensor parameters makes DTensor state): ZeRO-3.
The units (the modules fully_shard is applied to, each one all-gather before its forward and
backward and one reduce-scatter after its backward): a harness transformer (gpt2, vit_b16 and
their tiny versions: models/transformer_torch.py) has its blocks in `blocks`, and each block is
a unit, as torchtitan shards each TransformerBlock; the embeddings, final norm and (tied) head
stay with the root unit, as in torchtitan. A model without `blocks` (the CNNs, a user's model)
has each top-level child module that holds parameters as a unit (a CNN's stem, its stages,
its classifier; resnet50's conv1, bn1, layer1..4, fc), the nearest thing to a block a generic
module offers; minigooglenet's `blocks` (its inception and downsample modules) are its units.
A user's model that uses one child's weights inside another's forward (tied weights across
children) fails there with FSDP2's error, as it would under fully_shard.
Option reshard_after_forward (default true): true is torchtitan's default policy, every unit
but the last resharded after its forward and all-gathered again in backward (the last one's
backward runs first, at once), the root as given (ZeRO-3-like); false keeps every unit's
parameters unsharded from its forward to its backward (ZeRO-2-like: no all-gather in
backward, the full parameters held over forward). At rest (after backward and the step) the
parameters are sharded either way: reshard_after_backward is FSDP2's default. Read back:
each unit's FSDPParamGroup says whether it reshards after forward (the record's `fsdp`).
Reduce: each unit's gradients are reduce-scattered (FSDP2 divides by N: the mean over the
ranks), so each rank holds its shard of the gradient of the global mean loss; torch.optim.SGD
steps each rank's shards (synchronous data parallelism, identical to one device with batch B).
Synchronise: backward returns when the reduce-scatters are done; .item() on the loss (and
torch.cuda.synchronize on GPUs) ends each timed step, as torch_ddp.
Count: the optimizer's own step hooks count the applied steps; the ranks' counts must agree.
Placement: as torch_ddp, each rank's batch rows and device and its (DTensor) parameters'
device, gathered over the process group.
State: after the timed window (the last timed step's backward and step done; gradient shards
kept until the next zero_grad), each rank's parameters, .grad and optimizer state as DTensors:
to_local() bytes on the rank against the DTensor's global shape (runners/torch/state.py).
Precision: FSDP2's MixedPrecisionPolicy, as torchtitan sets it: bf16 is
MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32): float32 sharded parameters
(the master weights the optimizer steps), all-gathered and computed in bfloat16, gradients
reduce-scattered in float32; fp16 likewise with float16 and torch's ShardedGradScaler
(dynamic loss scaling, its inf check all-reduced over the ranks), on CPUs too. No autocast: the
policy casts. BatchNorm modules are units of their own with a policy that keeps their
parameters float32 (FSDP1's mixed precision kept BatchNorm in float32 by default; torch's CPU
batch_norm refuses bfloat16 weights with float32 running statistics). The policy is read back
from the units (`fsdp`), the compute dtype from the logits, into `precision_policy`.
Equivalence: the benchmark's step function (fully_shard per unit and root, the run's policy,
plain SGD without momentum, the resident-tensor input) on the probe (units: its conv and its
dense), one step; the weights gathered to full tensors (DTensor.full_tensor()) on every rank.
Follows PyTorch 2.13's fully_shard as torchtitan uses it; what differs: the harness's models
and SGD momentum 0.9 in place of torchtitan's AdamW (the same optimizer as every strategy),
no activation checkpointing, no torch.compile, synthetic data made on each device once; the
buffers (BatchNorm's running statistics) are each rank's own (FSDP2 does not broadcast them,
DDP does), which changes no gradient.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import DTensor

from models import get_spec, load_builder
from runners.common import Spec, main
from runners.memory import model_state_torch
from runners.torch import dist as td
from runners.torch.state import dtype_of, state_bytes, torch_precision

STRATEGY = ("torch.distributed.fsdp.fully_shard (FSDP2) per block and on the root over a 1-D "
            "DeviceMesh, one process per device (torchrun); parameters, gradients and "
            "optimizer state sharded (DTensor Shard(0))")
COMPUTE = {"bf16": torch.bfloat16, "fp16": torch.float16}


def mp_policy(precision: str) -> MixedPrecisionPolicy:
    """torchtitan's policy for a reduced precision (compute dtype, float32 reduce); fp32 and
    tf32: FSDP2's default (the parameters' own dtype throughout)."""
    if precision not in COMPUTE:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=COMPUTE[precision], reduce_dtype=torch.float32)


def units(net: nn.Module) -> list[tuple[str, nn.Module]]:
    """The modules that become FSDP units before the root: each of `blocks` where the model
    has them (the transformers' blocks, minigooglenet's), else each top-level child that
    holds parameters."""
    blocks = getattr(net, "blocks", None)
    if isinstance(blocks, (nn.ModuleList, nn.Sequential)) and len(blocks):
        return [(f"blocks.{i}", b) for i, b in enumerate(blocks)]
    return [(name, child) for name, child in net.named_children()
            if next(child.parameters(), None) is not None]


def apply_fsdp(net: nn.Module, mesh: DeviceMesh, reshard: bool, precision: str) -> None:
    """fully_shard on each BatchNorm (float32 parameters) where a policy casts, on each unit
    (every one but the last resharded after forward when `reshard`: torchtitan's default
    policy), then on the root."""
    policy = mp_policy(precision)
    if policy.param_dtype is not None:
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                fully_shard(m, mesh=mesh, reshard_after_forward=reshard,
                            mp_policy=MixedPrecisionPolicy(reduce_dtype=torch.float32))
    parts = units(net)
    for i, (_, module) in enumerate(parts):
        fully_shard(module, mesh=mesh, mp_policy=policy,
                    reshard_after_forward=reshard and i < len(parts) - 1)
    fully_shard(net, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard)


def training_step(spec: Spec, ranks: td.Ranks, net: nn.Module, feed: td.Feed, lr: float,
                  momentum: float
                  ) -> tuple[td.Step, td.StepCounter, td.PlacementTracker,
                             ShardedGradScaler | None, torch.optim.Optimizer, DeviceMesh]:
    """The one step function of both modes: `net` sharded by apply_fsdp over a 1-D mesh of
    the ranks, torch.optim.SGD(lr, momentum) over its DTensor parameters, the policy's casts
    (no autocast), a ShardedGradScaler in fp16, the batch from `feed` (dist.sgd_step)."""
    mesh = init_device_mesh(ranks.device.type, (ranks.world,), mesh_dim_names=("dp_shard",))
    apply_fsdp(net, mesh, spec.options["reshard_after_forward"], spec.precision)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    counter = td.StepCounter(optimizer)
    tracker = td.PlacementTracker(net)
    scaler = ShardedGradScaler(device=ranks.device.type) if spec.precision == "fp16" else None
    net.train()
    return (td.sgd_step(ranks, spec.precision, net, optimizer, feed, tracker, counter, scaler,
                     cast=False), counter, tracker, scaler, optimizer, mesh)


def check_fsdp_precision(spec: Spec, ranks: td.Ranks) -> None:
    """bf16 needs a GPU with bfloat16 (dist.check_precision); fp16 runs on CPUs too (the policy
    casts and ShardedGradScaler scales on any device)."""
    if spec.precision != "fp16":
        td.check_precision(spec, ranks)


def fsdp_record(net: nn.Module, mesh: DeviceMesh) -> dict[str, Any]:
    """What FSDP2 reports of the units: each FSDP module's parameters, whether it reshards
    after forward and its MixedPrecisionPolicy, read from its state's FSDPParamGroup."""
    rows = []
    for name, module in net.named_modules():
        if not isinstance(module, FSDPModule):
            continue
        group = fully_shard.state(module)._fsdp_param_group
        if group is None:
            rows.append({"module": name or "(root)", "params": 0})
            continue
        policy = group.mp_policy
        rows.append({"module": name or "(root)", "params": len(group.fsdp_params),
                     "reshard_after_forward": bool(group._reshard_after_forward),
                     "param_dtype": str(policy.param_dtype), "reduce_dtype":
                         str(policy.reduce_dtype)})
    return {"fsdp": {"mesh": {"shape": list(mesh.shape), "dim_names": list(
        mesh.mesh_dim_names or ()), "device_type": mesh.device_type}, "units": rows,
        "source": "each FSDPModule's fully_shard.state(module)._fsdp_param_group: its "
                  "fsdp_params, _reshard_after_forward and mp_policy"}}


def reduce_dtype(net: nn.Module) -> torch.dtype:
    """The dtype FSDP2 reduce-scatters the gradients in, read from each sharded parameter
    (its reduce_dtype, else the dtype it computed its gradient in, else its own)."""
    dtypes = [torch.empty(0, dtype=fp.reduce_dtype or fp.param_dtype or fp.orig_dtype)
              for module in net.modules() if isinstance(module, FSDPModule)
              and (group := fully_shard.state(module)._fsdp_param_group) is not None
              for fp in group.fsdp_params]
    return dtype_of(dtypes, "FSDP2's reduce-scatters")


def how(net: nn.Module, scaler: ShardedGradScaler | None) -> str:
    policy = fully_shard.state(net)._mp_policy
    text = (f"fully_shard(mp_policy=MixedPrecisionPolicy(param_dtype={policy.param_dtype}, "
            f"reduce_dtype={policy.reduce_dtype}))").replace("torch.", "")
    if policy.param_dtype is not None and any(
            isinstance(m, nn.modules.batchnorm._BatchNorm) for m in net.modules()):
        text += "; BatchNorm units MixedPrecisionPolicy(reduce_dtype=float32)"
    if scaler is not None:
        text += " + torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler"
    return text


def benchmark(spec: Spec) -> dict[str, Any]:
    ranks = td.init_ranks(spec, spec.options["backend"])
    check_fsdp_precision(spec, ranks)
    model_spec, feed, net = td.rank_model(spec, ranks)
    fields = td.model_record(net, model_spec)  # counted on the whole model, before sharding
    step, counter, tracker, scaler, optimizer, mesh = training_step(spec, ranks, net, feed,
                                                                    0.01, 0.9)
    result = td.timed_steps(spec, ranks, step, counter, tracker, feed)
    result.update({
        "framework": td.framework_versions(),
        "layout": "channels_first",
        "strategy": STRATEGY,
        "reshard_after_forward": spec.options["reshard_after_forward"],
        **fsdp_record(net, mesh),
        **state_bytes(ranks, net.parameters(), optimizer.state.values(),
                      "after the timed window (the last timed step's backward and "
                      "optimizer.step() done; the gradient shards are kept until the next "
                      "zero_grad; the parameters resharded after backward)"),
        **torch_precision(spec.precision, tracker, net, reduce_dtype(net),
                          how(net, scaler), "dynamic" if scaler is not None else None),
        **fields,
        **model_state_torch(net, optimizer),
    })
    ranks.close()
    return result


def whole_probe(net: nn.Module) -> nn.Module:
    """A plain probe holding the sharded `net`'s full weights (DTensor.full_tensor(): an
    all-gather every rank takes part in)."""
    plain = load_builder("probe", "torch")(get_spec("probe"))
    plain.load_state_dict({k: v.full_tensor() if isinstance(v, DTensor) else v
                           for k, v in net.state_dict().items()})
    return plain


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step (momentum 0) of the benchmark's step function on the probe, each rank
    on its slice of the batch, resident on its device; the full weights saved."""
    ranks = td.init_ranks(spec, spec.options["backend"])
    check_fsdp_precision(spec, ranks)
    reported: dict[str, Any] = {}

    def make_step(net: nn.Module, feed: td.Feed, lr: float
                  ) -> tuple[td.Step, td.StepCounter, td.PlacementTracker]:
        step, counter, tracker, _, _, mesh = training_step(spec, ranks, net, feed, lr, 0.0)
        reported.update(fsdp_record(net, mesh)["fsdp"])
        return step, counter, tracker

    return td.probe_equivalence(spec, ranks, make_step, whole=whole_probe, strategy=STRATEGY,
                             reshard_after_forward=spec.options["reshard_after_forward"],
                             fsdp=reported)


if __name__ == "__main__":
    main(benchmark, equivalence)
