"""The test suite's own layout: what test modules share lives in tests/helpers/, never imported
from tests/conftest.py (fixtures and pytest hooks only) nor from another test module, so a test
module runs alone and reads without chasing its helpers through other tests."""

from __future__ import annotations

import ast
import re

from tests.helpers.cli import REPO

TESTS = REPO / "tests"
# an import of conftest or of a test module, in code or in a child script held in a string
BORROWED = re.compile(r"^\s*(?:from\s+(?:tests)?\.?(?:conftest|test_\w+)\s+import\b"
                      r"|import\s+(?:tests\.)?(?:conftest|test_\w+)\b)", re.M)


def test_no_module_imports_conftest_or_another_test_module() -> None:
    sources = sorted(TESTS.rglob("*.py"))
    assert len(sources) > 50, sources  # the suite itself, not an empty folder
    found = [f"{path.relative_to(REPO)}:{text.count(chr(10), 0, m.start()) + 1}: "
             f"{m.group(0).strip()}"
             for path in sources for text in [path.read_text()]
             for m in BORROWED.finditer(text)]
    assert not found, "import these from tests/helpers/ instead:\n" + "\n".join(found)


def test_conftest_holds_only_fixtures_and_hooks() -> None:
    tree = ast.parse((TESTS / "conftest.py").read_text())
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef)]
    assert functions
    shared = [f.name for f in functions
              if not f.name.startswith(("pytest_", "_"))
              and not any("fixture" in ast.unparse(d) for d in f.decorator_list)]
    assert not shared, f"move these to tests/helpers/: {shared}"


def test_child_scripts_are_files_the_tests_name() -> None:
    """A child script is a file in tests/children/ with a docstring: every one a test names
    exists, and every file there is named by a test or imported by another child."""
    children = {p.stem: p for p in (TESTS / "children").glob("*.py") if p.stem != "__init__"}
    assert len(children) > 30, sorted(children)
    named = re.compile(r"tests[/.]children[/.](\w+)")
    used = {m.group(1) for path in TESTS.rglob("*.py")
            for m in named.finditer(path.read_text()) if m.group(1) != path.stem}
    assert used - set(children) == set(), "named but missing"
    assert set(children) - used == set(), "in tests/children/ but run by no test"
    undocumented = [name for name, path in children.items()
                    if not ast.get_docstring(ast.parse(path.read_text()))]
    assert not undocumented, undocumented
