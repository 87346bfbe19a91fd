"""The front door (issue 30): a README a newcomer reads in five minutes whose commands, files
and example config are true; docs/CONFIG.md as the schema says; `--help` that shows the
common options and every command in one line each."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from bench import REPO_ROOT
from bench.cli import COMMANDS, COMMON_OPTIONS, _parser, overview
from bench.plan import config_doc
from bench.plan.config import load_config

README = REPO_ROOT / "README.md"
CLI = [sys.executable, str(REPO_ROOT / "run_bench.py")]


def readme() -> str:
    return README.read_text()


def test_readme_is_under_250_lines() -> None:
    assert len(readme().splitlines()) < 250


def test_every_file_the_readme_names_exists() -> None:
    text = readme()
    named = set(re.findall(r"(?<![\w/.-])((?:docs|configs|notebooks|reference|tools|results)"
                           r"/[\w./-]+\.(?:md|yaml|ipynb|csv|sh|png))", text))
    assert {"docs/CONFIG.md", "configs/cpu-smoke.yaml",
            "notebooks/explore_results.ipynb"} <= named
    missing = sorted(n for n in named if not (REPO_ROOT / n).is_file())
    assert not missing, f"README names files that do not exist: {missing}"


def test_the_readme_example_sweep_file_is_valid(tmp_path) -> None:
    block = re.search(r"## A sweep file\n+```yaml\n(.*?)```", readme(), re.S)
    assert block, "README has no example sweep file"
    assert len(block.group(1).splitlines()) <= 12
    path = tmp_path / "my-sweep.yaml"
    path.write_text(block.group(1))
    cfg = load_config(path, [])
    assert cfg.name == yaml.safe_load(block.group(1))["name"]


def test_the_readme_runner_table_names_only_runners() -> None:
    from bench.catalog.registry import RUNNERS

    table = readme().split("## Runners", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^\| `(\w+)`(?:, `(\w+)`)?(?:, `(\w+)`)?", table, re.M))
    runners = {n for row in named for n in row if n}
    assert runners == set(RUNNERS), (runners ^ set(RUNNERS))


def test_config_reference_is_the_schemas() -> None:
    assert (REPO_ROOT / "docs" / "CONFIG.md").read_text() == config_doc.markdown(), (
        f"docs/CONFIG.md is out of date: {config_doc.COMMAND}")


def test_config_reference_names_every_key_and_runner_option() -> None:
    from bench.catalog.registry import RUNNERS
    from bench.plan.config import json_schema

    text = config_doc.markdown()
    for key in json_schema()["properties"]:
        assert f"| `{key}` |" in text or f"## `{key}`" in text, key
    for runner, info in RUNNERS.items():
        for option in info.options:
            assert f"`runner_options.{runner}.{option}`" in text, (runner, option)


def test_help_shows_the_common_options_and_every_command_in_one_line_each() -> None:
    proc = subprocess.run([*CLI, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert proc.stdout == overview(_parser())
    for option in COMMON_OPTIONS:
        assert sum(ln.lstrip().startswith(option + " ") for ln in lines) == 1, option
    for command in COMMANDS:
        [line] = [ln for ln in lines if ln.startswith(f"  {command} ")]
        assert len(line.split(None, 1)[1]) > 10, line  # it says what the command does
    assert all(len(ln) <= 100 for ln in lines), max(lines, key=len)


@pytest.mark.parametrize("command", COMMANDS)
def test_each_command_has_its_own_help(command: str) -> None:
    proc = subprocess.run([*CLI, command, "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: run_bench.py {command}"), proc.stdout[:200]


def test_no_arguments_shows_the_overview_and_exits_2() -> None:
    proc = subprocess.run(CLI, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stdout == "" and proc.stderr == overview(_parser())
