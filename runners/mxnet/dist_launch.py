"""ps-lite's roles for a multi-node mxnet_native run (the dist_sync kvstore's scheduler and
servers, started by the node's worker as `python -m runners.mxnet.dist_launch ROLE`) and the
multi-node record. Differs from MXNet's tools/launch.py: the harness starts one process per
node (srun), which starts its roles. Imports MXNet only inside functions.
docs/runners/mxnet_native.md, "Notes from the code", has ports and shutdown."""

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contract.reasons import code
from runners.common import Invalid, Spec, Unavailable, finite, node_identity

MODULE = "runners.mxnet.dist_launch"
REPO = Path(__file__).resolve().parents[2]
STOP_WAIT_S = 60.0  # how long close() waits for the kvstore's end, then for the roles' exits
KILL_GRACE_S = 5.0  # SIGTERM, then SIGKILL after this long
DMLC_VARS = ("DMLC_ROLE", "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_WORKER",
             "DMLC_NUM_SERVER", "DMLC_NODE_HOST", "PORT", "DMLC_INTERFACE", "PS_VERBOSE")
# ps-lite's scheduler log (PS_VLOG(1), van.cc) as MXNet 1.9.1 prints it
ASSIGNED = re.compile(r"assign rank=(\d+) to node role=(\w+), ip=([^,]+), port=(\d+)")
CONNECTED = re.compile(r"the scheduler is connected to (\d+) workers and (\d+) servers")


def say(message: str, stream: Any = None) -> None:
    """One log line in one write (ps-lite's C++ threads share stderr)."""
    stream = stream or sys.stdout
    stream.write(message + "\n")
    stream.flush()


def _death_signal() -> Any:
    """A preexec_fn for a role's process: the kernel SIGKILLs it when the worker that started
    it dies (Linux prctl PR_SET_PDEATHSIG); libc is loaded here, in the worker."""
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
    """A host name as its IPv4 address (ZeroMQ binds no host names), else the name."""
    try:
        return socket.gethostbyname(name)
    except OSError:
        return name


def node_address() -> str:
    """The address this node's server and worker announce (DMLC_NODE_HOST): the user's, else
    the SLURM node name (or host name) resolved; "" when the user named DMLC_INTERFACE."""
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
        """This node's server or worker port; None (ps-lite picks one) past the job's ports."""
        if 1 + 2 * self.count > 10:  # MGBENCH_MASTER_PORT .. +9 are the job's (slurm_job.py)
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
    """What ps-lite's scheduler log (PS_VERBOSE=1) says: the id, host and port of each node it
    registered, and its count of connected workers and servers."""
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

    def kvstore(self, kind: str) -> Any:
        """Start this node's roles, set this process's DMLC settings, watch the roles; then this
        worker's kvstore of type `kind` (all nodes registered)."""
        import mxnet as mx

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
        self.kv = mx.kv.create(kind)
        if self.kv.num_workers != self.place.count:
            raise Invalid(f"the kvstore has {self.kv.num_workers} workers; the run has "
                          f"{self.place.count} nodes")
        return self.kv

    def _watch(self) -> None:
        """Kill the other roles and end this worker when a role exits before close()."""
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

    def allgather(self, obj: Any) -> list[Any]:
        """Every worker's JSON-able `obj`, in kv.rank order (its row of a zero array, summed by
        dist_sync). A collective: every worker calls it, in the same order."""
        import mxnet as mx
        import numpy as np

        kv, n, rank = self.kv, self.kv.num_workers, self.kv.rank
        data = np.frombuffer(json.dumps(obj, default=str).encode(), np.uint8)

        def exchange(row: np.ndarray) -> np.ndarray:
            # above the Trainer's keys, below MXNet's int overflow at 215,326
            key = (1 << 16) + self._gathers
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
        """End the ps-lite job: after a good run free the kvstore and wait for the roles; after a
        failure, or past STOP_WAIT_S, kill them. Restores this process's DMLC settings."""
        self._closing.set()
        try:
            if ok and self.kv is not None:
                for role in self.roles:
                    if role.proc.poll() is not None:
                        raise RuntimeError(f"the ps-lite {role.role} (pid {role.proc.pid}) "
                                           f"exited with {role.proc.returncode} before the run "
                                           "ended")
                from mxnet.base import _LIB, check_call

                t0, handle = time.time(), self.kv.handle
                self.kv.handle = None  # its __del__ then frees NULL: a no-op
                # in a thread: its barriers wait for every worker, and one that failed after
                # the last collective never comes (srun --kill-on-bad-exit ends this one too)
                ender = threading.Thread(target=lambda: check_call(_LIB.MXKVStoreFree(handle)),
                                         daemon=True)
                ender.start()
                ender.join(STOP_WAIT_S)
                for role in _waited(self.roles if not ender.is_alive() else [], STOP_WAIT_S):
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
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for role in alive:
                with contextlib.suppress(ProcessLookupError):
                    role.proc.send_signal(sig)
                role.ended = f"killed ({sig.name}) by the worker"
            alive = [r for r in _waited(alive, KILL_GRACE_S) if r.proc.poll() is None]
        for role in self.roles:
            if role.reader is not None and role.reader.is_alive():
                role.reader.join(timeout=5)
            say(f"[mxnet dist] node {self.place.rank}: {role.role} pid {role.proc.pid} "
                f"{role.ended}, exit status {role.proc.returncode}")

    def finish_record(self, multi_node: dict[str, Any]) -> None:
        """Add how this node's roles ended to a multi_node record, after close()."""
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
        """This worker's identity, kvstore view, DMLC settings and roles, for the gather."""
        return {**node_identity(), "kv_rank": self.kv.rank, "process_rank": self.place.rank,
                "kv_num_workers": self.kv.num_workers, "kv_type": self.kv.type,
                "dmlc": {k: os.environ[k] for k in DMLC_VARS if k in os.environ},
                "roles": [{"role": r.role, "pid": r.proc.pid, "address": r.record()["address"],
                           "running_at_gather": r.proc.poll() is None} for r in self.roles]}


