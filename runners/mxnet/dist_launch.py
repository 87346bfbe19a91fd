"""ps-lite's roles for a multi-node mxnet_native run (issue 16): the scheduler and the servers
of MXNet's `dist_sync` kvstore, started beside the worker by the worker itself.

MXNet 1.9.1's distributed training is a parameter server (ps-lite, 3rdparty/ps-lite): every
process has a role read from DMLC_ROLE. One scheduler (at DMLC_PS_ROOT_URI:DMLC_PS_ROOT_PORT)
registers the others and assigns their ids; DMLC_NUM_SERVER servers hold the keys; the
DMLC_NUM_WORKER workers push and pull them. MXNet's own launcher (tools/launch.py, through
dmlc-core's tracker: its local, ssh, mpi and slurm modes) starts the scheduler in the launching
process's tracker and the same training command once per worker and once per server, each with
its DMLC_ROLE; `import mxnet` in a server or scheduler runs that role
(mxnet/kvstore/kvstore_server.py: create('dist'), KVStoreServer.run()) and exits the process
when the job ends, so the training script never gets past its import there.

Here the harness starts one process per node through srun (bench/run/slurm_job.py), and that
process brings up the roles of its node as child processes of the same interpreter
(`python -m runners.mxnet.dist_launch ROLE`, whose `import mxnet` runs the role): on node rank
0 the scheduler (DMLC_PS_ROOT_URI = MGBENCH_MASTER_ADDR resolved to its address, as ps-lite
binds its sockets to the announced address and ZeroMQ binds no host names; DMLC_PS_ROOT_PORT =
MGBENCH_MASTER_PORT), on every node one server, and the process itself is that node's worker
(DMLC_ROLE=worker, DMLC_NUM_WORKER = DMLC_NUM_SERVER = the number of nodes). Each server and
worker announces DMLC_NODE_HOST, its node's address (SLURMD_NODENAME resolved), and binds the
port ps-lite reads from PORT: scheduler MGBENCH_MASTER_PORT, server of node r +1+r, worker of
node r +1+N+r (N <= 4 nodes fit the job's 10 ports; beyond that ps-lite picks free ports).
ps-lite's scheduler sorts the registered nodes by host, then port, before it assigns ranks, so
with one host for every node (this machine) the ports make kv.rank equal the harness's node
rank; on hosts with distinct addresses the order is the hosts' (descending), and the record
says when the two differ.

Ending: PsLite.close() frees the worker's kvstore (MXKVStoreFree), whose destructor is MXNet's
own end of a job: a barrier of the workers, worker 0 sends kStopServer to the servers, then
ps::Finalize's barrier of every node, after which the servers and the scheduler return from
their run and exit by themselves; close() waits for that (STOP_WAIT_S), and kills whatever is
left. When the run failed, nothing is waited for (the other workers may be stuck in a push):
the roles are killed at once. ps-lite notices no dead node, so a watcher thread ends the
worker (exit 1, no result) when one of its roles exits during the run, and srun's
--kill-on-bad-exit then ends the other nodes instead of leaving them waiting. A worker killed
outright takes its roles with it (PR_SET_PDEATHSIG), and they stay in its process group, which
the harness kills at the end too. runners.common.main ends with os._exit, so all of this
happens inside the runner's benchmark().

Evidence for the record: allgather() moves every worker's JSON through the kvstore itself
(dist_sync sums the workers' pushes; keys from GATHER_KEY), and the scheduler's own log
(PS_VERBOSE=1, relayed to stderr) names every server and worker it registered.
What differs from a real cluster here: both "nodes" are one machine (127.0.0.1), so the
servers and workers differ only by port. On a real cluster a node name that resolves to a
loopback address (127.0.1.1 in some /etc/hosts) must be overridden with DMLC_NODE_HOST or
DMLC_INTERFACE, which are honoured, as must MGBENCH_MASTER_ADDR resolve to the first node's
reachable address.

Imports MXNet only inside functions (a role process imports it as its role's last act).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runners.common import Invalid, Unavailable, node_identity

MODULE = "runners.mxnet.dist_launch"
MECHANISM = ("MXNet dist_sync kvstore over ps-lite: a scheduler on node rank 0 and a server "
             "on every node, started by that node's process, which is the node's worker")
REPO = Path(__file__).resolve().parents[2]
PORTS = 10  # MGBENCH_MASTER_PORT .. +9 are the job's (bench/run/slurm_job.py)
STOP_WAIT_S = 60.0  # how long close() waits for the kvstore's end, then for the roles' exits
KILL_GRACE_S = 5.0  # SIGTERM, then SIGKILL after this long
# The record's gathers use kvstore keys far above the Trainer's 0..P-1 (one per parameter),
# yet small: MXNet 1.9.1 picks a small key's server as (key * 9973) % servers in a C int
# (kvstore_dist.h EncodeDefaultKey), which overflows from key 215,326 on
GATHER_KEY = 1 << 16
DMLC_VARS = ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_WORKER",
             "DMLC_NUM_SERVER", "DMLC_NODE_HOST", "PORT", "DMLC_INTERFACE", "PS_VERBOSE")
# ps-lite's scheduler log (PS_VLOG(1), van.cc) as MXNet 1.9.1 prints it
ASSIGNED = re.compile(r"assign rank=(\d+) to node role=(\w+), ip=([^,]+), port=(\d+)")
CONNECTED = re.compile(r"the scheduler is connected to (\d+) workers and (\d+) servers")


def say(message: str, stream: Any = None) -> None:
    """One log line in one write: ps-lite's C++ threads write to the same stderr piecemeal,
    and under PYTHONUNBUFFERED print() writes a line and its newline apart."""
    stream = stream or sys.stdout
    stream.write(message + "\n")
    stream.flush()


def _death_signal() -> Any:
    """A preexec_fn for a role's process: have the kernel SIGKILL it when the worker that
    started it dies (Linux prctl PR_SET_PDEATHSIG), so a killed worker leaves no role behind.
    libc is loaded here, in the worker, so that the forked child only makes the call."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: the process group is all there is
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the worker died before the call
            os._exit(1)

    return arm


