"""docs/CONFIG.md, the configuration reference, written from the sweep's JSON Schema
(bench.plan.config.json_schema), so that every key, type, default and bound in it is the one
the harness validates with. `python -m bench.plan.config_doc` rewrites the file;
tests/test_front_door.py fails while it is out of date. Imports: bench.plan.config and the
declaration of the keys (contract/settings.py), whose words fill what the schema leaves out."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench import REPO_ROOT
from bench.plan.config import json_schema
from contract import settings

DOC = REPO_ROOT / "docs" / "CONFIG.md"
COMMAND = "python -m bench.plan.config_doc"
HUGE = 2**53  # a bound at or beyond this is the type's own limit, not a rule of the key


def _resolve(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    return defs[ref.rsplit("/", 1)[1]] if ref else node


def _branches(node: dict[str, Any], defs: dict[str, Any]) -> list[dict[str, Any]]:
    """The alternatives a value may take (anyOf/oneOf), null left out."""
    alts = node.get("anyOf") or node.get("oneOf") or [node]
    return [_resolve(a, defs) for a in alts if a.get("type") != "null"]


def _bounds(node: dict[str, Any]) -> str:
    parts = []
    for key, word in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
                      ("exclusiveMaximum", "<")):
        value = node.get(key)
        if value is not None and abs(value) < HUGE:
            parts.append(f"{word} {value:g}" if isinstance(value, float) else f"{word} {value}")
    if node.get("maxLength") is not None:
        parts.append(f"at most {node['maxLength']} characters")
    if node.get("pattern"):
        parts.append(f"matching `{node['pattern']}`")
    return " ".join(parts)


def _one_type(node: dict[str, Any]) -> str:
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    if "const" in node:
        return f"`{node['const']}`"
    kind = node.get("type")
    if kind == "array":
        items = node.get("items", {})
        inner = _one_type(items) if items else "value"
        return f"list of {inner}"
    if kind == "object" and "properties" in node:
        return "mapping (keys below)"
    if kind == "object":
        return "mapping"
    text = {"integer": "integer", "number": "number", "string": "string",
            "boolean": "true \\| false"}.get(str(kind), str(kind or "any"))
    bounds = _bounds(node)
    return f"{text} {bounds}".strip()


def type_text(node: dict[str, Any], defs: dict[str, Any]) -> str:
    """A value's allowed forms in a few words: `a \\| b`, `integer >= 1`, `list of ...`;
    a value or a list of the same values: `one or a list of: ...`; a mapping of names to
    values last: `; or a mapping of name to: ...`."""
    seen: list[str] = []
    alts = _branches(node, defs)
    named = [alt["additionalProperties"] for alt in alts if alt.get("type") == "object"
             and isinstance(alt.get("additionalProperties"), dict)]
    if named:
        others = {**node, "anyOf": [a for a in alts if a.get("type") != "object"]}
        return f"{type_text(others, defs)}; or a mapping of name to: " \
            f"{type_text(named[0], defs)}"
    for alt in alts:
        text = _one_type(alt)
        if alt.get("type") == "array" and alt.get("items"):
            text = f"list of {type_text(alt['items'], defs)}"
        if text not in seen:
            seen.append(text)
    singles = [t for t in seen if not t.startswith("list of ")]
    if singles and all(t.startswith("list of ") and t[8:] in singles for t in seen
                       if t not in singles):
        lists = [t for t in seen if t not in singles]
        if lists:
            return "one or a list of: " + " or ".join(singles)
    return " or ".join(seen) or "any"


def _default(node: dict[str, Any]) -> str:
    if "default" not in node:
        return "required" if node.get("_required") else "-"
    value = node["default"]
    if isinstance(value, dict) and value:
        return "(below)"
    return "-" if value is None else f"`{json.dumps(value)}`"


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _object_rows(prefix: str, props: dict[str, Any], required: set[str],
                 defs: dict[str, Any], words: dict[str, str] | None = None
                 ) -> tuple[list[str], list[tuple[str, dict[str, Any]]]]:
    """Table rows of one mapping's keys, and the nested mappings to describe after it
    (words: a key's description where the schema has none)."""
    rows, nested = [], []
    for key, raw in props.items():
        node = dict(raw)
        node["_required"] = key in required
        path = f"{prefix}{key}"
        said = node.get("description") or (words or {}).get(key, "")
        rows.append(f"| `{path}` | {type_text(node, defs)} | {_default(node)} | "
                    f"{_cell(said)} |")
        for alt in _branches(node, defs):
            if alt.get("type") == "object" and alt.get("properties"):
                nested.append((path, alt))
    return rows, nested


HEAD = ["| key | allowed | default | what it is |", "|---|---|---|---|"]


def markdown() -> str:
    """The whole reference page."""
    schema = json_schema()
    defs = schema.get("$defs", {})
    out = [
        "# Configuration reference",
        "",
        f"Generated from the sweep's JSON Schema by `{COMMAND}`; do not edit by hand",
        "(`python run_bench.py schema` prints the schema itself, for editors). A list value",
        "where a key takes one is an axis of the sweep (a run per value). Rules that span keys",
        "(one batch key, a dataset for real data, ...) are checked by `run_bench.py` itself:",
        "`--dry-run` is the quick check. docs/USAGE.md explains the keys with examples.",
        "",
        "## Sweep keys",
        "",
        *HEAD,
    ]
    top = {k: v for k, v in schema["properties"].items() if k != "runner_options"}
    declared = {x.key_name: x.help for x in settings.config_settings()
                if x.help and x.key_name == x.name}  # else the help is of the record's field
    rows, nested = _object_rows("", top, set(schema.get("required", [])), defs, declared)
    out += rows
    while nested:
        path, node = nested.pop(0)
        out += ["", f"## `{path}`", ""]
        if node.get("description"):
            out += [_cell(node["description"]), ""]
        rows, more = _object_rows(f"{path}.", node["properties"],
                                  set(node.get("required", [])), defs)
        out += [*HEAD, *rows]
        nested += more
    runners = _resolve(schema["properties"]["runner_options"], defs).get("properties", {})
    out += ["", "## `runner_options`", "",
            "Per runner, under `runner_options.<runner>`; a list of values is an option axis "
            "(a run per value).", ""]
    for runner, ref in sorted(runners.items()):
        node = (_branches(ref, defs) or [{}])[0]
        props = node.get("properties", {})
        if not props:
            continue
        out += [f"### `{runner}`", "", _cell(ref.get("description", "")), ""]
        rows, _ = _object_rows(f"runner_options.{runner}.", props, set(), defs)
        out += [*HEAD, *rows, ""]
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", nargs="?", type=Path, default=DOC)
    args = parser.parse_args(argv)
    args.path.write_text(markdown())
    print(f"wrote {args.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
