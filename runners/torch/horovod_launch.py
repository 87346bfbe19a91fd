"""horovodrun's gloo launch across the nodes of a SLURM job, with srun in place of ssh.

Run once per node (bench/run/launch.py child_command):

  python -m runners.torch.horovod_launch -np N --slots-per-node K --nodes M --node-rank R
      --rendezvous ADDR:PORT  PYTHON -m runners.torch.horovod --spec S --result OUT

Horovod's own host plan, RendezvousServer (node 0) and gloo_run slot environment; differs: no
ssh or MPI, no rank-prefixed output. docs/runners/horovod.md."""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import time
from typing import Any

KILL_GRACE_S = 5.0
POLL_S = 0.25
TAG = "[horovod launch]"


def say(message: str) -> None:
    print(f"{TAG} {message}", flush=True)


def slurm_hosts() -> list[str]:
    """The job step's nodes as SLURM names them, in node-rank (SLURM_NODEID) order."""
    nodelist = os.environ.get("SLURM_STEP_NODELIST") or os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        raise SystemExit(f"{TAG} no SLURM_STEP_NODELIST or SLURM_JOB_NODELIST: run me in srun")
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return out.split()


def node_address(name: str) -> str:
    """A node's IPv4 address: its name resolved, else slurm.conf's NodeAddr for it."""
    with contextlib.suppress(OSError):
        return socket.gethostbyname(name)
    out = subprocess.run(["scontrol", "show", "node", "-o", name], capture_output=True,
                         text=True, timeout=60).stdout
    found = re.search(r"\bNodeAddr=(\S+)", out)
    return socket.gethostbyname(found.group(1) if found else name)


def interface_of(address: str) -> str:
    """The local network interface holding `address` (what HOROVOD_GLOO_IFACE names)."""
    import psutil  # Horovod's own dependency (horovod.runner.util.network uses it)

    for iface, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addrs):
            return iface
    raise SystemExit(f"{TAG} no interface of this host has the node's address {address}")


def start_rendezvous(port: int, plan: list[Any]) -> Any:
    """Horovod's RendezvousServer on `port` (all interfaces, as find_port binds it),
    initialised with the host assignment plan before it serves a request."""
    from horovod.runner.http.http_server import (
        RendezvousHandler,
        RendezvousHTTPServer,
        RendezvousServer,
    )
    from horovod.runner.util.threads import in_thread

    # RendezvousServer.start() binds a random free port (network.find_port); these are its
    # steps with the job's port, the plan set before the listening thread starts
    server = RendezvousServer(verbose=0)
    server._httpd = RendezvousHTTPServer(("", port), RendezvousHandler, 0)
    server.init(plan)
    server._listen_thread = in_thread(target=server._httpd.serve_forever)
    return server


def wait_for_rendezvous(addr: str, port: int, timeout_s: float) -> None:
    """Until the first node's rendezvous server answers (a GET of a key nobody has: 404)."""
    deadline = time.monotonic() + timeout_s
    while True:
        conn = http.client.HTTPConnection(addr, port, timeout=5)
        try:
            conn.request("GET", "/mgbench/probe")
            conn.getresponse().read()
            return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise SystemExit(f"{TAG} the rendezvous server at {addr}:{port} did not answer "
                                 f"within {timeout_s:g} s ({exc})") from None
            time.sleep(0.5)
        finally:
            conn.close()


class Stopped(Exception):
    """SIGTERM or SIGINT: srun ends the job's step (another node failed, the job ended)."""


def _stop(signum: int, _frame: object) -> None:
    raise Stopped(signal.Signals(signum).name)


def end_ranks(procs: dict[int, subprocess.Popen[bytes]]) -> None:
    """SIGTERM every rank still running, SIGKILL what is left after the grace."""
    running = [p for p in procs.values() if p.poll() is None]
    for p in running:
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + KILL_GRACE_S
    for p in running:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
    for p in running:
        if p.poll() is None:
            p.kill()
            p.wait()