def _waited(roles: list[Role], seconds: float) -> list[Role]:
    """The roles, once each has exited or `seconds` in all have passed."""
    deadline = time.time() + seconds
    for role in roles:
        with contextlib.suppress(subprocess.TimeoutExpired):
            role.proc.wait(max(0.1, deadline - time.time()))
    return roles


def _relay(proc: subprocess.Popen[bytes], log: list[str], role: str) -> None:
    """Keep a role's output lines and pass them on to this process's stderr."""
    assert proc.stdout is not None
    for raw in proc.stdout:
        line = raw.decode(errors="replace").rstrip()
        log.append(line)
        say(f"[ps-lite {role}] {line}", sys.stderr)


@contextlib.contextmanager
def session(num_nodes: int) -> Iterator[PsLite]:
    """This node's ps-lite roles for the block: started by kvstore(), ended on exit."""
    ps = PsLite(Place.from_env(num_nodes))
    ok = False
    try:
        yield ps
        ok = True
    finally:
        ps.close(ok)


# -- the worker's side of a run (runners/mxnet/native.py) ---------------------------------

def kvstore_type(spec: Spec) -> str:
    """dist_sync_device for kvstore device on GPUs, else dist_sync (no NCCL across nodes)."""
    kvstore = spec.options["kvstore"]
    if kvstore == "nccl":
        raise Unavailable("kvstore nccl: MXNet 1.9's NCCL kvstore is single-machine; across "
                          "nodes use device (dist_sync_device) or local (dist_sync)")
    return "dist_sync_device" if kvstore == "device" and spec.device == "gpu" else "dist_sync"


def across_nodes(spec: Spec, run: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """run(spec) on one node; on several run(spec, ps) in this node's ps-lite session."""
    if spec.num_nodes == 1:
        return run(spec)
    with session(spec.num_nodes) as ps:
        result = run(spec, ps)
    ps.finish_record(result["multi_node"])  # how the roles ended, known only now
    return result


def gather_workers(ps: PsLite, trainer: Any, local: dict[str, Any],
                   step_losses: list[float], labels: list[int]
                   ) -> tuple[dict[str, Any], list[float]]:
    """Every worker's identity, placement, parameter copies, devices and first labels gathered
    through the kvstore, keys "worker<kv.rank>:<context>"; and each step's global mean loss."""
    kv = trainer._kvstore
    rows = ps.allgather({"worker": ps.worker_record(), "placement": local["placement"],
                         "parameter_copies": local["parameter_copies"],
                         "devices": local["devices"], "step_losses": step_losses,
                         "labels": labels})
    if [r["worker"]["kv_rank"] for r in rows] != list(range(kv.num_workers)):
        raise Invalid(f"gathered kv ranks {[r['worker']['kv_rank'] for r in rows]} of "
                      f"{kv.num_workers} workers")

    def merged(key: str) -> dict[str, int]:
        return {f"worker{i}:{ctx}": count for i, r in enumerate(rows)
                for ctx, count in r[key].items()}

    losses = [sum(r["step_losses"][i] for r in rows) for i in range(len(step_losses))]
    workers = [{k: v for k, v in r["worker"].items() if k != "roles"} for r in rows]
    roles = [{"node": r["worker"]["node"], "started_by_kv_rank": r["worker"]["kv_rank"], **role}
             for r in rows for role in r["worker"]["roles"]]
    out: dict[str, Any] = {
        "placement": merged("placement"), "parameter_copies": merged("parameter_copies"),
        "placement_source": code("mxnet.dist_workers_placement"),
        "devices": [{**d, "name": f"worker{i}:{d['name']}", "node": r["worker"]["node"]}
                    for i, r in enumerate(rows) for d in r["devices"]],
        "nodes": [{k: w[k] for k in ("node", "host", "slurm_procid", "slurm_job_id", "pid",
                                     "kv_rank", "process_rank")} for w in workers],
        "multi_node": {
            "mechanism": code("mxnet.dist_sync_mechanism"),
            "kv_type": kv.type, "kv_num_workers": kv.num_workers, "kv_rank": kv.rank,
            "update_on_kvstore": trainer._update_on_kvstore,
            "kv_rank_is_node_rank": all(w["kv_rank"] == w["process_rank"] for w in workers),
            "dmlc": workers[kv.rank]["dmlc"],
            "workers": workers,
            "scheduler": next((r for r in roles if r["role"] == "scheduler"), None),
            "servers": [r for r in roles if r["role"] == "server"],
            "source": code("mxnet.dist_kvstore_source")}}
    if labels:
        out["first_batch_labels"] = [v for r in rows for v in r["labels"]]
    return out, [finite(v) for v in losses]


def run_role(argv: list[str]) -> None:
    """A role process: DMLC_ROLE is set, and importing MXNet runs the role, then exits."""
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
