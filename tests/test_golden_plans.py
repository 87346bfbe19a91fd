"""Golden plans: what the harness plans for each shipped config, compared with files on disk.

For every configs/<name>.yaml, and every tests/golden/configs/<name>.yaml (a plan no shipped
config makes: option axes), tests/golden/<name>.txt holds (docs/DESIGN.md, "Golden plans"):
the expanded runs (bench.plan.runs.expand, with a fixed sweep id); the child command and the
environment the launcher gives the child (bench.run.launch.child_command, child_env) of the
config's first benchmark run at 1 and at 2 devices; and that run's sbatch command and batch
script (bench.run.slurm.sbatch_command, batch_script) at 1 and at 2 nodes, with the command
node 0 of the 2-node job starts. Whatever depends on the host is a placeholder (<repo>, <out>,
<harness-python>, <dataset>), the interpreters are fake paths (none is built), the inherited
environment is a fixed one and the host's physical cores a fixed count, so the files are the
same on every machine and the tests need no framework.

A change to any of these shows as a unified diff. Once it is checked to be intended:
    python -m pytest tests/test_golden_plans.py --update-golden
rewrites the files (tests/conftest.py adds the option).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import shlex
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import yaml

from bench import REPO_ROOT
from bench.plan.config import ConfigError, load_config
from bench.plan.runs import RunSpec, expand
from bench.records.store import runs_dir
from bench.run import launch
from bench.run.envs import python_for
from bench.run.launch import NodePlace, child_command, child_env
from bench.run.slurm import batch_script, sbatch_command
from bench.run.slurm_job import job_dir, master_port
from bench.run.sweep import precheck
from contract import launch_env
from contract.spec import Spec

GOLDEN = REPO_ROOT / "tests" / "golden"
# the shipped configs, then the test's own: plans no shipped config makes (option axes)
CONFIGS = sorted((REPO_ROOT / "configs").glob("*.yaml")) + sorted(
    (GOLDEN / "configs").glob("*.yaml"))
UPDATE = "python -m pytest tests/test_golden_plans.py --update-golden"
SWEEP_ID = "golden"
CORES = 16  # the host's physical cores, as contract.launch_env.physical_cores would say
INHERITED = {"HOME": "/home/user", "PATH": "/usr/local/bin:/usr/bin:/bin"}  # the parent's env
OUT = Path("/mgbench-golden/results")  # the sweep's results folder: only ever named, not made
JOB_ID = "4242"  # the SLURM job of the 2-node run, as node 0 sees it
MASTER_ADDR = "node1"
INDENT = "    "
FIELDS = [f.name for f in dataclasses.fields(Spec) if f.name != "run_id"]


def fake_python(family: str) -> str:
    """The interpreter a sweep would give the family (bench.run.sweep.interpreters builds it)."""
    return f"/envs/{family}/bin/python"


def show(value: Any) -> str:
    """A value on one line: a plain string as it is, anything else as JSON (keys sorted)."""
    if isinstance(value, str) and value and value == value.strip() and value.isprintable():
        return value
    return json.dumps(value, sort_keys=True)


def argument_lines(cmd: Iterable[str]) -> list[str]:
    """A command, one argument a line (an empty or blank one as JSON)."""
    return [INDENT + show(str(arg)) for arg in cmd]


def env_lines(env: dict[str, str], inherited: dict[str, str]) -> list[str]:
    """What env sets or changes over inherited, and what it drops, one variable a line."""
    lines = [f"{INDENT}{k}={v}" for k, v in sorted(env.items()) if inherited.get(k) != v]
    lines += [f"{INDENT}unset {k}" for k in sorted(set(inherited) - set(env))]
    return lines or [f"{INDENT}(nothing)"]


def verdict(spec: RunSpec) -> str:
    """bench.run.sweep.precheck's word on a run (the GPU count left out: the host's)."""
    found = precheck(spec, None)
    return "launched" if found is None else f"{found[0]}: {found[1]}"


# ---- the plan ----

def plan_lines(runs: list[RunSpec]) -> list[str]:
    """The runs, factored: the fields every run shares, those each runner's runs share, then
    one line a run with the rest; the runs precheck refuses."""
    rows = [r.to_dict() for r in runs]
    common = [f for f in FIELDS if all(row[f] == rows[0][f] for row in rows)]
    by_runner: dict[str, dict[str, Any]] = {}
    for row in rows:
        by_runner.setdefault(row["runner"], row)
    per_runner = [f for f in FIELDS if f not in common and f != "runner"
                  and all(row[f] == by_runner[row["runner"]][f] for row in rows)]
    rest = [f for f in FIELDS if f not in common and f not in per_runner]
    lines = [f"\n== plan: {len(runs)} runs (bench.plan.runs.expand, sweep_id {SWEEP_ID})",
             "-- the same in every run"]
    lines += [f"{INDENT}{f}: {show(rows[0][f])}" for f in common]
    if per_runner:
        lines.append("-- the same in every run of a runner")
        for runner, row in by_runner.items():
            lines.append(f"{INDENT}{runner}:")
            lines += [f"{INDENT * 2}{f}: {show(row[f])}" for f in per_runner]
    lines.append("-- each run, in the plan's order: run_id, then its other fields")
    lines += [f"{INDENT}{row['run_id']}  " + " ".join(f"{f}={show(row[f])}" for f in rest)
              for row in rows]
    refused: dict[str, list[str]] = {}
    for run in runs:
        if (word := verdict(run)) != "launched":
            refused.setdefault(word, []).append(run.run_id)
    if refused:
        lines.append("-- recorded without a launch, by bench.run.sweep.precheck's reason (the GPU "
                     "count is the host's, not checked here)")
        for reason, ids in refused.items():
            lines += [f"{INDENT}{reason}", *(INDENT * 2 + run_id for run_id in ids)]
    return lines


# ---- one run: its child, its job ----

def same_run(a: RunSpec, b: RunSpec) -> bool:
    """The same run but for its device and node counts."""
    return a.group_key == b.group_key and a.repeat == b.repeat


def variants(config: Path, sets: list[str], first: RunSpec, extra: list[str]
             ) -> tuple[dict[str, Any], dict[tuple[int, int], RunSpec]] | str:
    """first's runs in the plan of the config with `extra` --set overrides, by (nodes,
    devices); or the ConfigError that plan is refused with."""
    try:
        cfg = load_config(config, [*sets, *extra])
    except ConfigError as exc:
        return str(exc)
    found = {(r.num_nodes, r.num_devices): r for r in expand(cfg, SWEEP_ID) if same_run(r, first)}
    return cfg.cluster, found


def child_lines(spec: RunSpec, out: Path) -> list[str]:
    """The run's command and environment as bench.run.launch.launch starts it on one machine."""
    python = str(python_for(spec, {spec.family: fake_python(spec.family)}))
    rdir = runs_dir(out)
    cmd = child_command(spec, python, rdir / f"{spec.run_id}.spec.json",
                        rdir / f"{spec.run_id}.<attempt>.result.json")
    return [f"precheck: {verdict(spec)}", f"interpreter: {python}",
            "command (child_command, one argument a line):", *argument_lines(cmd),
            "environment (child_env: what it sets or changes):",
            *env_lines(child_env(spec), dict(os.environ))]


