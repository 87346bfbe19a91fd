"""`run_bench.py new-runner`: every template yields a runner that passes the data-parallel
equivalence test and the runner contract as generated, in a copy of the repository (the
checkout itself is never written); and, without a framework, that each generated module
compiles and its catalog entry parses."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.catalog.new_runner import render, template, templates
from bench.records.store import check_record, load_records
from contract.catalog import RunnerInfo
from tests.helpers.cli import REPO, run_cli

TEMPLATES = ("jax", "keras", "mxnet", "tf", "torch")
DESCRIPTION = "a test runner, 'quoted' \"twice\""


def repo_copy(tmp_path: Path) -> Path:
    """The files git knows (tracked, or untracked and not ignored), copied to tmp_path/repo."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.split("\0")
    root = tmp_path / "repo"
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, root / rel)
    return root


def cli_in(root: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "run_bench.py", *args], cwd=root, text=True,
                          capture_output=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(root)})


@pytest.mark.parametrize("args, message", [
    (["new-runner", "tf_mirrored", "jax"], "runner name 'tf_mirrored' is taken"),
    (["new-runner", "Bad-Name", "jax"], "runner name 'Bad-Name': lower-case letters"),
    (["new-runner", "my_runner", "cntk"],
     "family 'cntk' has no runner template; allowed: jax, keras, mxnet, tf, torch"),
])
def test_bad_names_and_families_are_one_line(args: list[str], message: str) -> None:
    proc = run_cli(*args)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {proc.stderr.strip()[7:]}"
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


def test_every_family_has_a_template() -> None:
    assert tuple(templates()) == TEMPLATES


@pytest.mark.parametrize("name", TEMPLATES)
def test_generated_module_compiles_and_its_catalog_entry_parses(name: str) -> None:
    kind = template(name)
    module, entry = render("my_runner", name, DESCRIPTION)
    compile(module, f"runners/{kind.package}/my_runner.py", "exec")
    assert module.startswith(f'"""my_runner: {DESCRIPTION}\n')
    assert "def benchmark(spec: Spec)" in module and "main(benchmark, equivalence)" in module
    catalog = REPO / "contract" / "catalogs" / f"{kind.package}.py"
    compile(catalog.read_text() + entry, str(catalog), "exec")  # appended, the file parses
    listed: list[RunnerInfo] = []
    exec(entry, {"RUNNERS": listed, "RunnerInfo": RunnerInfo})
    assert listed == [RunnerInfo(
        "my_runner", kind.family, f"runners.{kind.package}.my_runner", DESCRIPTION,
        precisions=("fp32",), equivalence=True, launcher=kind.launcher)]
    assert kind.family in ("tf", "torch", "mxnet", "jax")


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=[pytest.mark.slow, pytest.mark.framework(template(name).family)])
    for name in TEMPLATES])
def test_template_runner_passes_equivalence_and_the_contract(
        name: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """Generated in one repo copy: listed, the equivalence test (1 vs 2 devices) passes, and a
    short benchmark at 1 and 2 devices on the probe model gives valid records."""
    request.getfixturevalue(f"{template(name).family}_python")  # the environment, built once
    root = repo_copy(tmp_path)
    made = cli_in(root, "new-runner", "my_runner", name, "--description", "a test runner")
    assert made.returncode == 0, made.stderr
    assert (root / "runners" / template(name).package / "my_runner.py").is_file()
    listed = cli_in(root, "list")
    assert "my_runner" in listed.stdout and "a test runner" in listed.stdout
    # the project's own equivalence test, run in the copy: it picks the runner up from there
    eq = subprocess.run([sys.executable, "-m", "pytest", "tests/test_equivalence.py", "-q",
                         "-k", "my_runner", "-p", "no:cacheprovider", "-o", "addopts="],
                        cwd=root, capture_output=True, text=True, timeout=600,
                        env={**os.environ, "PYTHONPATH": str(root)})
    assert eq.returncode == 0 and "1 passed" in eq.stdout, eq.stdout[-4000:] + eq.stderr
    out = tmp_path / "results"
    sets = ("runners=[my_runner]", "models=[probe]", "warmup_steps=1", "measure_steps=2",
            "batch_size_per_device=8")
    proc = cli_in(root, "--config", "configs/cpu-smoke.yaml", "--out", str(out),
                  *(arg for s in sets for arg in ("--set", s)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = {r["num_devices"]: r for r in load_records(out)}
    assert sorted(records) == [1, 2]
    for n, rec in records.items():
        assert rec["status"] == "ok", rec.get("reason")
        assert check_record(rec) == []
        assert rec["samples"] == 2 * 8 * n
        # read back from the framework: one device (rank, context) per replica
        assert len(rec["placement"]) == n == rec["result"]["replicas"], rec["placement"]
