"""Golden records: each real run's record, as the slow family tests make it, held to the shape
its runner and mode had (tests/golden/records/<runner>.<mode>.json).

A record's shape is its fields and their JSON types: every top-level field, and inside what
the child reported (its fields copied to the top level and `result`) every nested field as a
dotted path (`result.precision_policy.compute`, a list's elements as `curve[]`). A mapping
keyed by data (devices, ranks, op names: MAPS) has its values' shape under `path{}`, not its
keys. A golden file gives each path its types and when it is present: always, when the
record's configuration is one of the alternatives that explain it (`[{"status": "ok"}]`: only
ok runs carry it), or optional (seen in some records, no configuration explaining which). A
list's elements and a map's values may be absent (empty is a value).

tests/conftest.py runs `after_test` after each test the goldens were captured from (real
framework runs on CPU): every record the test (or a fixture it set up) wrote under pytest's
temporary folder is checked; a missing field, an extra one or another type fails the test
naming the runner, the mode and the field. MGBENCH_GOLDEN_RECORDS=write captures instead:
each record is kept under MGBENCH_GOLDEN_CAPTURE (default /tmp/mgbench-golden-capture) and
the golden files are rewritten from everything captured there."""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from bench import REPO_ROOT
from contract.result import json_type

GOLDEN = REPO_ROOT / "tests" / "golden" / "records"
MODE_VAR, CAPTURE_VAR = "MGBENCH_GOLDEN_RECORDS", "MGBENCH_GOLDEN_CAPTURE"
DEFAULT_CAPTURE = Path("/tmp/mgbench-golden-capture")
# The tests whose records are checked are those the goldens were captured from (their
# `captured_from`); on SLURM or a GPU (records no golden saw) a test is never checked.
SKIP_MARKS = ("slurm", "gpu")
# the record's own top-level fields the parent writes, whose insides are not the child's
PARENT_NESTED = ("environment", "telemetry", "slurm", "mfu", "placement_check", "state_check",
                 "options", "dataset", "converge", "variant", "equivalence", "threads_plan")
# top-level fields the parent writes only on an event of the machine, not of the runner (a
# process that outlived the run): never an extra field
OCCASIONAL = ("left_running",)
# mappings keyed by data (devices, ranks, ops), wherever they are: their values' shape only
MAPS = ("memory_per_device", "device_peak_bytes", "memory_baseline", "state_bytes_per_device",
        "placement", "parameter_copies", "by_device", "forward_convs_per_device",
        "backward_convs_per_device", "input_grad_convs_per_device", "compute_ops_by_type",
        "traced_ops_by_type", "traced_op_seconds_by_type", "rank_threads",
        "env")  # threads.env: the thread variables the machine's environment sets
# what a condition may name: the record's configuration (and options.<name>)
CONDITION_KEYS = ("status", "num_devices", "data", "precision", "model", "scaling",
                  "num_nodes", "batch_size_per_device")


def _walk(path: str, value: Any, out: dict[str, set[str]]) -> None:
    out.setdefault(path, set()).add(json_type(value))
    is_map = path.rsplit(".", 1)[-1] in MAPS
    if isinstance(value, dict):
        for key, item in value.items():
            _walk(f"{path}{{}}" if is_map else f"{path}.{key}", item, out)
    elif isinstance(value, list):
        for item in value:
            _walk(f"{path}[]", item, out)


def shape(record: Mapping[str, Any]) -> dict[str, set[str]]:
    """Every path of a record and the JSON types it holds there (a list's elements, a map's
    values may hold several)."""
    out: dict[str, set[str]] = {}
    for key, value in record.items():
        if key in PARENT_NESTED or not isinstance(value, (dict, list)):
            out.setdefault(key, set()).add(json_type(value))
        else:
            _walk(key, value, out)
    return out


def context(record: Mapping[str, Any]) -> dict[str, str]:
    """The configuration a condition may name, each value as JSON text."""
    ctx = {k: json.dumps(record.get(k), sort_keys=True) for k in CONDITION_KEYS}
    for name, value in (record.get("options") or {}).items():
        ctx[f"options.{name}"] = json.dumps(value, sort_keys=True)
    return ctx



