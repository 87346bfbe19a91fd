"""The local 2-node SLURM cluster (tools/local_slurm.sh, docs/SLURM.md) runs real jobs.

The `local_slurm` fixture brings the cluster up (installing Debian's packages on first use) and
skips only where it cannot start: not root, or no SLURM and no apt-get to install it. Any other
failure to start is a test failure. A cluster the fixture started is stopped at the session's
end; one that was already up is left as it was. A job SLURM ends at its time limit is checked in
tests/test_slurm_sweep.py, whose sweeps run on one node while the job's minute passes on the
other."""

from __future__ import annotations

import time

import pytest

from tests.helpers.slurm import assert_state, job_fields, slurm, submit, wait_final

pytestmark = pytest.mark.slurm


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
