"""deepspeed: DeepSpeed 0.19 ZeRO stage 1, 2 or 3 (option `stage`) over a torch SGD (client
optimizer), one process per device; state and precision read back from ZeRO's own structures in
one extra untimed step. Differs from DeepSpeed's tutorials: torchrun in place of the `deepspeed`
launcher, a torch optimizer in place of fused Adam, synthetic data made on each device once.
docs/runners/deepspeed.md."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from contract.precision_policy import resolve
from contract.reasons import code
from contract.result import join
from runners import memory
from runners.common import Invalid, Spec, Unavailable, main
from runners.memory import _state
from runners.torch import deepspeed_memory as dm
from runners.torch import dist as td
from runners.torch.data import SyntheticInput
from runners.torch.equivalence import probe_equivalence


def extensions_dir() -> Path:
    """Where DeepSpeed's JIT-built ops live: inside the environment (envs/deepspeed_build.py
    builds them there at install), not the user's ~/.cache/torch_extensions."""
    return Path(sys.prefix) / "torch_extensions"


def init_deepspeed(spec: Spec) -> tuple[Any, td.Ranks]:
    """deepspeed imported, its accelerator set to the run's device and its environment as its
    launcher would leave it (docs/runners/deepspeed.md, Processes; Unavailable if it is not
    installed); the torchrun process group, adopted by deepspeed.init_distributed (the backend
    DeepSpeed's accelerator would pick must be the group's); the precision checked."""
    os.environ["DS_ACCELERATOR"] = "cuda" if spec.device == "gpu" else "cpu"
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(extensions_dir()))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    os.environ.setdefault("CROSS_RANK", os.environ.get("GROUP_RANK", "0"))
    os.environ.setdefault("CROSS_SIZE", str(max(1, int(os.environ.get("WORLD_SIZE", "1"))
                                                // max(1, local))))
    try:
        import deepspeed
    except ImportError as exc:
        raise Unavailable(f"deepspeed is not installed in {sys.executable} ({exc}); it is in "
                          "envs/torch-cpu.txt and envs/torch-gpu.txt") from None
    ranks = td.init_ranks(spec, "auto")
    from deepspeed.accelerator import get_accelerator

    accel = get_accelerator()
    wanted = accel.communication_backend_name()
    if wanted != ranks.backend:
        raise Unavailable(f"DeepSpeed's {accel.device_name()} accelerator communicates over "
                          f"{wanted}; the harness's torchrun group is {ranks.backend}")
    deepspeed.init_distributed(dist_backend=ranks.backend, verbose=False)
    td.check_precision(spec, ranks)
    return deepspeed, ranks


def ds_config(spec: Spec, micro_batch: int, stage: int) -> dict[str, Any]:
    """The DeepSpeed config of the run: ZeRO `stage`, this rank's batch, no accumulation, the
    client optimizer allowed, gradients reduced in fp32, the precision's section."""
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage,
                              "reduce_bucket_size": int(spec.options["reduce_bucket_size"])},
        "zero_allow_untested_optimizer": True,
        "communication_data_type": "fp32",
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
    if spec.precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif spec.precision == "fp16":
        config["fp16"] = {"enabled": True, "loss_scale": 0}  # 0: dynamic loss scaling
    if spec.precision in ("bf16", "fp16"):
        # DeepSpeed casts the parameters only, buffers when data_types.buffer_dtype says so:
        # a BatchNorm's bf16 weight beside fp32 running statistics fails in torch's batch_norm
        config["data_types"] = {"buffer_dtype": spec.precision}
    return config


class Engine:
    """deepspeed.initialize over `net` and a torch SGD, and the one step function of both modes
    (forward, engine.backward, engine.step); `last` keeps the step's batch for the state
    reading."""

    def __init__(self, deepspeed: Any, spec: Spec, ranks: td.Ranks, net: nn.Module, feed: td.Feed,
                 lr: float, momentum: float) -> None:
        self.spec, self.ranks, self.feed = spec, ranks, feed
        self.stage = int(spec.options["stage"])
        sgd = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
        self.counter = td.StepCounter(sgd)
        self.config = ds_config(spec, spec.split_batch(ranks.world, "ranks"), self.stage)
        try:
            engine, optimizer, _, _ = deepspeed.initialize(model=net, optimizer=sgd,
                                                           config=self.config)
        except (AssertionError, NotImplementedError, ValueError, RuntimeError) as exc:
            raise Unavailable(f"DeepSpeed {deepspeed.__version__} ZeRO stage {self.stage} on "
                              f"{ranks.device.type}: {type(exc).__name__}: {exc}") from None
        self.engine, self.optimizer, self.module = engine, optimizer, engine.module
        self.tracker = td.PlacementTracker(self.module)
        self.dtype = next(self.module.parameters()).dtype
        if isinstance(feed, SyntheticInput) and feed.x.is_floating_point():
            feed.x = feed.x.to(self.dtype)  # once: the module's dtype (bf16 under bf16)
        self.module.train()
        self.last: tuple[torch.Tensor, torch.Tensor] | None = None
        self.held: dict[str, int] | None = None

    def step(self) -> torch.Tensor:
        x, y = self.feed.next()
        if x.is_floating_point() and x.dtype != self.dtype:
            x = x.to(self.dtype)
        self.last = (x, y)
        loss = td.loss_of(self.engine(self.tracker.saw(x)), y)
        skipped = self.engine.skipped_steps
        self.engine.backward(loss)
        self.engine.step()
        self.counter.skipped += self.engine.skipped_steps - skipped
        return loss.detach()

    def reported(self) -> dict[str, Any]:
        return {"optimizer": {"class": "torch.optim.SGD (client optimizer)",
                              "wrapped_by": type(self.optimizer).__name__},
                "zero_stage": self.engine.zero_optimization_stage(),
                "deepspeed_config": self.config}

    # -- what DeepSpeed holds -----------------------------------------------------------------

    def _partitions(self) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
        """(this rank's fp32 master partition, its stored parameters' partition, the group's
        global numel: its parameters' numel, without the flat buffer's alignment padding) per
        parameter group, from ZeRO's own structures (stage 1/2: bit16_groups; stage 3: each
        parameter's ds_numel)."""
        opt = self.optimizer
        if self.stage == 3:
            return [(master, stored, sum(int(p.ds_numel) for p in group))
                    for master, stored, group in zip(opt.fp32_partitioned_groups_flat,
                                                     opt.fp16_partitioned_groups_flat,
                                                     opt.fp16_groups, strict=True)]
        rank = dist.get_rank(opt.dp_process_group)
        return [(master, opt.parallel_partitioned_bit16_groups[i][rank],
                 sum(p.numel() for p in opt.bit16_groups[i]))
                for i, master in enumerate(opt.single_partition_of_fp32_groups)]

    def master_is_copy(self) -> bool:
        return any(m.data_ptr() != s.data_ptr() for m, s, _ in self._partitions())

    def precision_policy(self) -> dict[str, Any]:
        """The precision the engine runs, read back from it (docs/runners/deepspeed.md)."""
        engine = self.engine
        master = self._partitions()[0][0].dtype if self.master_is_copy() else None
        stored = self.dtype
        how = ("DeepSpeed config " + (
            '{"bf16": {"enabled": true}}' if self.spec.precision == "bf16" else
            '{"fp16": {"enabled": true, "loss_scale": 0}}' if self.spec.precision == "fp16"
            else "(no bf16/fp16 section)") + ', "communication_data_type": "fp32"'
               + (f', "data_types": {{"buffer_dtype": "{self.spec.precision}"}}'
                  if "data_types" in self.config else "") + "; "
               f"engine.bfloat16_enabled()={engine.bfloat16_enabled()}, "
               f"fp16_enabled()={engine.fp16_enabled()}, module parameters {stored}, "
               f"master partition {self._partitions()[0][0].dtype} "
               f"({'a copy' if master else 'the parameters themselves'}), "
               f"communication_data_type={engine.communication_data_type}")
        return resolve(self.spec.precision, how=how, compute=stored, params=stored,
                       master=master, reduce=engine.communication_data_type,
                       loss_scaling="dynamic" if engine.fp16_enabled() and
                       engine.dynamic_loss_scale() else None)

    def local_state(self) -> dict[str, dict[str, int]]:
        """This rank's bytes of params, grads and optimizer state, and the global sizes, read
        between engine.backward and engine.step (docs/runners/deepspeed.md)."""
        opt, params = self.optimizer, list(self.module.parameters())
        if self.stage == 3:
            held = sum(p.ds_tensor.numel() * p.ds_tensor.element_size() for p in params)
            full = sum(int(p.ds_numel) * p.ds_tensor.element_size() for p in params)
        else:
            held = full = sum(p.numel() * p.element_size() for p in params)
        grads = [t for group in opt.averaged_gradients.values() for t in group
                 if t is not None]
        grad_bytes = sum(t.numel() * t.element_size() for t in grads)
        grad_item = grads[0].element_size() if grads else 0
        if self.held is not None:  # stage 1/2: what the rank held as the reduction began,
            # the whole being every gradient in the dtype autograd made it (the module's)
            grad_bytes = self.held["grads"]
            grad_item = torch.empty((), dtype=self.dtype).element_size()
        copy = self.master_is_copy()
        optimizer = global_opt = grad_global = 0
        for master, _, numel in self._partitions():
            state = opt.optimizer.state.get(master, {})
            tensors = [v for v in state.values() if isinstance(v, torch.Tensor) and v.dim()]
            optimizer += sum(v.numel() * v.element_size() for v in tensors)
            global_opt += sum(numel * v.element_size() for v in tensors)
            if copy:  # an fp32 master copy, held by the optimizer
                optimizer += master.numel() * master.element_size()
                global_opt += numel * master.element_size()
            grad_global += numel * grad_item
        return {"local": {"params": held, "grads": grad_bytes, "optimizer": optimizer},
                "global": {"params": full, "grads": grad_global, "optimizer": global_opt}}

    def grads_held(self) -> dict[str, int]:
        """Stage 1/2: the gradient bytes this rank holds now (each gradient storage once; a
        gradient in one of ZeRO's bucket buffers by its own bytes: full gradients not reduced
        yet; the partition buffer), its buckets' capacity (reduce_bucket_size elements each)
        and residency (ZeRO frees them after the reduction) and its largest gradient (a
        gradient over the bucket size bypasses the buckets)."""
        opt = self.optimizer
        buckets = [b for bucket in getattr(opt, "ipg_buckets", {}).values() for b in bucket.buffer]
        buffers = {b.untyped_storage().data_ptr() for b in buckets}
        storages: dict[int, int] = {}
        in_buckets = 0
        grads = [t for group in opt.bit16_groups for q in group
                 for t in (q.grad, getattr(q, "grad_accum", None)) if isinstance(t, torch.Tensor)]
        partition = getattr(opt, "grads_in_partition", None)
        for g in grads + ([partition] if isinstance(partition, torch.Tensor) else []):
            ptr = g.untyped_storage().data_ptr()
            if ptr in buffers:
                in_buckets += g.numel() * g.element_size()
            else:
                storages.setdefault(ptr, g.untyped_storage().nbytes())
        largest = max((q.numel() * q.element_size() for group in opt.bit16_groups for q in group),
                      default=0)
        return {"grads": sum(storages.values()) + in_buckets, "largest": largest,
                "bucket_capacity": sum(b.numel() * b.element_size() for b in buckets),
                "buckets": dm.buffer_entry(buckets, in_buckets)}

    def backward_read(self, loss: torch.Tensor) -> None:
        """engine.backward, with stage 1/2's gradients read as its end-of-backward reduction
        begins (engine.allreduce_gradients): where stage 1 still holds every full gradient
        and stage 2 its partition and the bucket not reduced yet."""
        if self.stage == 3:
            self.engine.backward(loss)
            return
        begin = self.engine.allreduce_gradients

        def reading(*args: Any, **kwargs: Any) -> Any:
            self.held = self.grads_held()
            return begin(*args, **kwargs)

        self.engine.allreduce_gradients = reading
        try:
            self.engine.backward(loss)
        finally:
            del self.engine.allreduce_gradients  # the class's own method again
        if self.held is None:
            raise Invalid("DeepSpeed's backward never began its gradient reduction "
                          "(engine.allreduce_gradients): the gradients were not read")

    def state_record(self) -> dict[str, Any]:
        """One extra, untimed step stopped between engine.backward and engine.step, and every
        rank's state bytes gathered over the process group."""
        if self.last is None:
            raise Invalid("no step ran before the state reading")
        x, y = self.last
        loss = td.loss_of(self.engine(x), y)
        self.backward_read(loss)
        mine = self.local_state()
        rows = self.ranks.gather({"rank": self.ranks.rank, "device": str(self.ranks.device),
                                  **mine})
        per_device = {f"rank{r['rank']}:{r['device']}": r["local"] for r in rows}
        if any(r["global"] != rows[0]["global"] for r in rows):
            raise Invalid(f"the ranks state different global sizes: {[r['global'] for r in rows]}")
        what = ("module parameters' ds_tensor (this rank's partition; global: ds_numel)"
                if self.stage == 3 else "the module's parameters (a full replica; global: the "
                "same)")
        master = ("plus the fp32 master partition (single_partition_of_fp32_groups"
                  if self.stage < 3 else "plus the fp32 master partition "
                  "(fp32_partitioned_groups_flat") + ", a copy the optimizer holds)"
        # stage 1/2 read as the reduction began, stage 3 after backward
        grads_read = (code("torch.zero_grads_at_reduction") if self.held is not None
                      else code("torch.zero_grads_averaged"))
        source = (f"DeepSpeed ZeRO stage {self.stage}; {code('torch.zero_read_before_step')}; "
                  f"params: {what}; {grads_read}; optimizer: "
                  "optimizer.state of this rank's partition (SGD momentum) "
                  + (master if self.master_is_copy() else "(the master is the parameters' "
                     "own partition, counted under params)")
                  + "; " + code("torch.zero_global_numel"))
        local = mine["local"]
        buckets = {} if self.held is None else {
            "zero_buckets": {"reduce_bucket_size": self.config["zero_optimization"][
                "reduce_bucket_size"], "capacity_bytes": self.held["bucket_capacity"]},
            # stage 2 holds, beside its partition, at most one bucket of full gradients and
            # the one gradient too large for a bucket (reduced at the end of backward)
            **({"state_granularity_bytes": {"grads": self.held["bucket_capacity"]
                                             + self.held["largest"]}} if self.stage == 2 else {})}
        return join({"state_bytes_per_device": per_device, **buckets,
                     "state_bytes_global": rows[0]["global"], "state_source": source},
                    _state(local["params"], local["grads"], local["optimizer"],
                           "deepspeed: this rank's share as state_bytes_per_device reads it"))

    # -- what DeepSpeed holds beside the state ------------------------------------------------

    def bucket_sizes(self) -> dict[str, dict[str, int]]:
        """The engine's bucket and gather sizes (its zero_* config accessors), in elements and
        in bytes of the dtype each holds: reduce buckets the communication dtype, gathers the
        parameters' (persistence threshold: elements only)."""
        engine = self.engine
        comm = torch.empty((), dtype=engine.communication_data_type).element_size()
        item = torch.empty((), dtype=self.dtype).element_size()
        sizes = {"reduce_bucket_size": (engine.zero_reduce_bucket_size(), comm)}
        if self.stage < 3:
            sizes["allgather_bucket_size"] = (engine.zero_allgather_bucket_size(), item)
        else:
            sizes.update(prefetch_bucket_size=(engine.zero_prefetch_bucket_size(), item),
                         max_live_parameters=(engine.zero_max_live_parameters(), item),
                         param_persistence_threshold=(engine.zero_param_persistence_threshold(),
                                                      0))
        return {k: {"elements": int(n), **({"bytes": int(n) * size} if size else {})}
                for k, (n, size) in sizes.items()}

    def optimizer_op(self) -> dict[str, Any]:
        """Which optimizer op ran: the client optimizer's class, the implementation torch picks
        for its parameters (fused, foreach or the single-tensor loop: the group's flags, else
        torch's own default for these tensors), the DeepSpeed C++ ops loaded in the rank and
        the resident bytes of its /dev/shm mappings (a loaded op's shared workspace)."""
        from deepspeed.ops.op_builder.builder import OpBuilder
        from torch.optim.optimizer import _default_to_fused_or_foreach

        client = self.optimizer.optimizer
        group = client.param_groups[0]
        foreach = group.get("foreach")
        if foreach is None:  # the fp32 partitions ZeRO points the groups at as it steps
            masters = [master for master, _, _ in self._partitions()]
            foreach = _default_to_fused_or_foreach(masters, False, False)[1]
        impl = ("fused" if group.get("fused") else "foreach (multi-tensor)" if foreach
                else "single-tensor loop")
        return {"class": f"{type(client).__module__}.{type(client).__qualname__}",
                "implementation": impl, "deepspeed_ops_loaded": sorted(OpBuilder._loaded_ops),
                "shm_workspace_bytes": dm.shm_resident()}

    def memory_record(self) -> dict[str, Any]:
        """Every rank's peak (runners.memory's device_peak_bytes of the timed window) split into
        its state as state_record read it, ZeRO's buffers beside it and the unexplained rest,
        gathered over the process group; the bucket sizes and the optimizer op."""
        params = list(self.module.parameters())
        buckets = self.held["buckets"] if self.held is not None else None
        buffers = dm.zero_buffers(self.optimizer, self.stage, params, buckets)
        shm = dm.shm_resident()
        if shm:  # a DeepSpeed op's shared-memory workspace (shm_comm), resident in the rank
            buffers["shm_workspace"] = {"allocated_bytes": shm, "resident_bytes": shm,
                                        "counted_in_state_bytes": 0}
        measured = memory.for_result(self.spec, self.ranks.rank)
        peak = next(iter((measured["device_peak_bytes"] or {}).values()), None)
        base = next(iter((measured["memory_baseline"] or {}).values()), None)
        now = dm.vmrss()
        if self.ranks.device.type == "cuda":
            held_after: int | None = torch.cuda.memory_allocated(self.ranks.device)
        else:
            held_after = None if now is None or base is None else max(0, now - base)
        mine = dm.breakdown(peak, self.local_state()["local"], buffers, held_after)
        rows = self.ranks.gather({"key": f"rank{self.ranks.rank}:{self.ranks.device}", **mine})
        return {"deepspeed_memory": {
            "per_device": {r.pop("key"): r for r in rows}, "bucket_sizes": self.bucket_sizes(),
            "optimizer_op": self.optimizer_op(), "source": dm.SOURCE}}


def benchmark(spec: Spec) -> dict[str, Any]:
    deepspeed, ranks = init_deepspeed(spec)
    model_spec, feed, net = td.rank_model(spec, ranks)
    model = td.model_record(net, model_spec)  # before ZeRO-3 partitions the parameters away
    engine = Engine(deepspeed, spec, ranks, net, feed, 0.01, 0.9)
    result = td.timed_steps(spec, ranks, engine.step, engine.counter, engine.tracker, feed)
    return td.closing(ranks, result, {
        "framework": td.framework_versions("deepspeed"),
        "precision_policy": engine.precision_policy(),
        "strategy": f"DeepSpeed ZeRO stage {engine.stage}, one process per device (torchrun); "
                    + {1: "optimizer state partitioned",
                       2: "optimizer state and gradients partitioned",
                       3: "parameters, gradients and optimizer state partitioned"}[engine.stage],
    }, engine.reported(), model, engine.state_record(), engine.memory_record())


def equivalence(spec: Spec) -> dict[str, Any]:
    """One plain SGD step (momentum 0) of the benchmark's step function on the probe, each rank
    on its slice of the batch, resident on its device; weights saved (stage 3: gathered from
    the partitions first, on every rank)."""
    from models.torch_common import get_canonical_weights

    deepspeed, ranks = init_deepspeed(spec)
    reported: dict[str, Any] = {}

    def make_step(net: nn.Module, feed: td.Feed, lr: float) -> tuple[td.Step, td.StepParts]:
        engine = Engine(deepspeed, spec, ranks, net, feed, lr, 0.0)
        reported.update(engine.reported())
        return engine.step, td.StepParts(engine.module, engine.counter, engine.tracker)

    def canonical(net: nn.Module) -> dict[str, Any]:
        with deepspeed.zero.GatheredParameters(list(net.parameters()),
                                               enabled=int(spec.options["stage"]) == 3):
            return get_canonical_weights(net)

    framework = td.framework_versions("deepspeed")
    return join(probe_equivalence(spec, ranks, make_step, canonical=canonical,
                                  framework=framework), reported)


if __name__ == "__main__":
    main(benchmark, equivalence)
