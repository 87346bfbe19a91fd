"""From a sweep file to a SweepConfig: read it, apply the --set overrides, validate it with
the pydantic model, resolve the rules that span keys."""

import re
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from bench.errors import ConfigError
from bench.plan.config.batches import model_names, narrow_batches
from bench.plan.config.messages import SHOW_CHARS, _show, _show_path
from bench.plan.config.model import sweep_model
from bench.plan.config.rules import _resolve
from bench.plan.config.sweep_config import SweepConfig
from bench.plan.config.translate import _first_error
from bench.plan.config.yaml_reader import MAX_SET_BYTES, MAX_SET_PARTS, parse_yaml, read_config_text


def validate(raw: Any, default_name: str = "sweep", narrowed: frozenset[str] = frozenset(),
             notes: tuple[str, ...] = ()) -> SweepConfig:
    """Turn a parsed YAML mapping into a SweepConfig, or raise ConfigError; once it is valid,
    print the notes (the --set narrowing's) and the validation's own."""
    if not isinstance(raw, dict):
        raise ConfigError("config: expected a mapping of keys at the top level, got "
                          f"{_show(raw)}")
    model = sweep_model()
    context: dict[str, Any] = {"narrowed": narrowed, "notes": list(notes)}
    try:
        sweep = model.model_validate(raw, context=context)
    except ValidationError as exc:
        raise _first_error(exc, model, raw) from None
    resolved = _resolve(sweep, default_name)
    for note in context["notes"]:
        print(note, file=sys.stderr)
    return resolved


def apply_override(raw: dict[str, Any], assignment: str) -> None:
    """Apply one `--set key.sub=value` (value parsed as YAML) to the raw config in place."""
    key, sep, text = assignment.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"--set: {_show(assignment)} is not allowed; allowed: key=value "
                          "(e.g. devices=[1,2] or runner_options.tf_mirrored.xla=true)")
    shown = key if re.fullmatch(r"[\w.-]+", key, re.ASCII) and len(key) <= SHOW_CHARS \
        else _show(key)
    parts = key.split(".")
    if len(parts) > MAX_SET_PARTS:
        raise ConfigError(f"--set {shown}: a key of {len(parts)} dotted parts is not allowed; "
                          f"allowed: at most {MAX_SET_PARTS} (e.g. "
                          "runner_options.tf_mirrored.xla)")
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SET_BYTES:
        raise ConfigError(f"--set {shown}: {_show(text)} is not allowed; allowed: a value of "
                          f"at most {MAX_SET_BYTES // 1024} KiB (put a longer one in the "
                          "config file)")
    value = parse_yaml(text, f"--set {shown}: {_show(text)}")
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(parts[: i + 1])
            raise ConfigError(f"--set {shown}: {_show(where)} is {_show(child)}, not a mapping "
                              "to set keys in")
        node = child
    node[parts[-1]] = value


def load_config(path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> SweepConfig:
    """Read, override and validate a YAML sweep file."""
    path = Path(path)
    text = read_config_text(path)
    raw = parse_yaml(text, f"--config: {_show_path(path)}")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"--config: {_show_path(path)} holds {type(raw).__name__}; allowed: a "
                          "mapping of keys (runners, models, devices, ...)")
    # runners the file runs and gives options to: a --set runners=[...] may drop them
    runners, options = raw.get("runners"), raw.get("runner_options")
    own = runners if isinstance(runners, list) else [runners]
    opts = options if isinstance(options, dict) else {}
    given = frozenset(r for r in opts if isinstance(r, str) and r in own)
    file_models = model_names(raw.get("models"))  # a batch mapping may name them
    for assignment in overrides:
        apply_override(raw, assignment)
    keys_set = {str(a).split("=", 1)[0].strip() for a in overrides}
    notes = narrow_batches(raw, file_models, keys_set) if "models" in keys_set else []
    return validate(raw, default_name=path.stem, narrowed=given if "runners" in keys_set
                    else frozenset(), notes=tuple(notes))