def resolved(name: str) -> str:
    """A host name as its IPv4 address: ps-lite binds its sockets to the address a node
    announces (ZeroMQ binds no host names), so DMLC_PS_ROOT_URI and DMLC_NODE_HOST are
    addresses; the name itself when it does not resolve."""
    try:
        return socket.gethostbyname(name)
    except OSError:
        return name


def node_address() -> str:
    """The address this node's server and worker announce (DMLC_NODE_HOST): the user's
    DMLC_NODE_HOST, else the SLURM node name (the host name outside SLURM) resolved; "" when
    the user named DMLC_INTERFACE instead (ps-lite then announces that interface's address)."""
    if os.environ.get("DMLC_NODE_HOST"):
        return os.environ["DMLC_NODE_HOST"]
    if os.environ.get("DMLC_INTERFACE"):
        return ""
    return resolved(os.environ.get("SLURMD_NODENAME") or socket.gethostname())


@dataclass(frozen=True)
class Place:
    """This node's place in the run, from the harness (bench.run.launch.NodePlace.env)."""

    rank: int
    count: int
    root_uri: str  # the scheduler's address: MGBENCH_MASTER_ADDR resolved
    root_port: int
    host: str

    @classmethod
    def from_env(cls, num_nodes: int) -> Place:
        env = os.environ
        missing = [v for v in ("MGBENCH_PROCESS_RANK", "MGBENCH_NUM_NODES",
                               "MGBENCH_MASTER_ADDR", "MGBENCH_MASTER_PORT") if not env.get(v)]
        if missing:
            raise Unavailable(f"a {num_nodes}-node mxnet_native run needs the harness's "
                              f"per-node launch (bench/run/slurm_job.py); {', '.join(missing)} "
                              "not set")
        place = cls(int(env["MGBENCH_PROCESS_RANK"]), int(env["MGBENCH_NUM_NODES"]),
                    resolved(env["MGBENCH_MASTER_ADDR"]), int(env["MGBENCH_MASTER_PORT"]),
                    node_address())
        if place.count != num_nodes or not 0 <= place.rank < place.count:
            raise Invalid(f"node rank {place.rank} of MGBENCH_NUM_NODES={place.count}, but the "
                          f"spec asks for {num_nodes} nodes")
        return place

    def port(self, role: str) -> int | None:
        """The port of this node's server or worker within the job's ports; None (ps-lite
        picks a free one) when 1 + 2 x nodes do not fit."""
        if 1 + 2 * self.count > PORTS:
            return None
        return self.root_port + 1 + self.rank + (self.count if role == "worker" else 0)

    def env(self, role: str) -> dict[str, str]:
        """The DMLC settings of one of this node's roles."""
        env = {"DMLC_ROLE": role, "DMLC_PS_ROOT_URI": self.root_uri,
               "DMLC_PS_ROOT_PORT": str(self.root_port), "DMLC_NUM_WORKER": str(self.count),
               "DMLC_NUM_SERVER": str(self.count)}
        if self.host:
            env["DMLC_NODE_HOST"] = self.host
        port = self.port(role)
        if port is not None:
            env["PORT"] = str(port)
        return env


