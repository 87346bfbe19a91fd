"""The ready CI files (docs/CI.md): .github/workflows/tests.yml and gpu-smoke.yml and the GitLab
example follow their schemas (check-jsonschema's vendored SchemaStore schemas), and each GitHub
workflow's shell steps run in order here on CPU (the smoke on a CPU config), after which every
file its upload step names exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from bench import REPO_ROOT
from tests.helpers.junit import assert_valid_junit

WORKFLOWS = REPO_ROOT / ".github" / "workflows"
GITLAB = REPO_ROOT / "docs" / "ci" / "gitlab-ci.yml"
# the actions a step may use; the test stands in for none of them but the upload, whose paths
# it checks (checkout: the repository is here; setup-python and the cache: this interpreter)
KNOWN_ACTIONS = ("actions/checkout@", "actions/setup-python@", "actions/cache@",
                 "actions/upload-artifact@")
CONTEXT = {"github.token": "", "github.event.repository.default_branch": "main"}


def schema_check(schema: str, *files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                           schema, *map(str, files)], capture_output=True, text=True,
                          timeout=120)


def test_the_workflows_and_the_gitlab_example_follow_their_schemas(tmp_path: Path) -> None:
    github = sorted(WORKFLOWS.glob("*.yml"))
    assert [p.name for p in github] == ["gpu-smoke.yml", "tests.yml"]
    for schema, files in (("vendor.github-workflows", github), ("vendor.gitlab-ci", [GITLAB])):
        done = schema_check(schema, *files)
        assert done.returncode == 0, done.stdout + done.stderr
    # the check can fail: a step with a key the schema does not know
    broken = tmp_path / "broken.yml"
    broken.write_text((WORKFLOWS / "tests.yml").read_text().replace("run: |", "runs: |", 1))
    assert schema_check("vendor.github-workflows", broken).returncode == 1


def expand(text: str, env: dict[str, str]) -> str:
    """GitHub's ${{ env.X }} and the few ${{ github.* }} values the workflows read."""
    def value(m: re.Match[str]) -> str:
        key = m.group(1).strip()
        if key.startswith("env."):
            return env[key[4:]]
        if key in CONTEXT:
            return CONTEXT[key]
        raise AssertionError(f"the test has no value for ${{{{ {key} }}}}")
    return re.sub(r"\$\{\{([^}]*)\}\}", value, text)


def run_workflow(name: str, overrides: dict[str, str]) -> list[Path]:
    """Every shell step of the workflow's one job in order, as GitHub runs them (bash -eo
    pipefail, in the repository, the workflow's, job's and step's env with `overrides` on
    top); the paths its upload steps name."""
    flow = yaml.safe_load((WORKFLOWS / name).read_text())
    (job,) = flow["jobs"].values()
    base = {**os.environ, **flow.get("env", {}), **job.get("env", {}), **overrides}
    uploads: list[Path] = []
    for step in job["steps"]:
        if "uses" in step:
            assert step["uses"].startswith(KNOWN_ACTIONS), step["uses"]
            if step["uses"].startswith("actions/upload-artifact@"):
                lines = expand(step["with"]["path"], base).split("\n")
                uploads += [Path(p.strip()) for p in lines if p.strip()]
            continue
        env = {**base, **{k: expand(str(v), base) for k, v in step.get("env", {}).items()},
               **overrides}
        done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
                               step["run"]], cwd=REPO_ROOT, env=env, capture_output=True,
                              text=True, timeout=900)
        assert done.returncode == 0, f"{name}: {step.get('name')}\n{done.stdout[-3000:]}" \
                                     f"\n{done.stderr[-3000:]}"
    return uploads


def cpu_smoke(folder: Path) -> Path:
    """The smoke on CPU: one real runner, one device, a few steps."""
    config = folder / "cpu-smoke.yaml"
    config.write_text("name: workflow-cpu-smoke\nrunners: [torch_ddp]\nmodels: [small_cnn]\n"
                      "devices: [1]\nbatch_size_per_device: 8\ndevice: cpu\nwarmup_steps: 1\n"
                      "measure_steps: 2\nrepeats: 1\ntimeout_s: 300\n")
    return config


@pytest.mark.slow
def test_the_gpu_smoke_workflow_runs_on_cpu_and_uploads_its_results(
        tmp_path: Path, torch_python: str) -> None:
    out = tmp_path / "results"
    uploads = run_workflow("gpu-smoke.yml", {
        "CONFIG": str(cpu_smoke(tmp_path)), "OUT": str(out),
        "BASELINE": str(tmp_path / "baseline")})
    assert uploads and all(p.exists() for p in uploads), [p for p in uploads if not p.exists()]
    assert {p.name for p in uploads} >= {"report.html", "results.md", "junit.xml", "runs"}
    assert_valid_junit(out / "junit.xml")
    cases = ET.parse(out / "junit.xml").getroot().iter("testcase")
    assert [c.get("classname") for c in cases] == ["mgbench.torch_ddp"]
    assert list((out / "runs").glob("torch_ddp__small_cnn__*.json"))


@pytest.mark.slow
def test_the_tests_workflow_runs_the_readme_command_and_uploads_its_report(
        tmp_path: Path) -> None:
    reports = tmp_path / "test-results"
    uploads = run_workflow("tests.yml", {
        "TEST_RESULTS": str(reports),
        # the README's command through .ci/run, on one quick test instead of the whole suite
        "PYTEST_ADDOPTS": f"--junitxml={reports}/junit.xml -p no:cacheprovider "
                          "tests/test_front_door.py::test_readme_is_under_250_lines"})
    assert uploads == [reports / "junit.xml"] and uploads[0].exists()
    suite = ET.parse(uploads[0]).getroot().find("testsuite")
    assert suite is not None and suite.get("tests") == "1" and suite.get("failures") == "0"
