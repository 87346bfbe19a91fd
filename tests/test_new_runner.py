"""`run_bench.py new-runner`: the template yields a runner that passes the runner contract,
in a copy of the repository (the checkout itself is never written)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.records.store import check_record, load_records
from tests.conftest import REPO, run_cli


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
    (["new-runner", "my_runner", "cntk"], "family 'cntk' has no runner template; allowed: jax"),
])
def test_bad_names_and_families_are_one_line(args: list[str], message: str) -> None:
    proc = run_cli(*args)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"error: {proc.stderr.strip()[7:]}"
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
@pytest.mark.framework("jax")
def test_template_runner_passes_the_contract_at_one_and_two_devices(
        tmp_path: Path, jax_python: str) -> None:
    root = repo_copy(tmp_path)
    made = cli_in(root, "new-runner", "my_runner", "jax", "--description", "a test runner")
    assert made.returncode == 0, made.stderr
    assert (root / "runners" / "jax" / "my_runner.py").is_file()
    listed = cli_in(root, "list")
    assert "my_runner" in listed.stdout and "a test runner" in listed.stdout
    out = tmp_path / "results"
    proc = cli_in(root, "--config", "configs/cpu-smoke.yaml", "--set", "runners=[my_runner]",
                  "--set", "warmup_steps=2", "--set", "measure_steps=3",
                  "--set", "batch_size_per_device=8", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    records = {r["num_devices"]: r for r in load_records(out)}
    assert sorted(records) == [1, 2]
    for n, rec in records.items():
        assert rec["status"] == "ok", rec.get("reason")
        assert check_record(rec) == []
        assert rec["samples"] == 3 * 8 * n
        # the framework's own shards: one device per replica, 8 rows each
        assert sorted(rec["placement"].values()) == [8] * n