@dataclass
class Role:
    """A scheduler or server process this worker started."""

    role: str
    proc: subprocess.Popen[bytes]
    env: dict[str, str]
    log: list[str] = field(default_factory=list)  # the scheduler's output (ps-lite's log)
    reader: threading.Thread | None = None
    ended: str = "running"  # how it ended: exited by itself, or killed by close()

    def record(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "role": self.role, "pid": self.proc.pid,
            "address": f"{self.env['DMLC_PS_ROOT_URI']}:{self.env['DMLC_PS_ROOT_PORT']}"
            if self.role == "scheduler" else
            f"{self.env.get('DMLC_NODE_HOST', 'DMLC_INTERFACE')}:"
            f"{self.env.get('PORT', 'ps-lite chose')}",
            "returncode": self.proc.returncode, "ended": self.ended}
        if self.role == "scheduler":
            out.update(ps_lite_log(self.log))
        return out


def ps_lite_log(lines: list[str]) -> dict[str, Any]:
    """What ps-lite's scheduler said of the nodes it registered (its PS_VERBOSE=1 log): the id
    it assigned each server and worker, with the host and port each announced, and its count
    of connected workers and servers."""
    assigned = [{"id": int(m[1]), "role": m[2], "host": m[3], "port": int(m[4])}
                for m in (ASSIGNED.search(ln) for ln in lines) if m]
    connected = next((m for m in (CONNECTED.search(ln) for ln in lines) if m), None)
    return {"ps_lite_assigned": assigned,
            "ps_lite_connected": {"workers": int(connected[1]), "servers": int(connected[2])}
            if connected else None}


