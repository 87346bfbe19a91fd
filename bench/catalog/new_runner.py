"""`run_bench.py new-runner NAME TEMPLATE`: a new runner from a template
(runners/templates/<template>.py.tmpl), written as runners/<package>/<name>.py and listed in
contract/catalogs/<package>.py, ready to run and to edit (docs/DESIGN.md, "Add a runner"). A
template is named after its framework family (tf, torch, mxnet, jax) or, for keras, after the
multi-backend Keras 3 runners, written to runners/jax/: they run in the jax environment
(TEMPLATES)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from bench import REPO_ROOT
from bench.catalog.registry import PIPELINES, PROBES, RUNNERS
from bench.errors import ConfigError

NAME = re.compile(r"[a-z][a-z0-9_]{1,39}")
EQUIVALENCE = re.compile(r"^def equivalence\(", re.MULTILINE)


@dataclass(frozen=True)
class Template:
    """Where a template's runner goes and how the parent starts it."""

    package: str  # runners/<package>/ holds the module and the catalog that lists it
    family: str  # the environment it runs in (bench.catalog.registry.FAMILIES)
    launcher: str = "python"  # RunnerInfo.launcher


# A template not listed here writes to runners/<template>/ and runs in the family <template>.
TEMPLATES: dict[str, Template] = {
    "keras": Template("jax", "jax"),  # Keras 3 on the jax backend, as keras_jax
    "torch": Template("torch", "torch", "torchrun"),  # one process per device
}


def templates(root: Path = REPO_ROOT) -> list[str]:
    """The names of the runner templates (runners/templates/<name>.py.tmpl)."""
    return sorted(p.name.split(".")[0] for p in (root / "runners" / "templates").glob("*.py.tmpl"))


def template(name: str) -> Template:
    """Where the template `name` puts its runner and how it runs."""
    return TEMPLATES.get(name, Template(name, name))


def catalog_entry(name: str, kind: Template, description: str, equivalence: bool) -> str:
    """The RunnerInfo line appended to the package's catalog (JSON strings are Python literals,
    in the catalogs' double quotes, whatever quotes the description holds)."""
    module = json.dumps(f"runners.{kind.package}.{name}")
    launcher = f"    launcher={json.dumps(kind.launcher)},\n" if kind.launcher != "python" else ""
    return (f"\nRUNNERS.append(RunnerInfo(\n"
            f"    {json.dumps(name)}, {json.dumps(kind.family)}, {module}, "
            f"{json.dumps(description)},\n"
            f"    precisions=(\"fp32\",),\n"
            f"    equivalence={equivalence},\n"
            f"{launcher}"
            f"))\n")


def render(name: str, template_name: str, description: str, root: Path = REPO_ROOT
           ) -> tuple[str, str]:
    """(the runner module's text, its catalog entry) from the template; equivalence=True in
    the entry when the template implements `equivalence(spec)`."""
    text = (root / "runners" / "templates" / f"{template_name}.py.tmpl").read_text()
    module = text.format(name=name, description=description)
    entry = catalog_entry(name, template(template_name), description,
                          bool(EQUIVALENCE.search(module)))
    return module, entry


def new_runner(name: str, template_name: str, description: str = "",
               root: Path = REPO_ROOT) -> list[Path]:
    """Write the runner and its catalog entry; the files written. ConfigError (one line) for
    a bad name, a name already taken or a family without a template."""
    if not NAME.fullmatch(name):
        raise ConfigError(f"runner name {name!r}: lower-case letters, digits and _, starting "
                          f"with a letter, 2 to 40 characters")
    if name in RUNNERS or name in PIPELINES or name in PROBES:
        raise ConfigError(f"runner name {name!r} is taken; `run_bench.py list` shows the names")
    known = templates(root)
    if template_name not in known:
        raise ConfigError(f"family {template_name!r} has no runner template; allowed: "
                          f"{', '.join(known)}")
    package = root / "runners" / template(template_name).package
    module = package / f"{name}.py"
    if module.exists():
        raise ConfigError(f"runner name {name!r}: {module} exists")
    description = description or f"a new {template_name} runner (from the template)"
    text, entry = render(name, template_name, description, root)
    module.write_text(text)
    catalog = root / "contract" / "catalogs" / f"{template(template_name).package}.py"
    with catalog.open("a") as fh:
        fh.write(entry)
    return [module, catalog]