def run_ranks(procs: dict[int, subprocess.Popen[bytes]]) -> int:
    """Wait for the node's ranks; on the first failure end the others (gloo_run's
    terminate_all_event); 0, or the first failing rank's exit status (a shell's)."""
    first: tuple[int, int] | None = None
    while [p.poll() for p in procs.values()].count(None):  # every rank polled each time
        for rank, p in procs.items():
            if first is None and p.returncode not in (None, 0):
                first = (rank, p.returncode)
                say(f"Process {rank} exit with status code {p.returncode}.")
                say(f"Terminating remaining workers after failure of Process {rank}.")
                end_ranks(procs)
        time.sleep(POLL_S)
    if first is None:
        first = next(((r, p.returncode) for r, p in procs.items() if p.returncode != 0), None)
        if first is None:
            return 0
        say(f"Process {first[0]} exit with status code {first[1]}.")
    return 128 - first[1] if first[1] < 0 else first[1]  # killed by signal s: 128 + s


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m runners.torch.horovod_launch",
                                description=__doc__.splitlines()[0])
    p.add_argument("-np", "--num-proc", type=int, required=True, help="ranks in all")
    p.add_argument("--slots-per-node", type=int, required=True, help="ranks per node")
    p.add_argument("--nodes", type=int, required=True, help="the job step's node count")
    p.add_argument("--node-rank", type=int, required=True, help="this node's SLURM_NODEID")
    p.add_argument("--rendezvous", required=True, help="ADDR:PORT of the first node's server")
    p.add_argument("command", nargs=argparse.REMAINDER, help="each rank's command")
    args = p.parse_args(argv)
    if not args.command:
        p.error("no command for the ranks")
    return args


def launch(args: argparse.Namespace, plan: list[Any], me: str, rendezvous: tuple[str, int],
           iface: str) -> tuple[int, list[int]]:
    """Node 0 serves the rendezvous (the others wait for it); this node's slots of `plan`
    started with gloo_run's environments and waited for. The exit status and the ranks."""
    from horovod.runner.gloo_run import create_run_env_vars, create_slot_env_vars

    server_ip, port = rendezvous
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    server = None
    procs: dict[int, subprocess.Popen[bytes]] = {}
    try:
        if args.node_rank == 0:
            server = start_rendezvous(port, plan)
            say(f"RendezvousServer listening on port {port}, initialised with "
                f"{len(plan)} slots")
        else:
            wait_for_rendezvous(server_ip, port,
                                float(os.environ.get("HOROVOD_START_TIMEOUT", "120")))
        run_env = {k: str(v) for k, v in
                   create_run_env_vars(server_ip, [iface], port).items()}
        for slot in (s for s in plan if s.hostname == me):
            env = {**os.environ, "PYTHONUNBUFFERED": "1", **run_env,
                   **create_slot_env_vars(slot)}
            procs[slot.rank] = subprocess.Popen(args.command, env=env)
        code = run_ranks(procs)
    except Stopped as exc:
        say(f"{exc}: ending this node's ranks")
        end_ranks(procs)
        code = 128 + signal.Signals[str(exc)].value
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if server is not None:
            server.stop()
            server._httpd.server_close()
    return code, sorted(procs)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from horovod.runner.common.util.hosts import HostInfo, get_host_assignments

    hosts = slurm_hosts()
    me = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    if len(hosts) != args.nodes or hosts[args.node_rank] != me:
        raise SystemExit(f"{TAG} node rank {args.node_rank} of {args.nodes} is {me}, but "
                         f"SLURM's node list is {hosts}")
    plan = get_host_assignments([HostInfo(h, args.slots_per_node) for h in hosts],
                                args.num_proc)
    mine = [s for s in plan if s.hostname == me]
    addr_name, port_text = args.rendezvous.rsplit(":", 1)
    port = int(port_text)
    server_ip = node_address(addr_name)
    iface = interface_of(node_address(me))
    say(f"node {args.node_rank}/{args.nodes} ({me}): hosts "
        f"{','.join(f'{h}:{args.slots_per_node}' for h in hosts)}, ranks "
        f"{[s.rank for s in mine]} of {args.num_proc}, rendezvous {server_ip}:{port}, "
        f"iface {iface}")
    code, ranks = launch(args, plan, me, (server_ip, port), iface)
    say(f"node {args.node_rank} ({me}): ranks {ranks} ended, exit status {code}")
    return code


if __name__ == "__main__":
    sys.exit(main())
