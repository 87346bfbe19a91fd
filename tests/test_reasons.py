"""Reason codes (contract/reasons.py): every code a runner writes is in the table, every
sentence in the table is written by some runner, the docs table is current, and no prose
constant of 100+ characters is left in runners/ to be copied into records."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from bench import REPO_ROOT
from contract import reasons
from contract.reasons import SENTENCES, code, sentence

RUNNERS = REPO_ROOT / "runners"
LONG = 100
# what looks like a code: a family and a snake_case name
CODE_LIKE = re.compile(r"^(jax|tf|torch|mxnet|memory)\.[a-z0-9_]+$")
# calls whose text stays prose: failures, Unavailable/Invalid reasons, logs, prints, regexes
PROSE_CALLS = {"Unavailable", "Invalid", "print", "log", "warning", "info", "debug", "error",
               "warn", "exception", "write", "compile", "sgd_recipe"}
# per-run lines built from run values (input_pipeline: batch, workers, shards, threads), left
# as templates: (module, how the literal starts)
TEMPLATES = {("runners/jax/data.py", "Grain over the JPEG file list"),
             ("runners/tf/cnn_benchmarks.py", " TFRecord shard(s): parallel_interleave"),
             ("runners/tf/data.py", "decode_and_crop_jpeg of a random S x S window")}


def _modules() -> list[tuple[str, ast.Module]]:
    out = []
    for path in sorted(RUNNERS.rglob("*.py")):
        out.append((str(path.relative_to(REPO_ROOT)), ast.parse(path.read_text())))
    assert len(out) > 50, "runners/ not found"
    return out


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def _codes_called() -> set[str]:
    """The literal argument of every code(...) call in runners/."""
    return {node.args[0].value for _, tree in _modules() for node in ast.walk(tree)
            if isinstance(node, ast.Call) and _name(node.func) == "code" and node.args
            and isinstance(node.args[0], ast.Constant)}


def _prose_nodes(tree: ast.Module) -> tuple[set[int], set[str]]:
    """ids of the nodes whose text stays prose (docstrings, raise, PROSE_CALLS), and the names
    of the constants given to such a call (an Unavailable reason defined once)."""
    skip: set[int] = set()
    names: set[str] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant):
            skip.add(id(body[0].value))
        inside = node.exc if isinstance(node, ast.Raise) else (
            node if isinstance(node, ast.Call) and _name(node.func) in PROSE_CALLS else None)
        for sub in ast.walk(inside) if inside is not None else ():
            skip.add(id(sub))
            if isinstance(sub, ast.Name):
                names.add(sub.id)
    return skip, names


def long_literals() -> list[tuple[str, int, str]]:
    """(module, line, text) of each string literal of LONG+ characters in runners/ (implicit
    concatenations joined) outside docstrings, prose calls and reason constants."""
    found, reason_names = [], set()
    trees = _modules()
    for _, tree in trees:
        reason_names |= _prose_nodes(tree)[1]
    for module, tree in trees:
        skip = _prose_nodes(tree)[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(
                    getattr(t, "id", None) in reason_names for t in node.targets):
                skip.update(id(sub) for sub in ast.walk(node.value))
        found += [(module, node.lineno, node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str)
                  and len(node.value) >= LONG and id(node) not in skip]
    return found


def _template(module: str, text: str) -> bool:
    return any(module == m and text.startswith(s) for m, s in TEMPLATES)


def test_every_code_used_is_in_the_table() -> None:
    used = _codes_called()
    assert len(used) > 50
    assert sorted(used - set(SENTENCES)) == []
    looks = {node.value for _, tree in _modules() for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and CODE_LIKE.match(node.value)}
    assert sorted(looks - set(SENTENCES)) == []


def test_every_sentence_is_used() -> None:
    assert sorted(set(SENTENCES) - _codes_called()) == []


def test_codes_are_short_and_sentences_long_enough() -> None:
    assert all(CODE_LIKE.match(c) and len(c) < 50 for c in SENTENCES), SENTENCES.keys()
    assert all(len(s) > 40 and s == s.strip() for s in SENTENCES.values())


def test_code_and_sentence() -> None:
    assert code("memory.jax_state") == "memory.jax_state"
    with pytest.raises(KeyError, match="memory.no_such_code"):
        code("memory.no_such_code")
    assert sentence("memory.jax_state") == SENTENCES["memory.jax_state"]
    free = "the process's resident memory; read by hand"
    assert sentence(free) == free
    joined = sentence("memory.vmhwm_timed_window; rank 2 missing; memory.no_gpu_allocator")
    assert joined == (f"{SENTENCES['memory.vmhwm_timed_window']}; rank 2 missing; "
                      f"{SENTENCES['memory.no_gpu_allocator']}")
    assert sentence(None) is None and sentence(3) == 3


def test_docs_table_is_current(tmp_path: Path) -> None:
    assert reasons.main(["--check"]) == 0, "python -m contract.reasons --markdown"
    stale = tmp_path / "RESULTS.md"
    stale.write_text(f"# x\n{reasons.BEGIN}\nold\n{reasons.END}\n")
    assert reasons.main(["--check", str(stale)]) == 1
    assert reasons.main(["--markdown", str(stale)]) == 0
    text = stale.read_text()
    assert reasons.main(["--check", str(stale)]) == 0
    assert all(f"`{c}`" in text for c in SENTENCES)


def test_no_long_prose_constant_in_runners() -> None:
    found = long_literals()
    left = [(m, line, text) for m, line, text in found if not _template(m, text)]
    assert left == [], "\n".join(f"{m}:{line}: {text[:80]!r}" for m, line, text in left)
    assert len(found) == len(TEMPLATES), "a TEMPLATES entry is no longer long: drop it"
