"""Each training strategy's communication per step, and which should win on measured links
(`run_bench.py predict RESULTS_DIR --strategies`). Framework-free. The strategies are the
catalog's: every runner whose entry declares `collectives` (contract/communication.py), one
strategy per option value where an option decides them, priced on the links its entry's
`probe` measured.

The volume per step, for a model of P trainable parameters over N devices, in nccl-tests'
terms: a collective of S bytes takes S x factor / busbw, factor 2(N-1)/N for an all-reduce and
(N-1)/N for an all-gather or a reduce-scatter (contract/collectives.bus_factor; S the whole
buffer). G = P x the reduce dtype's bytes (the gradients), W = P x the gather dtype's bytes.
docs/STRATEGIES.md ("Why one should win") gives each strategy's volume and its source.
Compute overlap is not modelled: the times are each strategy's collectives one after another,
so the ranking says what the links cost, not the step time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from bench.catalog.registry import RUNNERS
from contract.catalog import RunnerInfo, deciding_option, expected_shards
from contract.collectives import ALL_REDUCE, bus_factor
from contract.communication import FSDP_PAPER, ZERO_PAPER, Phase, StepCollectives

DTYPE_BYTES = {"float32": 4, "tf32": 4, "bfloat16": 2, "float16": 2, "float64": 8}
NOT_MODELLED = ("compute overlap is not modelled: each strategy's collectives are timed one "
                "after another with nothing beside them (DDP overlaps its buckets with the "
                "backward pass, FSDP2 and ZeRO-3 prefetch the next layer's all-gather), so "
                "the ranking is of what the links cost, not of step time")


@dataclass(frozen=True)
class Strategy:
    """A runner (and the option value that changes its communication), its step's
    collectives, where the volume comes from, any assumption made, and the probe that
    measures its framework's links."""

    runner: str
    option: tuple[str, Any] | None
    phases: tuple[Phase, ...]
    source: str
    assumption: str | None = None
    probe: str | None = None

    @property
    def key(self) -> str:
        """The runner name, with the option as runner[option=value] where it matters."""
        if self.option is None:
            return self.runner
        name, value = self.option
        return f"{self.runner}[{name}={str(value).lower()}]"


def _variants(info: RunnerInfo) -> list[Strategy]:
    """The strategies of one catalog entry: one, or one per value of the option deciding."""
    declared = info.collectives
    pairs: list[tuple[tuple[str, Any] | None, StepCollectives]] = (
        [((declared["option"], v), c) for v, c in declared["values"].items()]
        if isinstance(declared, dict) else [(None, declared)])
    return [Strategy(info.name, option, c.phases, c.source, c.assumption, info.probe)
            for option, c in pairs]


def _fewest_shards(info: RunnerInfo) -> int:
    """How few of the model state's parts the runner shards, over its option values."""
    declared = info.collectives
    values = list(declared["values"]) if isinstance(declared, dict) else [None]
    option = declared["option"] if isinstance(declared, dict) else ""
    return min(len(expected_shards(info, {option: v} if option else {})) for v in values)


def declared(runners: dict[str, RunnerInfo]) -> tuple[Strategy, ...]:
    """Every strategy the catalog declares, the least sharded first (data parallelism, then
    ZeRO-1, ZeRO-2, ZeRO-3 and FSDP), a runner's variants together, else in the registry's
    order."""
    infos = sorted((i for i in runners.values() if i.collectives is not None),
                   key=_fewest_shards)
    return tuple(s for info in infos for s in _variants(info))


STRATEGIES: tuple[Strategy, ...] = declared(RUNNERS)


def strategy(runner: str, options: dict[str, Any] | None = None) -> Strategy | None:
    """The strategy of a runner and its options (an option the catalog says decides it at
    its default where not given); None for a runner, or an option value, not declared."""
    info = RUNNERS.get(runner)
    if info is None or info.collectives is None:
        return None
    option = deciding_option(info, info.collectives, options or {})
    return next((s for s in _variants(info) if s.option == option), None)


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


def _by_speed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows fastest first (ties keep their order), `wins` on every row as fast as the
    first."""
    rows.sort(key=lambda r: (r["seconds"] is None, r["seconds"] or 0.0))
    best = rows[0]["seconds"] if rows else None
    for r in rows:
        r["wins"] = best is not None and r["seconds"] is not None and \
            math.isclose(r["seconds"], best, rel_tol=1e-9)
    return rows


def rank(params: int, n: int, busbw: dict[str, float], reduce_dtype: str = "float32",
         gather_dtype: str = "float32",
         strategies: tuple[Strategy, ...] = STRATEGIES) -> list[dict[str, Any]]:
    """Every strategy's communication on the given links, fastest first (ties keep the
    table's order); the first row's `wins` is True, and so is that of every row as fast."""
    return _by_speed([communication(s, params, n, busbw, reduce_dtype, gather_dtype)
                      for s in strategies])


# -- on a results folder's measured links ------------------------------------------------------
# Each strategy is priced on the links of its catalog entry's `probe` (the framework its
# collectives run in); where the folder has none of it (or it measured no figure for a
# collective), on the fastest probe measured, said so.

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


def _priced(strat: Strategy, probes: list[dict[str, Any]], params: int, n: int,
            dtypes: tuple[str, str]) -> dict[str, Any]:
    """One strategy's row at n devices on its probe's measured links (`dtypes`: the reduce
    and the gather dtype), saying which probe gave each figure and where it fell back."""
    sizes = {ph["collective"]: ph["bytes"] for ph in volume(strat, params, n, *dtypes)}
    mine = strat.probe
    bw = measured_busbw(probes, n, sizes, mine)
    row = communication(strat, params, n, {k: v["busbw_gbps"] for k, v in bw.items()}, *dtypes)
    row["devices"] = n
    row["bandwidth"] = "; ".join(
        f"{k} {v['busbw_gbps']:.3g} GB/s ({v['probe']} at {v['devices']} devices)"
        for k, v in bw.items()) or "no probe measured"
    if bw and mine and not any(p.get("runner") == mine for p in probes):
        row["notes"].append(f"no {mine} probe in this folder: the fastest probe's figures")
    elif bw and mine and any(v["probe"] != mine for v in bw.values()):
        row["notes"].append(f"{mine} gave no figure for some collective here: the fastest "
                            "probe's figure used")
    elif bw and not mine:
        row["notes"].append("no probe of this framework: the fastest probe's figures")
    return row


def forecast(probes: list[dict[str, Any]], params: int, devices: list[int],
             reduce_dtype: str = "float32", gather_dtype: str = "float32",
             strategies: tuple[Strategy, ...] = STRATEGIES) -> list[dict[str, Any]]:
    """Every strategy's communication per step at each device count, on the bus bandwidths
    its framework's probe measured (its catalog entry's `probe`, else the fastest probe),
    fastest first per count, with `wins` on the fastest; `bandwidth` says which probe gave
    each figure."""
    out = []
    for n in devices:
        out.extend(_by_speed([_priced(s, probes, params, n, (reduce_dtype, gather_dtype))
                              for s in strategies]))
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