class PsLite:
    """This node's ps-lite roles and its worker's DMLC settings (see the module docstring)."""

    def __init__(self, place: Place) -> None:
        self.place = place
        self.roles: list[Role] = []
        self.kv: Any = None
        self._saved_env: dict[str, str | None] = {}
        self._gathers = 0
        self._closing = threading.Event()

    def start(self) -> None:
        """Start the scheduler (node rank 0) and this node's server, set this process's DMLC
        settings as the worker's, and watch the roles."""
        if self.place.rank == 0:
            self._start_role("scheduler")
        self._start_role("server")
        for role in self.roles:  # threads only now: no fork (preexec_fn) beside them
            if role.reader is not None:
                role.reader.start()
        env = self.place.env("worker")
        for key in (*DMLC_VARS, *env):
            self._saved_env.setdefault(key, os.environ.get(key))
        os.environ.pop("PORT", None)  # ps-lite's own variable: only ours may reach it
        os.environ.update(env)
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        """A role that exits before close() leaves the workers waiting forever in ps-lite
        (which notices no dead node): say so, kill the other roles and end this process, so
        that srun (--kill-on-bad-exit) ends the run's other nodes."""
        while not self._closing.wait(1.0):
            gone = [r for r in self.roles if r.proc.poll() is not None]
            if gone and not self._closing.is_set():
                say(f"[mxnet dist] node {self.place.rank}: the ps-lite {gone[0].role} (pid "
                    f"{gone[0].proc.pid}) exited with {gone[0].proc.returncode} during the "
                    "run; ending this worker", sys.stderr)
                self._kill_left()
                os._exit(1)

    def _start_role(self, role: str) -> None:
        env = {**os.environ, **self.place.env(role)}
        if "PORT" not in self.place.env(role):
            env.pop("PORT", None)
        if role == "scheduler":  # its log names every node it registers (ps_lite_log)
            env["PS_VERBOSE"] = str(max(1, int(os.environ.get("PS_VERBOSE", "0") or 0)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH"))
                                            if p)
        cmd = [sys.executable, "-m", MODULE, role, "--node-rank", str(self.place.rank),
               "--root", f"{self.place.root_uri}:{self.place.root_port}"]
        capture = role == "scheduler"
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, preexec_fn=_death_signal(),
                                stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE if capture else None,
                                stderr=subprocess.STDOUT if capture else None)
        item = Role(role, proc, {k: env[k] for k in DMLC_VARS if k in env})
        self.roles.append(item)
        if capture:
            item.reader = threading.Thread(target=_relay, args=(proc, item.log, role),
                                           daemon=True)
        say(f"[mxnet dist] node {self.place.rank}: started the {role} (pid {proc.pid}, "
            f"{item.record()['address']})")

    def kvstore(self, kind: str) -> Any:
        """Start the roles, then this worker's kvstore of type `kind` (dist_sync...): MXNet's
        ps-lite worker, which returns once the scheduler has registered every node."""
        import mxnet as mx

        self.start()
        self.kv = mx.kv.create(kind)
        if self.kv.num_workers != self.place.count:
            raise Invalid(f"the kvstore has {self.kv.num_workers} workers; the run has "
                          f"{self.place.count} nodes")
        return self.kv

    def _check_roles(self) -> None:
        for role in self.roles:
            if role.proc.poll() is not None:
                raise RuntimeError(f"the ps-lite {role.role} (pid {role.proc.pid}) exited "
                                   f"with {role.proc.returncode} before the run ended")

    def allgather(self, obj: Any) -> list[Any]:
        """Every worker's `obj` (JSON-able), in kv.rank order, gathered through the kvstore
        itself: each worker pushes its encoded bytes in its own row of a zero array (first
        their lengths, then the bytes padded to the longest); dist_sync's servers sum the
        workers' pushes of a key before answering any pull, so each pull returns every row.
        Only while the servers run no optimizer (the Trainer's update_on_kvstore=False). A
        collective: every worker must call it, in the same order."""
        import mxnet as mx
        import numpy as np

        kv, n, rank = self.kv, self.kv.num_workers, self.kv.rank
        data = np.frombuffer(json.dumps(obj, default=str).encode(), np.uint8)

        def exchange(row: np.ndarray) -> np.ndarray:
            key = GATHER_KEY + self._gathers
            self._gathers += 1
            mine = np.zeros((n, row.size), np.float32)  # float32 holds bytes and sizes exactly
            mine[rank] = row
            kv.init(key, mx.nd.zeros(mine.shape))
            kv.push(key, mx.nd.array(mine))
            out = mx.nd.zeros(mine.shape)
            kv.pull(key, out=out)
            return out.asnumpy()

        sizes = exchange(np.array([data.size], np.float32))[:, 0].astype(int)
        padded = np.zeros(int(sizes.max()), np.float32)
        padded[:data.size] = data
        rows = exchange(padded).astype(np.uint8)
        return [json.loads(bytes(row[:size]).decode()) for row, size in zip(rows, sizes,
                                                                              strict=True)]

    def close(self, ok: bool) -> None:
        """End the ps-lite job: after a good run free the kvstore (MXNet's end of a job: the
        servers and the scheduler then exit by themselves) and wait for the roles; after a
        failure, or when they do not exit in STOP_WAIT_S, kill them. Restores this process's
        DMLC settings."""
        self._closing.set()
        try:
            if ok and self.kv is not None:
                self._check_roles()
                from mxnet.base import _LIB, check_call

                t0, handle = time.time(), self.kv.handle
                self.kv.handle = None  # its __del__ then frees NULL: a no-op
                # in a thread: its barriers wait for every worker, and one that failed after
                # the last collective never comes (srun --kill-on-bad-exit ends this one too)
                ender = threading.Thread(target=lambda: check_call(_LIB.MXKVStoreFree(handle)),
                                         daemon=True)
                ender.start()
                ender.join(STOP_WAIT_S)
                deadline = time.time() + STOP_WAIT_S
                for role in self.roles if not ender.is_alive() else ():
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        role.proc.wait(max(0.1, deadline - time.time()))
                    if role.proc.returncode is not None:
                        role.ended = "exited after the workers ended the kvstore"
                say(f"[mxnet dist] node {self.place.rank}: kvstore "
                    + (f"not ended after {STOP_WAIT_S:.0f} s (a worker missing?)"
                       if ender.is_alive() else f"ended in {time.time() - t0:.1f} s"))
        finally:
            self._kill_left()
            for key, value in self._saved_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def _kill_left(self) -> None:
        for role in self.roles:
            if role.proc.poll() is not None and role.ended == "running":
                role.ended = "exited during the run"
        alive = [r for r in self.roles if r.proc.poll() is None]
        for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
            for role in alive:
                with contextlib.suppress(ProcessLookupError):
                    role.proc.send_signal(sig)
                role.ended = f"killed ({sig.name}) by the worker"
            deadline = time.time() + wait
            for role in alive:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    role.proc.wait(max(0.1, deadline - time.time()))
            alive = [r for r in alive if r.proc.poll() is None]
        for role in self.roles:
            if role.reader is not None and role.reader.is_alive():
                role.reader.join(timeout=5)
            say(f"[mxnet dist] node {self.place.rank}: {role.role} pid {role.proc.pid} "
                f"{role.ended}, exit status {role.proc.returncode}")

    def finish_record(self, multi_node: dict[str, Any]) -> None:
        """Complete a multi_node record after close() with how this node's roles ended: the
        scheduler's full record (ps-lite's log of the nodes it registered, its exit status)
        and this node's server's exit status."""
        here = node_identity()["node"]
        for role in self.roles:
            rec = {"node": here, **role.record()}
            if role.role == "scheduler":
                multi_node["scheduler"] = {**(multi_node.get("scheduler") or {}), **rec}
                continue
            for server in multi_node.get("servers", []):
                if server["node"] == here and server["pid"] == rec["pid"]:
                    server.update(rec)

    def worker_record(self) -> dict[str, Any]:
        """This worker as it is gathered into the record: where it runs, what MXNet's
        kvstore says of it, its DMLC settings and the roles it started."""
        return {**node_identity(), "kv_rank": self.kv.rank, "process_rank": self.place.rank,
                "kv_num_workers": self.kv.num_workers, "kv_type": self.kv.type,
                "dmlc": {k: os.environ[k] for k in DMLC_VARS if k in os.environ},
                "roles": [{"role": r.role, "pid": r.proc.pid, "address": r.record()["address"],
                           "running_at_gather": r.proc.poll() is None} for r in self.roles]}


