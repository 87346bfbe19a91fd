"""A type checker over the framework-free packages: mypy (requirements-dev.txt) over contract/,
bench/plan/ and bench/records/ (pyproject.toml's [tool.mypy]: the modules they import are read
for their types only), its cache in .mypy_cache/ (gitignored). About 13 s of CPU from a cold
cache, about 1 s warm."""

import re
import subprocess
import sys

from bench import REPO_ROOT

CHECKED = ("contract", "bench/plan", "bench/records")


def test_mypy_finds_no_error_in_the_contract_the_plan_and_the_records() -> None:
    proc = subprocess.run([sys.executable, "-m", "mypy", *CHECKED], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)
    assert "No module named mypy" not in proc.stderr, \
        "mypy is not installed: pip install -r requirements-dev.txt"
    assert proc.returncode == 0, f"mypy reports (exit {proc.returncode}):\n" \
        f"{proc.stdout}{proc.stderr}"
    checked = re.search(r"no issues found in (\d+) source files", proc.stdout)
    assert checked and int(checked.group(1)) >= 30, proc.stdout  # every module of the three