def _condition(present: list[dict[str, str]], absent: list[dict[str, str]]
               ) -> list[dict[str, Any]] | None:
    """The simplest configuration (one key, else two; the fewest alternatives) that holds in
    every record that has the path and in none that lacks it, as alternatives ({"status":
    "ok"}); None when none does."""
    keys = sorted({k for ctx in present + absent for k in ctx},
                  key=lambda k: (*CONDITION_KEYS, k).index(k))
    for size in (1, 2):
        found = []
        for names in itertools.combinations(keys, size):
            values = {tuple(ctx.get(n, "null") for n in names) for ctx in present}
            if not any(tuple(ctx.get(n, "null") for n in names) in values for ctx in absent):
                found.append((len(values), names, sorted(values, key=str)))
        if found:
            _, names, values = min(found, key=lambda f: f[0])
            return [{n: json.loads(v) for n, v in zip(names, alt, strict=True)} for alt in values]
    return None


def golden(records: list[Mapping[str, Any]]) -> dict[str, Any]:
    """A golden file's fields from the records of one runner and mode: each path's types and
    when it is present ("always", a condition's alternatives, or "optional")."""
    shapes = [shape(r) for r in records]
    contexts = [context(r) for r in records]
    fields: dict[str, Any] = {}
    for path in sorted(set().union(*shapes)):
        has = [path in s for s in shapes]
        types = sorted(set().union(*(s.get(path, set()) for s in shapes)))
        if all(has):
            when: Any = "always"
        else:
            pairs = list(zip(contexts, has, strict=True))
            when = _condition([c for c, h in pairs if h],
                              [c for c, h in pairs if not h]) or "optional"
        fields[path] = {"types": types, "when": when}
    return fields


def _holds(when: Any, ctx: Mapping[str, str]) -> bool:
    """Whether a path present `when` must be in a record of configuration `ctx`."""
    if when == "always":
        return True
    if when == "optional":
        return False
    return any(all(ctx.get(k, "null") == json.dumps(v, sort_keys=True) for k, v in alt.items())
               for alt in when)


def problems(record: Mapping[str, Any], fields: Mapping[str, Any]) -> list[str]:
    """What differs between a record's shape and its golden fields: a path it lacks that the
    golden says it has in this configuration, a path the golden lacks, a type not seen."""
    name = f"{record.get('runner')}.{record.get('mode')}"
    seen, ctx = shape(record), context(record)
    out = []
    for path, types in sorted(seen.items()):
        if path not in fields and path not in OCCASIONAL:
            out.append(f"{name}: field {path!r} ({'/'.join(sorted(types))}) is not in "
                       f"its golden record")
        elif path in fields and types - set(fields[path]["types"]):
            out.append(f"{name}: field {path!r} is {'/'.join(sorted(types))}, its golden "
                       f"record says {'/'.join(fields[path]['types'])}")
    out += [f"{name}: field {path!r} is missing (its golden record has it "
            f"{'always' if field['when'] == 'always' else 'when ' + json.dumps(field['when'])})"
            for path, field in sorted(fields.items())
            if path not in seen and _holds(field["when"], ctx) and _expected(path, seen)]
    return out


def _expected(path: str, seen: Mapping[str, set[str]]) -> bool:
    """Whether a path can be missing at all: not a list's element or a map's value (an empty
    one is a value), and its container is there as an object (else that is what differs)."""
    if path.endswith(("[]", "{}")):
        return False
    parent = path.rsplit(".", 1)[0] if "." in path else None
    return parent is None or "object" in seen.get(parent, set())


def golden_path(record: Mapping[str, Any]) -> Path:
    return GOLDEN / f"{record.get('runner')}.{record.get('mode')}.json"


def check(record: Mapping[str, Any]) -> list[str]:
    """problems() against the record's golden file; a record with none is one problem."""
    path = golden_path(record)
    if not path.exists():
        return [f"{path.stem}: no golden record {path.relative_to(REPO_ROOT)} (capture one: "
                f"{MODE_VAR}=write)"]
    return problems(record, _fields_of(path))


@functools.cache
def _fields_of(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())["fields"]


