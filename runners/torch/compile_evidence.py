"""torch_ddp's compile record: whether the step was compiled, in which torch.compile mode, and
what TorchDynamo and Inductor say they did, read after the timed window from their own
counters (torch._dynamo.utils.counters), compilation metrics and compiled graphs: unique
graphs, graph breaks by reason, recompile reasons, DDPOptimizer's graph splitting, and CUDA
graphs (asked by the mode, skipped and why, recorded). docs/runners/torch_ddp.md, "Compile"."""

from __future__ import annotations

import gc
from collections import Counter
from typing import Any

import torch

from runners.common import Invalid

COMPILED_BY = "torch.compile (TorchDynamo, Inductor) of the DDP module"
# a graph that gave no reason of its own: one that kept CUDA graphs, or a backward whose
# forward's skip already turned them off (tree_functions, on GPUs, says which)
NO_REASON = "no reason of its own"


def compile_record(options: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """{"compile": False} for an eager step; for a compiled one the graphs TorchDynamo captured
    (a compiled run in which it captured none did not run the compiled step: Invalid) and
    `compile_evidence` (what torch reports of the compilation)."""
    if not options["compile"]:
        return {"compile": False}
    from torch._dynamo.utils import counters

    graphs = int(counters["stats"]["unique_graphs"])
    if graphs < 1:
        raise Invalid("compile: true, but TorchDynamo captured no graph: the step ran eagerly")
    return {"compile": True, "compiled_graphs": graphs, "compiled_by": COMPILED_BY,
            "compile_evidence": compile_evidence(options["compile_mode"], device)}


def compile_evidence(mode: str, device: torch.device) -> dict[str, Any]:
    """What TorchDynamo and Inductor report of this process's compilation in `mode`: the
    mode's Inductor settings (list_mode_options), unique graphs, frames, graph breaks (reason
    -> count), recompile reasons, DDPOptimizer (optimize_ddp and the graphs AOTAutograd
    compiled: one per DDP bucket of each split Dynamo graph) and cudagraph_evidence."""
    import torch._dynamo
    from torch._dynamo.utils import counters, get_compilation_metrics
    from torch._inductor import list_mode_options

    metrics = get_compilation_metrics()
    settings = list_mode_options(mode)
    return {
        "mode": mode,
        "mode_options": dict(settings),
        "unique_graphs": int(counters["stats"]["unique_graphs"]),
        "frames": {k: int(v) for k, v in counters["frames"].items()},
        "graph_breaks": {str(k): int(v) for k, v in counters["graph_break"].items()},
        "recompile_reasons": sorted({str(m.recompile_reason) for m in metrics
                                     if m.recompile_reason}),
        "ddp_optimizer": {"optimize_ddp": torch._dynamo.config.optimize_ddp,
                          "aot_autograd_graphs": int(counters["aot_autograd"]["total"])},
        "cudagraphs": cudagraph_evidence(bool(settings.get("triton.cudagraphs")), device,
                                         metrics),
    }


def cudagraph_evidence(asked: bool, device: torch.device, metrics: list[Any]
                       ) -> dict[str, Any]:
    """Inductor's CUDA graphs: whether the mode asked for them, the skips it counted
    (counters["inductor"]["cudagraph_skips"]), the skip reasons it logged (compilation
    metrics: GPUs), each compiled graph's reason for disabling them (its
    disabled_cudagraphs_reason, first line, by count; on CPU the skip is counted without a
    log, the reason kept there), and on GPUs the functions cudagraph trees recorded."""
    from torch._dynamo.utils import counters

    out: dict[str, Any] = {
        "asked": asked,
        "skips": int(counters["inductor"]["cudagraph_skips"]),
        "logged_skip_reasons": sorted({str(m.cudagraph_skip_reason) for m in metrics
                                       if m.cudagraph_skip_reason}),
    }
    if not asked:
        return out
    out["graph_disable_reasons"] = dict(Counter(_graph_disable_reasons()))
    if device.type == "cuda":
        from torch._inductor.cudagraph_trees import get_manager

        manager = get_manager(device.index or 0, create_if_none_exists=False)
        out["tree_functions"] = 0 if manager is None else len(manager.ids_to_funcs)
    return out


def _graph_disable_reasons() -> list[str]:
    """The first line of each compiled Inductor graph's disabled_cudagraphs_reason (NO_REASON
    where it gave none), from the graphs alive in this process."""
    from torch._inductor.output_code import CompiledFxGraph

    reasons = []
    for obj in gc.get_objects():
        if type(obj) is CompiledFxGraph:  # type(): isinstance would follow dead weak proxies
            reason = obj.disabled_cudagraphs_reason
            reasons.append(reason.splitlines()[0].strip() if reason else NO_REASON)
    return reasons