def _relay(proc: subprocess.Popen[bytes], log: list[str], role: str) -> None:
    """Keep a role's output lines and pass them on to this process's stderr."""
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.decode(errors="replace").rstrip()
        log.append(line)
        say(f"[ps-lite {role}] {line}", sys.stderr)


@contextlib.contextmanager
def session(num_nodes: int) -> Iterator[PsLite]:
    """This node's ps-lite roles for the duration of the block: started by its kvstore()
    call, ended on exit (after a good run the MXNet way, after an exception by killing them)."""
    ps = PsLite(Place.from_env(num_nodes))
    ok = False
    try:
        yield ps
        ok = True
    finally:
        ps.close(ok)


def run_role(argv: list[str]) -> None:
    """A role process: DMLC_ROLE (server or scheduler) is already in its environment, and
    importing MXNet runs the role until the job ends, then exits."""
    import argparse

    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}")
    parser.add_argument("role", choices=("server", "scheduler"))
    parser.add_argument("--node-rank", type=int, required=True)
    parser.add_argument("--root", required=True, help="the scheduler's address (for ps)")
    args = parser.parse_args(argv)
    if os.environ.get("DMLC_ROLE") != args.role:
        raise SystemExit(f"DMLC_ROLE={os.environ.get('DMLC_ROLE')!r}, not {args.role!r}")
    import mxnet  # noqa: F401  (mxnet.kvstore.kvstore_server runs the role and exits)

    raise SystemExit(f"import mxnet returned in the {args.role} role: this MXNet build did "
                     "not start ps-lite (no distributed kvstore?)")


if __name__ == "__main__":
    run_role(sys.argv[1:])