def capture(record: Mapping[str, Any], test: str, folder: Path) -> None:
    """Keep the record under `folder` and rewrite its golden file from every record of its
    runner and mode kept there."""
    kept = folder / golden_path(record).stem
    kept.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256(json.dumps([test, record], sort_keys=True).encode()).hexdigest()[:16]
    (kept / f"{digest}.json").write_text(json.dumps({"test": test, "record": record}))
    rebuild(kept)


def rebuild(kept: Path) -> None:
    """Rewrite the golden file of the records kept in `kept` (a folder <runner>.<mode>)."""
    entries = [json.loads(p.read_text()) for p in sorted(kept.glob("*.json"))]
    entries = [e for e in entries if "schema_version" in e["record"]]
    if not entries:
        return
    first = entries[0]["record"]
    GOLDEN.mkdir(parents=True, exist_ok=True)
    golden_path(first).write_text(golden_text(
        str(first.get("runner")), str(first.get("mode")), [e["test"] for e in entries],
        golden([e["record"] for e in entries])))


def golden_text(runner: str, mode: str, tests: list[str], fields: Mapping[str, Any]) -> str:
    """A golden file: JSON with one line per field, so a change reads as a one-line diff."""
    lines = [f"  {json.dumps(path)}: {json.dumps(field, sort_keys=True)}"
             for path, field in sorted(fields.items())]
    head = {"runner": runner, "mode": mode, "records": len(tests),
            "captured_from": sorted(set(tests))}
    return (json.dumps(head, indent=1)[:-2] + ',\n "fields": {\n' + ",\n".join(lines)
            + "\n }\n}\n")


# -- the hook (tests/conftest.py) ------------------------------------------------------------

def captured_tests() -> frozenset[str]:
    """The tests the golden files were captured from."""
    return frozenset(test for path in GOLDEN.glob("*.json")
                     for test in json.loads(path.read_text())["captured_from"])


def in_scope(nodeid: str, marks: Iterable[str], captured: frozenset[str]) -> bool:
    """Whether a test's records are checked (captured, when MGBENCH_GOLDEN_RECORDS=write):
    one the goldens were captured from (any, when capturing), not on SLURM or a GPU."""
    if set(marks) & set(SKIP_MARKS):
        return False
    return os.environ.get(MODE_VAR) == "write" or nodeid in captured


_walked: dict[Path, int] = {}  # basetemp's folders walked for runs/, by their mtime then
_runs_dirs: set[Path] = set()


def snapshot(base: Path) -> dict[Path, int]:
    """The records under `base` (pytest's temporary folder) with their modification times:
    runs/<run_id>.json, not the spec (.spec.json) or the child's result (.result.json). A
    folder of `base` is walked for runs/ folders when it is new or its entries changed; the
    runs/ folders found are listed every time (a whole walk per test costs seconds)."""
    for entry in base.iterdir():
        mtime = entry.stat().st_mtime_ns
        if entry.is_dir() and _walked.get(entry) != mtime:
            _walked[entry] = mtime
            _runs_dirs.update(p for p in entry.glob("**/runs") if p.is_dir())
    return {p: p.stat().st_mtime_ns for d in _runs_dirs if d.is_dir() for p in d.glob("*.json")
            if not p.name.endswith((".spec.json", ".result.json"))}


def after_test(test: str, base: Path, before: Mapping[Path, int]) -> list[str]:
    """Check (or capture, MGBENCH_GOLDEN_RECORDS=write) every record of a catalog runner
    written under `base` since `before`; the problems found."""
    from bench.catalog.registry import RUNNERS

    out: list[str] = []
    for path, mtime in sorted(snapshot(base).items()):
        if before.get(path) == mtime:
            continue
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # a damaged record is the test's own subject
        if not isinstance(record, dict) or "schema_version" not in record \
                or record.get("runner") not in RUNNERS:
            continue
        if os.environ.get(MODE_VAR) == "write":
            capture(record, test, Path(os.environ.get(CAPTURE_VAR) or DEFAULT_CAPTURE))
        else:
            out += check(record)
    return out


if __name__ == "__main__":  # python -m tests.golden_records [CAPTURE]: rewrite every golden
    import sys

    for folder in sorted(Path(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_CAPTURE).iterdir()):
        rebuild(folder)
