"""docs/MODELS.md's table of the runners that take a user's own model, per framework, from the
catalogs' `RunnerInfo.custom_models` (`python -m bench.catalog.custom_models_doc --markdown`
rewrites it; a fast test keeps it current). Framework-free."""

from __future__ import annotations

import sys

from bench import REPO_ROOT
from bench.catalog.doc_block import splice
from bench.catalog.registry import RUNNERS
from models.custom import FRAMEWORKS

DOC = REPO_ROOT / "docs" / "MODELS.md"
BEGIN = "<!-- custom-models:begin: python -m bench.catalog.custom_models_doc --markdown -->"
END = "<!-- custom-models:end -->"


def markdown() -> str:
    lines = ["| framework | runners |", "|---|---|"]
    for framework in FRAMEWORKS:
        runners = [n for n, r in RUNNERS.items() if framework in r.custom_models]
        lines.append(f"| {framework} | {', '.join(runners) or 'none yet'} |")
    return "\n".join(lines) + "\n"


def with_markdown(text: str) -> str:
    return splice(text, BEGIN, END, markdown())


if __name__ == "__main__":
    if sys.argv[1:] == ["--markdown"]:
        DOC.write_text(with_markdown(DOC.read_text()))
    else:
        sys.stdout.write(markdown())
