"""Every runner and probe of the registry has its page under docs/runners/ (mxnet_allreduce on
mxnet_native's), linked from docs/RUNNERS.md, and every module docstring of runners/ stays
short: the history lives on those pages (docs/DESIGN.md, "Where the code lives")."""

from __future__ import annotations

import ast

from bench.catalog.registry import PROBES, RUNNERS
from tests.helpers.cli import REPO

PAGES = REPO / "docs" / "runners"
ON_ANOTHER_PAGE = {"mxnet_allreduce": "mxnet_native"}
DOCSTRING_LINES = 20


def test_every_runner_and_probe_has_a_page_linked_from_runners_md() -> None:
    names = sorted({*RUNNERS, *PROBES})
    assert len(names) >= 20
    index = (REPO / "docs" / "RUNNERS.md").read_text()
    missing = []
    for name in names:
        page = ON_ANOTHER_PAGE.get(name, name)
        if not (PAGES / f"{page}.md").is_file():
            missing.append(f"{name}: no docs/runners/{page}.md")
        elif f"(runners/{page}.md)" not in index:
            missing.append(f"{name}: docs/RUNNERS.md does not link runners/{page}.md")
        elif name != page and name not in (PAGES / f"{page}.md").read_text():
            missing.append(f"{name}: not named on docs/runners/{page}.md")
    assert not missing, "\n".join(missing)


def test_runner_module_docstrings_are_short() -> None:
    modules = sorted((REPO / "runners").rglob("*.py"))
    assert len(modules) >= 40
    long = []
    for path in modules:
        doc = ast.get_docstring(ast.parse(path.read_text()))
        if doc and len(doc.splitlines()) > DOCSTRING_LINES:
            long.append(f"{path.relative_to(REPO)}: {len(doc.splitlines())} lines")
    assert not long, f"module docstrings over {DOCSTRING_LINES} lines:\n" + "\n".join(long)