def node_lines(spec: RunSpec, out: Path) -> list[str]:
    """Node 0's command and environment in the run's job (bench.run.slurm_job run_node)."""
    place = NodePlace(rank=0, count=spec.num_nodes, master_addr=MASTER_ADDR,
                      master_port=master_port(JOB_ID), job_id=JOB_ID)
    python = str(python_for(spec, {spec.family: fake_python(spec.family)}))
    cmd = child_command(spec, python, runs_dir(out) / f"{spec.run_id}.spec.json",
                        job_dir(out, spec.run_id, JOB_ID) / "result.json", place)
    return [f"node 0's command (slurm_job node: child_command with {place}):",
            *argument_lines(cmd),
            "node 0's environment (child_env and NodePlace.env: what they set or change):",
            *env_lines({**child_env(spec), **place.env()}, dict(os.environ))]


def job_lines(spec: RunSpec, cluster: dict[str, Any], out: Path) -> list[str]:
    """The run's sbatch command and batch script as bench.run.slurm.submit writes them."""
    python = str(python_for(spec, {spec.family: fake_python(spec.family)}))
    script = runs_dir(out) / f"{spec.run_id}.sbatch"
    return [f"precheck: {verdict(spec)}", f"cluster: {show(cluster)}",
            "sbatch (sbatch_command, the sweep's first job: no dependency):",
            *argument_lines(sbatch_command(spec, cluster, script, out, None)),
            "batch script (batch_script):",
            *[(INDENT + line).rstrip() for line in batch_script(spec, python, out).splitlines()]]


