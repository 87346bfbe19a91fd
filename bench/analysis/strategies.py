"""Each training strategy's communication per step, and which should win on measured links
(`run_bench.py predict RESULTS_DIR --strategies`). Framework-free; keyed by the harness's runner
names and the option that changes the communication, so the catalog does not need it.

The volume per step, for a model of P trainable parameters over N devices, in nccl-tests'
terms: a collective of S bytes takes S x factor / busbw, factor 2(N-1)/N for an all-reduce and
(N-1)/N for an all-gather or a reduce-scatter (contract/collectives.bus_factor; S the whole buffer,
N x one rank's part). G = P x the reduce dtype's bytes (the gradients), W = P x the gather
dtype's bytes (the parameters as they are gathered).

- All-reduce data parallelism (torch_ddp, horovod, tf_mirrored, jax_native, keras_jax): one
  all-reduce of the gradients, 2(N-1)/N x G through every device's link.
- ZeRO-1 and ZeRO-2 (deepspeed stage 1 and 2): a reduce-scatter of the gradients (each rank
  keeps the part its optimizer shard updates) and an all-gather of the updated parameters,
  (N-1)/N x G + (N-1)/N x W: the same 2 x Psi as data parallelism (Rajbhandari et al., "ZeRO:
  Memory Optimizations Toward Training Trillion Parameter Models", SC 2020, sec. 7.2.1: "P_os
  and P_g ... incur no additional communication").
- torch_zero1 (DDP + torch.distributed.optim.ZeroRedundancyOptimizer): DDP's all-reduce of the
  gradients, then each rank broadcasts the parameters its optimizer shard updated (ZeRO's
  `_sync_params`): 2(N-1)/N x G + the broadcasts, counted here as one all-gather of W (N
  broadcasts of W/N each; the assumption is stated on its row): 3 x Psi, more than DDP.
- ZeRO-3 (deepspeed stage 3) and FSDP (torch_fsdp2 with reshard_after_forward true): the
  parameters are all-gathered layer by layer in the forward pass, freed, all-gathered again in
  the backward pass, and the gradients reduce-scattered: 2 x (N-1)/N x W + (N-1)/N x G, 3 x Psi
  (ZeRO paper sec. 7.2.2: "a total communication volume of 3 Psi, compared to 2 Psi in the
  baseline, ... a 1.5x"; Zhao et al., "PyTorch FSDP: Experiences on Scaling Fully Sharded Data
  Parallel", VLDB 2023, sec. 3.1 and 3.2: the forward and backward AllGather and the backward
  ReduceScatter of FULL_SHARD).
- torch_fsdp2 with reshard_after_forward false (SHARD_GRAD_OP, ZeRO-2-like): the parameters
  stay gathered from the forward pass to the backward: one all-gather and the reduce-scatter,
  2 x Psi.
- jax_fsdp: as ZeRO-3 (parameters sharded over the data axis and gathered per layer inside the
  step, as MaxText's fsdp axis does; the assumption: XLA gathers them again in the backward
  pass, as under rematerialisation; where it keeps the forward's gathered weights it is one
  all-gather less, as FSDP2 with reshard_after_forward false).
- keras_model_parallel: treated as weight-sharded over all devices like FSDP (the LayoutMap
  shards each weight over the one mesh axis the batch is also split on; the assumption: XLA's
  SPMD partitioner gathers each weight for its use in the forward and again in the backward,
  and reduce-scatters its gradient) - the same 3 x Psi.

Compute overlap is not modelled: the times are each strategy's collectives run one after
another with nothing beside them. Every strategy here can overlap some of them (DDP's buckets
with the backward pass, FSDP2's and ZeRO-3's prefetched all-gathers with the previous layer's
compute), so the ranking says what the links cost, not the step time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from contract.collectives import ALL_GATHER, ALL_REDUCE, REDUCE_SCATTER, bus_factor

DTYPE_BYTES = {"float32": 4, "tf32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
ALL_REDUCE_RUNNERS = ("torch_ddp", "horovod", "tf_mirrored", "jax_native", "keras_jax")
ZERO_PAPER = ("Rajbhandari et al., ZeRO: Memory Optimizations Toward Training Trillion "
              "Parameter Models, SC 2020, sec. 7")
FSDP_PAPER = ("Zhao et al., PyTorch FSDP: Experiences on Scaling Fully Sharded Data Parallel, "
              "VLDB 2023, sec. 3")
NOT_MODELLED = ("compute overlap is not modelled: each strategy's collectives are timed one "
                "after another with nothing beside them (DDP overlaps its buckets with the "
                "backward pass, FSDP2 and ZeRO-3 prefetch the next layer's all-gather), so "
                "the ranking is of what the links cost, not of step time")


@dataclass(frozen=True)
class Phase:
    """One collective of a step: what it moves ("gradients" or "parameters") and when."""

    collective: str
    moves: str
    when: str


@dataclass(frozen=True)
class Strategy:
    """A runner (and the option value that changes its communication) and its step's
    collectives, with where the volume comes from and any assumption made."""

    runner: str
    option: tuple[str, Any] | None
    phases: tuple[Phase, ...]
    source: str
    assumption: str | None = None

    @property
    def key(self) -> str:
        """The runner name, with the option as runner[option=value] where it matters."""
        if self.option is None:
            return self.runner
        name, value = self.option
        return f"{self.runner}[{name}={str(value).lower()}]"


GRAD_AR = Phase(ALL_REDUCE, "gradients", "backward")
GRAD_RS = Phase(REDUCE_SCATTER, "gradients", "backward")
PARAM_AG_STEP = Phase(ALL_GATHER, "parameters", "after the optimizer step")
PARAM_AG_FWD = Phase(ALL_GATHER, "parameters", "forward")
PARAM_AG_BWD = Phase(ALL_GATHER, "parameters", "backward")
ZERO3 = (PARAM_AG_FWD, PARAM_AG_BWD, GRAD_RS)

STRATEGIES: tuple[Strategy, ...] = (
    *(Strategy(r, None, (GRAD_AR,), "a ring all-reduce of the gradients (nccl-tests' 2(N-1)/N)")
      for r in ALL_REDUCE_RUNNERS),
    Strategy("torch_zero1", None, (GRAD_AR, PARAM_AG_STEP),
             "DDP's all-reduce, then ZeroRedundancyOptimizer broadcasts each rank's updated "
             "parameters", "the owners' broadcasts counted as one all-gather of the "
             "parameters (N broadcasts of 1/N each; measured as the all-gather's busbw)"),
    Strategy("deepspeed", ("stage", 1), (GRAD_RS, PARAM_AG_STEP), f"{ZERO_PAPER}.2.1"),
    Strategy("deepspeed", ("stage", 2), (GRAD_RS, PARAM_AG_STEP), f"{ZERO_PAPER}.2.1"),
    Strategy("deepspeed", ("stage", 3), ZERO3, f"{ZERO_PAPER}.2.2"),
    Strategy("torch_fsdp2", ("reshard_after_forward", True), ZERO3, f"{FSDP_PAPER} (FULL_SHARD)"),
    Strategy("torch_fsdp2", ("reshard_after_forward", False), (PARAM_AG_FWD, GRAD_RS),
             f"{FSDP_PAPER} (SHARD_GRAD_OP: no re-gather in backward)"),
    Strategy("jax_fsdp", None, ZERO3, f"as ZeRO-3, {ZERO_PAPER}.2.2",
             "XLA gathers the weights again in the backward pass (as under remat); if it keeps "
             "the forward's gathered weights, one all-gather less"),
    Strategy("keras_model_parallel", None, ZERO3, f"as FSDP, {FSDP_PAPER}",
             "treated as weight-sharded over all devices like FSDP (the LayoutMap shards each "
             "weight over the mesh axis the batch is split on; XLA's SPMD partitioner gathers "
             "it in forward and backward and reduce-scatters its gradient)"),
)
BY_KEY = {s.key: s for s in STRATEGIES}


def strategy(runner: str, options: dict[str, Any] | None = None) -> Strategy | None:
    """The strategy of a runner and its options (deepspeed's stage, torch_fsdp2's
    reshard_after_forward, default true); None for a runner not in the table."""
    options = options or {}
    if runner == "deepspeed":
        return BY_KEY.get(f"deepspeed[stage={options.get('stage', 2)}]")
    if runner == "torch_fsdp2":
        flag = options.get("reshard_after_forward", True)
        return BY_KEY.get(f"torch_fsdp2[reshard_after_forward={str(bool(flag)).lower()}]")
    return BY_KEY.get(runner)


def dtype_bytes(name: str | None) -> int:
    """Bytes of one element of a dtype named as the precision policy names them."""
    if name not in DTYPE_BYTES:
        raise ValueError(f"dtype {name!r}: allowed {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


def volume(strat: Strategy, params: int, n: int, reduce_dtype: str = "float32",
           gather_dtype: str = "float32") -> list[dict[str, Any]]:
    """Each collective of one step: its S (bytes, nccl-tests' whole buffer) and the bytes it
    moves through every device's link (S x the bus factor)."""
    out = []
    for phase in strat.phases:
        size = params * dtype_bytes(reduce_dtype if phase.moves == "gradients" else gather_dtype)
        out.append({"collective": phase.collective, "moves": phase.moves, "when": phase.when,
                    "bytes": size, "link_bytes": size * bus_factor(n, phase.collective)})
    return out


def communication(strat: Strategy, params: int, n: int, busbw: dict[str, float],
                  reduce_dtype: str = "float32", gather_dtype: str = "float32"
                  ) -> dict[str, Any]:
    """One step's communication: the volume per device link, and the time on links of the
    given bus bandwidth per collective (GB/s; a collective missing from `busbw` takes the
    all-reduce's, and the row says so)."""
    phases, borrowed = volume(strat, params, n, reduce_dtype, gather_dtype), []
    for ph in phases:
        bw = busbw.get(ph["collective"])
        if bw is None:
            bw = busbw.get(ALL_REDUCE)
            if ph["collective"] not in borrowed:
                borrowed.append(ph["collective"])
        ph["busbw_gbps"] = bw
        ph["seconds"] = ph["link_bytes"] / (bw * 1e9) if bw else None
    times = [ph["seconds"] for ph in phases]
    link = sum(ph["link_bytes"] for ph in phases)
    grads = params * dtype_bytes(reduce_dtype) * (n - 1) / n if n > 1 else 0
    notes = [a for a in (strat.assumption,) if a]
    if borrowed:
        notes.append(f"no {', '.join(borrowed)} measured: the all-reduce's busbw used")
    return {"strategy": strat.key, "runner": strat.runner, "phases": phases,
            "link_bytes": link,
            # the volume in the ZeRO paper's unit: Psi = (N-1)/N x the gradient bytes
            "psi": link / grads if grads else None,
            "seconds": None if None in times else math.fsum(times),  # type: ignore[arg-type]
            "source": strat.source, "notes": notes}


def rank(params: int, n: int, busbw: dict[str, float], reduce_dtype: str = "float32",
         gather_dtype: str = "float32",
         strategies: tuple[Strategy, ...] = STRATEGIES) -> list[dict[str, Any]]:
    """Every strategy's communication on the given links, fastest first (ties keep the
    table's order); the first row's `wins` is True, and so is that of every row as fast."""
    rows = [communication(s, params, n, busbw, reduce_dtype, gather_dtype) for s in strategies]
    rows.sort(key=lambda r: (r["seconds"] is None, r["seconds"] or 0.0))
    best = rows[0]["seconds"] if rows else None
    for r in rows:
        r["wins"] = best is not None and r["seconds"] is not None and \
            math.isclose(r["seconds"], best, rel_tol=1e-9)
    return rows


# -- on a results folder's measured links ------------------------------------------------------

# The probe of the framework each strategy's collectives run in (mode: allreduce probes); where
# the folder has none of it (or it measured no figure for a collective) the strategy is priced on
# the fastest probe measured, said so. JAX's strategies (jit, Keras on JAX, FSDP, ModelParallel)
# all run XLA's collectives, which jax_allreduce measures.
PROBE_OF = {"torch_ddp": "torch_allreduce", "torch_zero1": "torch_allreduce",
            "deepspeed": "torch_allreduce", "torch_fsdp2": "torch_allreduce",
            "horovod": "horovod_allreduce", "tf_mirrored": "tf_allreduce",
            "jax_native": "jax_allreduce", "keras_jax": "jax_allreduce",
            "jax_fsdp": "jax_allreduce", "keras_model_parallel": "jax_allreduce"}


def probe_rows(rec: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """A probe record's measured rows per collective (all_reduce from its `allreduce`
    section, the others from `collectives` where measured; older records: all_reduce only)."""
    result = rec.get("result") or {}
    out = {ALL_REDUCE: (result.get("allreduce") or {}).get("sizes") or []}
    for name, sec in (result.get("collectives") or {}).items():
        if isinstance(sec, dict) and sec.get("sizes"):
            out[name] = sec["sizes"]
    return {k: [r for r in v if isinstance(r.get("busbw_gbps"), (int, float))
                and r["busbw_gbps"] > 0 and isinstance(r.get("bytes"), (int, float))
                and r["bytes"] > 0] for k, v in out.items()}


def measured_busbw(probes: list[dict[str, Any]], n: int, sizes: dict[str, int],
                   probe: str | None = None) -> dict[str, dict[str, Any]]:
    """Per collective: the busbw (GB/s) measured nearest its size S (log scale), at n devices
    or the nearest count measured, the median over the repeats; from `probe`'s records where
    it measured that collective, else the fastest probe that did. Each: busbw_gbps, probe,
    devices, bytes."""
    out: dict[str, dict[str, Any]] = {}
    for name, size in sizes.items():
        have = [(p, probe_rows(p).get(name)) for p in probes]
        have = [(p, rows) for p, rows in have if rows]
        if not have:
            continue
        mine = [(p, rows) for p, rows in have if p.get("runner") == probe] or have
        counts = sorted({p["num_devices"] for p, _ in mine})
        at = min(counts, key=lambda c: (abs(math.log(c / n)), -c)) if n > 1 else max(counts)
        by_probe: dict[str, list[dict[str, Any]]] = {}
        for p, rows in mine:
            if p["num_devices"] == at:
                by_probe.setdefault(p["runner"], []).append(
                    min(rows, key=lambda r: abs(math.log(r["bytes"] / size))))
        name_, rows = max(by_probe.items(),
                          key=lambda kv: _median([r["busbw_gbps"] for r in kv[1]]))
        out[name] = {"busbw_gbps": _median([r["busbw_gbps"] for r in rows]), "probe": name_,
                     "devices": at, "bytes": rows[0]["bytes"]}
    return out


def _median(values: list[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


def forecast(probes: list[dict[str, Any]], params: int, devices: list[int],
             reduce_dtype: str = "float32", gather_dtype: str = "float32",
             strategies: tuple[Strategy, ...] = STRATEGIES) -> list[dict[str, Any]]:
    """Every strategy's communication per step at each device count, on the bus bandwidths
    its framework's probe measured (runner's PROBE_OF, else the fastest probe), fastest first
    per count, with `wins` on the fastest; `bandwidth` says which probe gave each figure."""
    out = []
    for n in devices:
        rows = []
        for strat in strategies:
            sizes = {ph["collective"]: ph["bytes"]
                     for ph in volume(strat, params, n, reduce_dtype, gather_dtype)}
            bw = measured_busbw(probes, n, sizes, PROBE_OF.get(strat.runner))
            row = communication(strat, params, n, {k: v["busbw_gbps"] for k, v in bw.items()},
                                reduce_dtype, gather_dtype)
            row["devices"] = n
            row["bandwidth"] = "; ".join(
                f"{k} {v['busbw_gbps']:.3g} GB/s ({v['probe']} at {v['devices']} devices)"
                for k, v in bw.items()) or "no probe measured"
            mine = PROBE_OF.get(strat.runner)
            if bw and mine and not any(p.get("runner") == mine for p in probes):
                row["notes"].append(f"no {mine} probe in this folder: the fastest probe's "
                                    "figures")
            elif bw and mine and any(v["probe"] != mine for v in bw.values()):
                row["notes"].append(f"{mine} gave no figure for some collective here: the fastest "
                                    "probe's figure used")
            elif bw and not mine:
                row["notes"].append("no probe of this framework: the fastest probe's figures")
            rows.append(row)
        rows.sort(key=lambda r: (r["seconds"] is None, r["seconds"] or 0.0))
        best = rows[0]["seconds"] if rows else None
        for r in rows:
            r["wins"] = best is not None and r["seconds"] is not None and \
                math.isclose(r["seconds"], best, rel_tol=1e-9)
        out.extend(rows)
    return out


def format_forecast(rows: list[dict[str, Any]], params: int, model: str,
                    reduce_dtype: str, gather_dtype: str) -> str:
    """The terminal table: per device count, each strategy's collectives, its volume (in the
    ZeRO paper's Psi and in MB per device link), its time on the measured links, the winner."""
    from bench.text_table import aligned

    head = ("devices", "strategy", "collectives per step", "volume (Psi)", "MB per link",
            "comm ms", "")
    cells = [head]
    for r in rows:
        phases = " + ".join(f"{ph['collective']}({ph['moves'][0]},{ph['when'][:3]})"
                            for ph in r["phases"])
        cells.append((str(r["devices"]), r["strategy"], phases,
                       "-" if r["psi"] is None else f"{r['psi']:.2f}",
                       f"{r['link_bytes'] / 1e6:.1f}",
                       "-" if r["seconds"] is None else f"{r['seconds'] * 1e3:.2f}",
                       "WINS" if r.get("wins") else ""))
    winners: dict[int, list[str]] = {}
    for r in rows:
        if r.get("wins"):
            winners.setdefault(r["devices"], []).append(r["strategy"])
    notes = sorted({f"  {r['strategy']}: {note}" for r in rows for note in r["notes"]})
    bws = sorted({f"  {r['strategy']} n={r['devices']}: {r['bandwidth']}" for r in rows})
    return "\n".join(
        [f"Communication per step by strategy: {model}, {params:,} parameters, gradients "
         f"reduced in {reduce_dtype}, parameters gathered in {gather_dtype}; collective(g = "
         "gradients / p = parameters, when); Psi = (N-1)/N x the gradient bytes; a "
         "collective of S bytes takes S x its bus factor / its measured busbw:",
         *aligned(cells), ""]
        + [f"should win at {n} devices: {', '.join(w)}" for n, w in sorted(winners.items())]
        + ["", NOT_MODELLED, "", "notes:", *notes, "", "bus bandwidths:", *bws,
           "", f"sources: {ZERO_PAPER}; {FSDP_PAPER}; busbw factors: nccl-tests "
               "doc/PERFORMANCE.md"])
