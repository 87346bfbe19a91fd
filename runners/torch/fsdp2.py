"""torch_fsdp2: FSDP2 in native PyTorch, fully_shard on each unit and on the root as torchtitan's
apply_fsdp does, over a 1-D DeviceMesh of the torchrun ranks; reshard_after_forward true is
ZeRO-3-like, false ZeRO-2-like; bf16/fp16 through MixedPrecisionPolicy. Differs from torchtitan:
the harness's models, SGD momentum 0.9 in place of AdamW, no activation checkpointing, no
torch.compile, synthetic data made on each device once. docs/runners/torch_fsdp2.md."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import DTensor

from contract.reasons import code
from models import get_spec, load_builder
from runners.common import Spec, main
from runners.memory import model_state_torch
from runners.torch import dist as td
from runners.torch.equivalence import probe_equivalence
from runners.torch.state import dtype_of, state_bytes, torch_precision

STRATEGY = code("torch.fsdp2_strategy")
COMPUTE = {"bf16": torch.bfloat16, "fp16": torch.float16}


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
    policy), then on the root. The policy: torchtitan's for a reduced precision (compute dtype,
    float32 reduce); fp32 and tf32: FSDP2's default (the parameters' own dtype throughout)."""
    policy = (MixedPrecisionPolicy(param_dtype=COMPUTE[precision], reduce_dtype=torch.float32)
              if precision in COMPUTE else MixedPrecisionPolicy())
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
                  momentum: float) -> tuple[td.Step, td.StepParts, DeviceMesh]:
    """The one step function of both modes: `net` sharded by apply_fsdp over a 1-D mesh of
    the ranks, torch.optim.SGD(lr, momentum) over its DTensor parameters, the policy's casts
    (no autocast), a ShardedGradScaler in fp16, the batch from `feed` (dist.sgd_step)."""
    mesh = init_device_mesh(ranks.device.type, (ranks.world,), mesh_dim_names=("dp_shard",))
    apply_fsdp(net, mesh, spec.options["reshard_after_forward"], spec.precision)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    scaler = ShardedGradScaler(device=ranks.device.type) if spec.precision == "fp16" else None
    parts = td.StepParts(net, td.StepCounter(optimizer), td.PlacementTracker(net), scaler,
                         cast=False)
    net.train()
    return td.sgd_step(ranks, spec.precision, parts, feed), parts, mesh


def start(spec: Spec) -> td.Ranks:
    """The ranks (the run's backend), the precision checked: bf16 needs a GPU with bfloat16
    (dist.check_precision); fp16 runs on CPUs too (the policy casts and ShardedGradScaler
    scales on any device)."""
    return td.init_ranks(spec, spec.options["backend"], check=spec.precision != "fp16")


def param_groups(net: nn.Module) -> list[tuple[str, Any]]:
    """Each FSDP module of `net` by name ("(root)"), with its state's FSDPParamGroup (None
    where it holds no parameters of its own)."""
    return [(name or "(root)", fully_shard.state(module)._fsdp_param_group)
            for name, module in net.named_modules() if isinstance(module, FSDPModule)]


def fsdp_record(net: nn.Module, mesh: DeviceMesh) -> dict[str, Any]:
    """What FSDP2 reports of the units: each FSDP module's parameters, whether it reshards
    after forward and its MixedPrecisionPolicy, read from its param_groups."""
    rows = [{"module": name, "params": 0} if group is None else {
        "module": name, "params": len(group.fsdp_params),
        "reshard_after_forward": bool(group._reshard_after_forward),
        "param_dtype": str(group.mp_policy.param_dtype),
        "reduce_dtype": str(group.mp_policy.reduce_dtype)} for name, group in param_groups(net)]
    return {"fsdp": {"mesh": {"shape": list(mesh.shape), "dim_names": list(
        mesh.mesh_dim_names or ()), "device_type": mesh.device_type}, "units": rows,
        "source": code("torch.fsdp2_param_group_source")}}


def reduce_dtype(net: nn.Module) -> torch.dtype:
    """The dtype FSDP2 reduce-scatters the gradients in, read from each sharded parameter
    (its reduce_dtype, else the dtype it computed its gradient in, else its own)."""
    dtypes = [torch.empty(0, dtype=fp.reduce_dtype or fp.param_dtype or fp.orig_dtype)
              for _, group in param_groups(net) if group is not None
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
    ranks = start(spec)
    model_spec, feed, net = td.rank_model(spec, ranks)
    fields = td.model_record(net, model_spec)  # counted on the whole model, before sharding
    step, parts, mesh = training_step(spec, ranks, net, feed, 0.01, 0.9)
    result = td.timed_steps(spec, ranks, step, parts.counter, parts.tracker, feed)
    return td.closing(
        ranks, result, td.nchw_fields(STRATEGY),
        {"reshard_after_forward": spec.options["reshard_after_forward"]}, fsdp_record(net, mesh),
        state_bytes(ranks, net.parameters(), parts.optimizer.state.values(),
                    code("torch.fsdp2_read_after_window")),
        torch_precision(spec.precision, parts.tracker, net, reduce_dtype(net),
                        how(net, parts.scaler), parts.scaler),
        fields, model_state_torch(net, parts.optimizer))


def whole_weights(net: nn.Module) -> dict[str, np.ndarray]:
    """The canonical weights of a plain probe holding the sharded `net`'s full weights
    (DTensor.full_tensor(): an all-gather every rank takes part in)."""
    from models.torch_common import get_canonical_weights

    plain = load_builder("probe", "torch")(get_spec("probe"))
    plain.load_state_dict({k: v.full_tensor() if isinstance(v, DTensor) else v
                           for k, v in net.state_dict().items()})
    return get_canonical_weights(plain)


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step (momentum 0) of the benchmark's step function on the probe, each rank
    on its slice of the batch, resident on its device; the full weights saved."""
    ranks = start(spec)
    reported: dict[str, Any] = {}

    def make_step(net: nn.Module, feed: td.Feed, lr: float) -> tuple[td.Step, td.StepParts]:
        step, parts, mesh = training_step(spec, ranks, net, feed, lr, 0.0)
        reported.update(fsdp_record(net, mesh)["fsdp"])
        return step, parts

    return probe_equivalence(spec, ranks, make_step, canonical=whole_weights, strategy=STRATEGY,
                             reshard_after_forward=spec.options["reshard_after_forward"],
                             fsdp=reported)


if __name__ == "__main__":
    main(benchmark, equivalence)
