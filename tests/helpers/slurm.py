"""The local 2-node SLURM cluster's tool and state folder (tools/local_slurm.sh, docs/SLURM.md),
and SLURM's commands and records of a job on it."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from tests.helpers.cli import REPO

SLURM_TOOL = REPO / "tools" / "local_slurm.sh"
STATE_DIR = Path(os.environ.get("MGBENCH_SLURM_DIR", "/tmp/mgbench-slurm"))

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
