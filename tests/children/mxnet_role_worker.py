"""A worker outside SLURM (one node: the scheduler, one server and this worker) that meets its
roles in a dist_sync kvstore, says so, then, told to go on, dies as argv[1] says: killed (the
test SIGKILLs it) or by an exception inside the session."""

import os
import sys
import time

from runners.mxnet import dist_launch

try:
    with dist_launch.session(1) as ps:
        kv = ps.kvstore("dist_sync")
        pids = " ".join(str(r.proc.pid) for r in ps.roles)
        sys.stdout.write(f"READY {kv.num_workers} {pids}\n")  # one write: one line
        sys.stdout.flush()
        sys.stdin.readline()  # the test has seen the roles
        if sys.argv[1] == "raise":
            raise RuntimeError("the run failed")
        time.sleep(600)
except RuntimeError as exc:
    sys.stdout.write(f"RAISED {exc} {[r.ended for r in ps.roles]}\n")
    sys.stdout.flush()
os._exit(0)  # as runners.common.main: the kvstore's destructor would wait for the roles