def run_lines(config: Path, sets: list[str], first: RunSpec, out: Path) -> list[str]:
    """first's child at 1 and 2 devices, and its job at 1 and 2 nodes (or why either is not
    planned)."""
    lines: list[str] = []
    local = variants(config, sets, first, ["devices=[1, 2]"])
    for n in (1, 2):
        head = f"\n== child at {n} device{'s' if n > 1 else ''}"
        if isinstance(local, str):
            lines += [f"{head}: not planned ({local})"]
        elif (1, n) not in local[1]:
            lines += [f"{head}: not planned (the plan with devices=[1, 2] has no such run)"]
        else:
            lines += [f"{head}: {local[1][(1, n)].run_id}", *child_lines(local[1][(1, n)], out)]
    per_node = first.devices_per_node
    slurm = variants(config, sets, first, ["nodes=[1, 2]", "cluster.backend=slurm"])
    for nodes in (1, 2):
        head = (f"\n== slurm job at {nodes} node{'s' if nodes > 1 else ''} x {per_node} "
                f"device{'s' if per_node > 1 else ''} per node")
        if isinstance(slurm, str):
            lines += [f"{head}: not planned ({slurm})"]
            continue
        cluster, found = slurm
        spec = found.get((nodes, nodes * per_node))
        if spec is None:
            lines += [f"{head}: not planned (no such run with nodes=[1, 2])"]
            continue
        lines += [f"{head}: {spec.run_id}", *job_lines(spec, cluster, out)]
        if nodes > 1:
            lines += node_lines(spec, out)
    return lines


# ---- the file ----

def stand_ins(config: Path, tmp: Path) -> tuple[list[str], list[str]]:
    """--set overrides that give the plan what it needs from the host (a prepared dataset
    folder), and the header's words for them."""
    raw = yaml.safe_load(config.read_text(encoding="utf-8"))
    if not (isinstance(raw, dict) and raw.get("dataset")):
        return [], []
    folder = tmp / "dataset"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"classes": 1}))
    (folder / "splits.npz").write_bytes(b"")  # mode converge's plan checks it is there
    return [f"dataset.path={folder}"], [
        f"Stand-in: dataset.path (the config's: {raw['dataset'].get('path')}) is <dataset>, a "
        "folder the test makes holding only a manifest.json of 1 class and an empty "
        "splits.npz (all the plan reads of it), given as --set dataset.path=<dataset>, so that "
        "the plan needs no prepared dataset."]


HEADER = (
    "Golden plan of {config}, checked by tests/test_golden_plans.py. Do not edit: "
    "once a change is checked to be intended, rewrite with\n  {update}",
    "Placeholders: <repo> the repository root, <out> the results folder, <harness-python> the "
    "interpreter of the harness (sys.executable), <attempt> launch's attempt token; a family's "
    "interpreter is /envs/<family>/bin/python (none is built). The child's environment is what "
    "the launcher sets over an inherited environment of {inherited} alone, on a host of {cores} "
    "physical cores (runners/threads.py divides them).",
    "\"child\" and \"slurm job\" show {first}: below \"child\" as the plan with --set "
    "devices=[1, 2] has it, below \"slurm job\" as the plan with --set nodes=[1, 2] --set "
    "cluster.backend=slurm has it (the config's cluster section{cluster}).",
)


