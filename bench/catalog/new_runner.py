"""`run_bench.py new-runner NAME FAMILY`: a new runner from its family's template
(runners/templates/<family>.py.tmpl), written as runners/<family>/<name>.py and listed in
runners/<family>/catalog.py, ready to run and to edit (docs/DESIGN.md, "Add a runner")."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench import REPO_ROOT
from bench.catalog.registry import PIPELINES, RUNNERS
from bench.errors import ConfigError

NAME = re.compile(r"[a-z][a-z0-9_]{1,39}")


def templates(root: Path = REPO_ROOT) -> list[str]:
    """The families that have a runner template."""
    return sorted(p.name.split(".")[0] for p in (root / "runners" / "templates").glob("*.py.tmpl"))


def catalog_entry(name: str, family: str, description: str) -> str:
    """The RunnerInfo line appended to the family's catalog (JSON strings are Python literals,
    in the catalogs' double quotes, whatever quotes the description holds)."""
    module = json.dumps(f"runners.{family}.{name}")
    return (f"\nRUNNERS.append(RunnerInfo(\n"
            f"    {json.dumps(name)}, {json.dumps(family)}, {module}, {json.dumps(description)},\n"
            f"    precisions=(\"fp32\",),\n"
            f"))\n")


def new_runner(name: str, family: str, description: str = "",
               root: Path = REPO_ROOT) -> list[Path]:
    """Write the runner and its catalog entry; the files written. ConfigError (one line) for
    a bad name, a name already taken or a family without a template."""
    if not NAME.fullmatch(name):
        raise ConfigError(f"runner name {name!r}: lower-case letters, digits and _, starting "
                          f"with a letter, 2 to 40 characters")
    if name in RUNNERS or name in PIPELINES:
        raise ConfigError(f"runner name {name!r} is taken; `run_bench.py list` shows the names")
    known = templates(root)
    if family not in known:
        raise ConfigError(f"family {family!r} has no runner template; allowed: "
                          f"{', '.join(known)}")
    module = root / "runners" / family / f"{name}.py"
    if module.exists():
        raise ConfigError(f"runner name {name!r}: {module} exists")
    description = description or f"a new {family} runner (from the template)"
    text = (root / "runners" / "templates" / f"{family}.py.tmpl").read_text()
    module.write_text(text.format(name=name, description=description))
    catalog = root / "runners" / family / "catalog.py"
    with catalog.open("a") as fh:
        fh.write(catalog_entry(name, family, description))
    return [module, catalog]
