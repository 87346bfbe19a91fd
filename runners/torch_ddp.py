"""Native PyTorch DistributedDataParallel: one process (rank) per device, started by torchrun.

Processes: the parent starts `torch.distributed.run --standalone --nproc-per-node=N`; each
rank joins one process group (backend `auto`: NCCL between GPUs, gloo on CPUs) and drives one
device, cuda:LOCAL_RANK on GPUs. On a CPU the N devices are N gloo processes sharing the
host's cores (virtual devices), each with the intra-op threads OMP_NUM_THREADS gives it
(torchrun's default is 1 per rank when N > 1 and nothing set it); records list them per rank.
Split: every rank holds its own B/N slice of the global batch, generated once on its device
(seeded by rank), so a step copies nothing from the host. Real data: each rank reads B/N
images per step from its DistributedSampler share of the JPEG file list through a DataLoader
with `workers` processes, pinned memory and a non_blocking copy on GPUs (DALI instead when it
is installed on a GPU machine; runners/torch_data.py); the timed window includes it.
Parameters: one full replica per rank; DDP broadcasts rank 0's at construction, so all
replicas start equal.
Reduce: each rank's loss is the mean cross-entropy over its slice; during backward DDP
all-reduces gradient buckets (NCCL or gloo, overlapped with the rest of backward) and divides
by N, so every rank holds the gradient of the global mean loss and applies the same SGD update
(synchronous data parallelism, identical to one device with batch B).
Synchronise: backward returns only when DDP's all-reduces are done, so the ranks are in step
without a barrier; on GPUs torch.cuda.synchronize() ends each timed step, and reading the loss
with .item() waits for the step on every device before the clock is read.
Count: the optimizer's own post-step hook counts applied steps, independently of the loop;
the ranks' counts must agree, and samples are their sum of images stepped on.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from models import get_spec, load_builder
from models.torch_common import (
    count_flops_torch,
    count_params_torch,
    get_canonical_weights,
    set_canonical_weights,
)
from runners.common import (
    Spec,
    load_equivalence_inputs,
    main,
)
from runners.torch_dist import (
    MEMORY_FORMATS,
    StepCounter,
    autocast,
    check_precision,
    close_ranks,
    equivalence_part,
    finish_equivalence,
    framework_versions,
    init_ranks,
    nchw,
    per_rank_batch,
    rank_input,
    threads_record,
    timed_steps,
    wrap_ddp,
)


def benchmark(spec: Spec) -> dict[str, Any]:
    opts = spec["options"]
    layout = opts.get("memory_format", "channels_first")
    compiled = bool(opts.get("compile", False))
    ranks = init_ranks(spec, opts.get("backend", "auto"))
    check_precision(spec, ranks)
    batch = per_rank_batch(spec, ranks)
    model_spec = get_spec(spec["model"])
    feed = rank_input(spec, ranks, model_spec, batch, nchw(model_spec),
                      memory_format=MEMORY_FORMATS[layout])
    torch.manual_seed(0)  # the same initial weights everywhere (DDP broadcasts rank 0's too)
    net = load_builder(spec["model"], "torch")(model_spec, data_format=layout).to(ranks.device)
    model: nn.Module = wrap_ddp(net, ranks)
    if compiled:
        model = torch.compile(model)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    counter = StepCounter(optimizer)
    scaler = torch.amp.GradScaler("cuda") if spec["precision"] == "fp16" else None
    model.train()

    def step() -> torch.Tensor:
        x, y = feed.next()
        optimizer.zero_grad(set_to_none=True)
        with autocast(ranks, spec["precision"]):
            loss = F.cross_entropy(model(x).float(), y)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scale = scaler.get_scale()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            counter.skipped += scaler.get_scale() < scale  # the scaler backs off after a skip
        return loss.detach()

    result = timed_steps(spec, ranks, step, counter, batch)
    result.update({
        "replicas": ranks.world,
        "framework": framework_versions(),
        "devices": ranks.devices,
        "layout": layout,
        "memory_format": str(MEMORY_FORMATS[layout]),
        "precision_details": {"autocast": {"fp32": None, "bf16": "bfloat16",
                                           "fp16": "float16"}[spec["precision"]],
                              "grad_scaler": scaler is not None,
                              "weights": "float32"},
        "compile": compiled,
        "backend": ranks.backend,
        "strategy": "torch.nn.parallel.DistributedDataParallel, one process per device "
                    "(torchrun); gradients all-reduced in buckets during backward",
        "threads": threads_record(ranks),
        "params": count_params_torch(net),
        "flops_per_sample": count_flops_torch(net, nchw(model_spec)),
    })
    result.update(feed.record())
    feed.close()
    close_ranks()
    return result


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step on the probe, each rank on its slice of the batch; weights saved."""
    opts = spec["options"]
    layout = opts.get("memory_format", "channels_first")
    ranks = init_ranks(spec, opts.get("backend", "auto"))
    weights, x, y, lr = load_equivalence_inputs(spec)
    x_part, ys = equivalence_part(x, y, ranks)
    net = load_builder("probe", "torch")(get_spec("probe"), data_format=layout)
    set_canonical_weights(net, weights)
    net = net.to(ranks.device)
    model = wrap_ddp(net, ranks)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr)
    xs = torch.from_numpy(np.ascontiguousarray(x_part.transpose(0, 3, 1, 2)))  # NHWC in
    xs = xs.to(ranks.device).contiguous(memory_format=MEMORY_FORMATS[layout])
    loss = F.cross_entropy(model(xs), ys)
    loss.backward()
    optimizer.step()
    return finish_equivalence(spec, ranks, loss, lambda: get_canonical_weights(net), layout)


if __name__ == "__main__":
    main(benchmark, equivalence)
