"""Which data-parallel equivalence cases run here, and which only mean something on GPUs.

tests/test_equivalence.py runs, for every runner with equivalence=True, its default options and
each option set of its catalog's `equivalence_options` at 1 and 2 virtual CPU devices. An
option that only moves work between devices that are one CPU here (`ps: gpu` where the first
tower device is /cpu:0, a merge on the first device, NCCL that has no CPU kernel) cannot change
anything on CPU: such a case is listed in `equivalence_gpu_only` with why, shown here as
"GPU only", and never counted as covered. docs/EQUIVALENCE.md holds the table
(`python -m bench.catalog.equivalence_coverage --markdown` rewrites it; a fast test keeps it
current).

Framework-free (reads the catalogs through bench.catalog.registry).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from bench import REPO_ROOT
from bench.catalog.doc_block import splice
from bench.catalog.registry import RUNNERS

DOC = REPO_ROOT / "docs" / "EQUIVALENCE.md"
BEGIN = ("<!-- equivalence:begin: python -m bench.catalog.equivalence_coverage --markdown "
         "writes what follows -->")
END = "<!-- equivalence:end -->"
RUNS_HERE = "runs here (1 vs 2 virtual CPU devices)"


def cases_run_here() -> list[tuple[str, dict[str, Any]]]:
    """(runner, options) of every case tests/test_equivalence.py runs on CPU."""
    return [(name, options) for name in sorted(n for n, r in RUNNERS.items() if r.equivalence)
            for options in ({}, *RUNNERS[name].equivalence_options)]


def rows() -> list[tuple[str, str, str]]:
    """(runner, options, where it runs) for every case, run here or GPU only."""
    out = []
    for name in sorted(n for n, r in RUNNERS.items() if r.equivalence):
        info = RUNNERS[name]
        for options in ({}, *info.equivalence_options):
            out.append((name, _options(options), RUNS_HERE))
        for options, why in info.equivalence_gpu_only:
            out.append((name, _options(options), f"GPU only: {why}"))
    return out


def _options(options: dict[str, Any]) -> str:
    return ", ".join(f"`{k}: {v}`" for k, v in options.items()) or "defaults"


def markdown() -> str:
    table = rows()
    here = sum(1 for r in table if r[2] == RUNS_HERE)
    lines = [f"{here} cases run on CPU here; {len(table) - here} are GPU only.", "",
             "| runner | options | where it runs |", "|---|---|---|"]
    lines += [f"| {r} | {o} | {w} |" for r, o, w in table]
    return "\n".join(lines) + "\n"


def with_markdown(text: str) -> str:
    return splice(text, BEGIN, END, markdown())


def main(argv: list[str] | None = None) -> int:
    """`python -m bench.catalog.equivalence_coverage --markdown`: rewrite docs/EQUIVALENCE.md's
    table;
    without --markdown print it."""
    parser = argparse.ArgumentParser(prog="python -m bench.catalog.equivalence_coverage",
                                     description=main.__doc__)
    parser.add_argument("--markdown", action="store_true", help="rewrite the table in PATH")
    parser.add_argument("path", nargs="?", default=str(DOC))
    args = parser.parse_args(argv)
    if not args.markdown:
        sys.stdout.write(markdown())
        return 0
    path = Path(args.path)
    path.write_text(with_markdown(path.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
