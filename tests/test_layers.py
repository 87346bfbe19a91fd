"""The parent's house by stage (docs/DESIGN.md, "Module map"): every module of bench/ belongs
to a stage package or is a named leaf, imports flow one way (records and catalog at the
bottom; plan; run and data; analysis; report; the cli on top), and no two modules import each
other, directly or round a circle. Read from the source with ast (function-level imports
count), so a new upward import fails here in a second, without a framework."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.cli import REPO

BENCH = REPO / "bench"
# each stage and the stages it may import (leaves: any stage may import them)
ALLOWED = {
    "records": set(),
    "catalog": set(),
    "plan": {"records", "catalog"},
    "data": {"records", "catalog", "plan"},
    "run": {"records", "catalog", "plan"},
    "analysis": {"records", "catalog", "plan"},
    "report": {"records", "catalog", "plan", "run", "analysis"},
    "cli": {"records", "catalog", "plan", "run", "analysis", "report", "data"},
}
LEAVES = {"bench", "bench.atomic", "bench.errors", "bench.plotting", "bench.text_table"}


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def bench_imports(path: Path) -> set[str]:
    """The bench modules path imports (module-level or inside functions)."""
    found: set[str] = set()
    package = module_name(path).rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "bench")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            if base.split(".")[0] != "bench":
                continue
            for alias in node.names:  # `from bench.run import envs` imports bench.run.envs
                sub = f"{base}.{alias.name}"
                found.add(sub if (BENCH.parent / (sub.replace(".", "/") + ".py")).exists()
                          or (BENCH.parent / sub.replace(".", "/")).is_dir() else base)
    return found


def stage(module: str) -> str:
    parts = module.split(".")
    if module in LEAVES:
        return "leaf"
    if module == "bench.cli":
        return "cli"
    assert len(parts) >= 2 and parts[1] in ALLOWED, \
        f"{module} is neither in a stage package ({', '.join(ALLOWED)}) nor a named leaf"
    return parts[1]


def graph() -> dict[str, set[str]]:
    return {module_name(p): bench_imports(p) for p in sorted(BENCH.rglob("*.py"))}


def test_every_module_sits_in_a_stage_and_imports_only_downward() -> None:
    upward = []
    for module, imports in graph().items():
        here = stage(module)
        for target in imports:
            there = stage(target)
            if there == "leaf" or there == here:
                continue
            if here == "leaf" or there not in ALLOWED[here]:
                upward.append(f"{module} ({here}) imports {target} ({there})")
    assert not upward, "imports against the flow:\n" + "\n".join(upward)


def test_no_import_circles() -> None:
    edges = {m: {t for t in ts if t != m} for m, ts in graph().items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert not cycles, "import circles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_each_stage_package_says_what_it_owns_and_may_import() -> None:
    for pkg in ALLOWED:
        if pkg == "cli":
            continue
        doc = ast.get_docstring(ast.parse((BENCH / pkg / "__init__.py").read_text()))
        assert doc and "import" in doc.lower(), \
            f"bench/{pkg}/__init__.py has no docstring saying what it may import"


def _top_imports(path: Path) -> set[str]:
    """The top-level packages path imports (module-level or inside functions)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def test_the_contract_imports_neither_side_and_the_parent_no_runner() -> None:
    contract = sorted((REPO / "contract").rglob("*.py"))
    assert len(contract) >= 8, "contract/ holds the settings, spec, catalogs, policy, collectives"
    wrong = [f"{p.relative_to(REPO)} imports {sorted(bad)}" for p in contract
             if (bad := _top_imports(p) & {"bench", "runners"})]
    parent = sorted(BENCH.rglob("*.py")) + [REPO / "run_bench.py"]
    wrong += [f"{p.relative_to(REPO)} imports runners" for p in parent
              if "runners" in _top_imports(p)]
    assert not wrong, "\n".join(wrong)
