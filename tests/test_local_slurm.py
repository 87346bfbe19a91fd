"""The local 2-node SLURM cluster (tools/local_slurm.sh, docs/SLURM.md) runs real jobs.

The `local_slurm` fixture brings the cluster up (installing Debian's packages on first use) and
skips only where it cannot start: not root, or no SLURM and no apt-get to install it. Any other
failure to start is a test failure. A cluster the fixture started is stopped at the session's
end; one that was already up is left as it was."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.slurm import STATE_DIR

pytestmark = pytest.mark.slurm

FINAL_STATES = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
                "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def slurm(env: dict[str, str], *args: str, timeout: float = 60) -> str:
    """SLURM's command ARGS run from the cluster's state folder (a job given no --output
    writes its slurm-<id>.out there, not into the repository); its stdout."""
    proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=STATE_DIR)
    assert proc.returncode == 0, f"{args}: rc {proc.returncode}\n{proc.stdout}{proc.stderr}"
    return proc.stdout


def submit(env: dict[str, str], *args: str) -> str:
    """sbatch ARGS; the job id."""
    return slurm(env, "sbatch", "--parsable", "--job-name=mgbench-test", *args).strip()


def job_fields(env: dict[str, str], job_id: str) -> dict[str, str]:
    """The job's record in the controller (kept MinJobAge=600 s after it ends)."""
    out = slurm(env, "scontrol", "show", "job", "-o", job_id)
    return dict(re.findall(r"(\w+)=(\S*)", out))


def jobcomp_state(env: dict[str, str], job_id: str) -> str | None:
    """The job's final state in the job completion log (jobcomp/filetxt), if written yet."""
    config = slurm(env, "scontrol", "show", "config")
    loc = re.search(r"^JobCompLoc\s*=\s*(\S+)", config, re.M)
    path = Path(loc.group(1)) if loc else STATE_DIR / "jobcomp.txt"
    if not path.exists():
        return None
    for line in path.read_text().splitlines():
        if line.startswith(f"JobId={job_id} "):
            return re.search(r"JobState=(\S+)", line).group(1)
    return None


def accounting(env: dict[str, str]) -> bool:
    """Whether the cluster runs slurmdbd (tools/local_slurm.sh up --accounting): sacct works."""
    config = slurm(env, "scontrol", "show", "config")
    return "accounting_storage/slurmdbd" in config


def sacct_state(env: dict[str, str], job_id: str) -> str | None:
    """The job's state in SLURM's accounting database ("CANCELLED by 0" -> "CANCELLED")."""
    out = slurm(env, "sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State")
    return out.split()[0] if out.split() else None


def wait_final(env: dict[str, str], job_id: str, timeout: float) -> dict[str, str]:
    """The job's fields once SLURM says it has ended, with its state in the job completion log
    under "JobComp" and, where the cluster has accounting, in sacct under "Sacct"."""
    deadline = time.monotonic() + timeout
    with_sacct = accounting(env)
    while True:
        fields = job_fields(env, job_id)
        fields["JobComp"] = jobcomp_state(env, job_id)
        if with_sacct:
            fields["Sacct"] = sacct_state(env, job_id)
        if fields["JobState"] in FINAL_STATES and fields["JobComp"] and \
                (not with_sacct or fields["Sacct"] in FINAL_STATES):
            return fields
        assert time.monotonic() < deadline, f"job {job_id} not ended in SLURM's records: {fields}"
        time.sleep(1)


def assert_state(fields: dict[str, str], state: str) -> None:
    """Every record SLURM keeps of the job gives STATE."""
    assert fields["JobState"] == state
    assert fields["JobComp"] == state
    assert fields.get("Sacct", state) == state


@pytest.fixture(scope="module", autouse=True)
def time_limited_job(local_slurm: dict[str, str]):
    """A one-minute-limit job that sleeps for five, submitted first so that its minute (and
    the up to 30 s SLURM takes to notice) passes while the other tests run."""
    job_id = submit(local_slurm, "-N1", "--time=00:01:00", "--output=/dev/null",
                    "--wrap", "sleep 300")
    yield job_id, time.monotonic()
    subprocess.run(["scancel", job_id], capture_output=True, env=local_slurm)