def comment(paragraphs: Iterable[str]) -> str:
    """Paragraphs as # comment lines, a blank comment line between them (a paragraph's lines
    after its first are kept as they are)."""
    def lines(paragraph: str) -> list[str]:
        first, *rest = paragraph.split("\n")
        return [*textwrap.wrap(first, 93), *rest]
    return "#\n".join("".join(f"# {line}\n" for line in lines(p)) for p in paragraphs)


def golden_text(config: Path, tmp: Path) -> str:
    """The golden file of config, placeholders in (tmp: where stand-ins go)."""
    sets, notes = stand_ins(config, tmp)
    cfg = load_config(config, sets)
    runs = expand(cfg, SWEEP_ID)
    first = next((r for r in runs if r.mode == "benchmark"), runs[0])
    local = cfg.cluster["backend"] == "local"
    words = dict(
        config=config.relative_to(REPO_ROOT), update=UPDATE,
        inherited=" and ".join(sorted(INHERITED)), cores=CORES,
        first="the plan's first benchmark run" if first.mode == "benchmark" else
        f"the plan's first run (mode {first.mode}: the plan has no benchmark run)",
        cluster=": the defaults but the backend, as the config runs locally" if local else "")
    text = comment([p.format(**words) for p in HEADER] + notes)
    text += "\n".join([*plan_lines(runs), *run_lines(config, sets, first, OUT)]) + "\n"
    host = {sys.executable: "<harness-python>", str(OUT): "<out>", str(REPO_ROOT): "<repo>"}
    if sets:
        host[str((tmp / "dataset").resolve())] = "<dataset>"
        host[str(tmp / "dataset")] = "<dataset>"
    # the batch script quotes paths (a host's path with a space in it): the quoted form first
    host.update({shlex.quote(path): name for path, name in list(host.items())})
    for path in sorted(host, key=len, reverse=True):
        text = text.replace(path, host[path])
    return text


def golden_path(config: Path) -> Path:
    return GOLDEN / f"{config.stem}.txt"


@pytest.fixture
def update_golden(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-golden"))


@pytest.mark.parametrize("config", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_plan_matches_its_golden_file(config: Path, tmp_path: Path, update_golden: bool,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launch_env, "physical_cores", lambda: CORES)
    monkeypatch.setattr(launch, "busy_cpus", lambda: 0.0)  # a quiet host at every launch
    with mock.patch.dict(os.environ, INHERITED, clear=True):
        actual = golden_text(config, tmp_path)
    path = golden_path(config)
    if update_golden:
        GOLDEN.mkdir(exist_ok=True)
        if not path.exists() or path.read_text(encoding="utf-8") != actual:
            path.write_text(actual, encoding="utf-8")
        return
    rel, source = path.relative_to(REPO_ROOT), config.relative_to(REPO_ROOT)
    if not path.exists():
        pytest.fail(f"{rel} is missing: {source} has no golden plan. Write it "
                    f"with `{UPDATE}` and check what it plans.", pytrace=False)
    expected = path.read_text(encoding="utf-8")
    if actual != expected:
        diff = "".join(difflib.unified_diff(
            expected.splitlines(keepends=True), actual.splitlines(keepends=True),
            fromfile=f"{rel} (golden)", tofile=f"{source} (planned now)"))
        pytest.fail(f"the plan of {source} differs from {rel}:\n{diff}\n"
                    f"If the change is intended, run `{UPDATE}` and commit the files.",
                    pytrace=False)


def test_every_config_has_a_golden_file_and_every_golden_file_a_config(
        update_golden: bool) -> None:
    configs = {c.stem for c in CONFIGS}
    assert len(configs) == len(CONFIGS), "a test config named like a shipped one (one golden)"
    goldens = {g.stem for g in GOLDEN.glob("*.txt")}
    orphans = sorted(goldens - configs)
    missing = [] if update_golden else sorted(configs - goldens)  # the update writes them
    assert not orphans and not missing, (
        f"golden files without a config: {orphans} (delete tests/golden/<name>.txt of a config "
        f"that is gone); configs without a golden file: {missing} (write them with `{UPDATE}`)")