def test_srun_spans_both_nodes(local_slurm):
    out = slurm(local_slurm, "srun", "-N2", "-n2", "--time=1", "bash", "-c",
                "echo $SLURM_NODEID $SLURM_PROCID $SLURMD_NODENAME $SLURM_NNODES "
                "$SLURM_JOB_NODELIST")
    rows = [line.split() for line in out.splitlines()]
    assert len(rows) == 2, out
    assert {r[0] for r in rows} == {"0", "1"}  # SLURM_NODEID
    assert {r[1] for r in rows} == {"0", "1"}  # SLURM_PROCID
    assert {r[2] for r in rows} == {"node1", "node2"}
    assert {r[3] for r in rows} == {"2"}
    assert {r[4] for r in rows} == {"node[1-2]"}


@pytest.mark.slow  # waits for a two-node job to run and be recorded final
def test_sbatch_wait_completes(local_slurm, tmp_path):
    log = tmp_path / "job.out"
    job_id = submit(local_slurm, "--wait", "-N2", "--time=1", f"--output={log}", "--wrap",
                    "srun bash -c 'echo $SLURMD_NODENAME $SLURM_PROCID $SLURM_NNODES'")
    assert sorted(log.read_text().splitlines()) == ["node1 0 2", "node2 1 2"]
    fields = wait_final(local_slurm, job_id, timeout=30)
    assert_state(fields, "COMPLETED")
    assert fields["ExitCode"] == "0:0"
    assert (fields["NumNodes"], fields["NodeList"]) == ("2", "node[1-2]")


def test_scancel_cancels_a_running_job(local_slurm):
    job_id = submit(local_slurm, "-N2", "--time=2", "--output=/dev/null", "--wrap",
                    "srun sleep 300")
    deadline = time.monotonic() + 30
    while job_fields(local_slurm, job_id)["JobState"] != "RUNNING":
        assert time.monotonic() < deadline, "the job did not start in 30 s"
        time.sleep(0.5)
    slurm(local_slurm, "scancel", job_id)
    fields = wait_final(local_slurm, job_id, timeout=30)
    assert_state(fields, "CANCELLED")


# slow: it waits out the job's minute (and SLURM's up to 30 s to notice), which the fast set
# has nothing else to overlap with
@pytest.mark.slow
def test_time_limit_gives_timeout(local_slurm, time_limited_job):
    job_id, submitted = time_limited_job
    fields = wait_final(local_slurm, job_id, timeout=150 - (time.monotonic() - submitted))
    assert_state(fields, "TIMEOUT")
    assert (fields["Reason"], fields["TimeLimit"]) == ("TimeLimit", "00:01:00")


@pytest.mark.slow
def test_the_harness_records_a_job_slurm_timed_out(local_slurm, time_limited_job, tmp_path,
                                                    monkeypatch):
    """bench.run.slurm.collect on a job SLURM killed at its time limit before the run wrote a
    record (the same job as above, ended by now): a `timeout` record with SLURM's state."""
    from bench.plan.config import validate
    from bench.plan.runs import expand
    from bench.run.slurm import collect

    job_id, submitted = time_limited_job
    wait_final(local_slurm, job_id, timeout=150 - (time.monotonic() - submitted))
    monkeypatch.setenv("SLURM_CONF", local_slurm["SLURM_CONF"])
    [spec] = expand(validate({"runners": ["torch_ddp"], "models": ["minigooglenet"],
                              "devices": [1], "batch_size_per_device": 8,
                              "cluster": {"backend": "slurm"}}), "s")
    rec = collect(spec, {"job_id": job_id, "python": "python"}, tmp_path, {"host": "h"})
    assert rec["status"] == "timeout" and "TIMEOUT" in rec["reason"], rec["reason"]
    assert rec["slurm"]["state"] == "TIMEOUT" and rec["slurm"]["job_id"] == job_id
    assert json.loads((tmp_path / "runs" / f"{spec.run_id}.json").read_text()) == rec
