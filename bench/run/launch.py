"""Run one RunSpec as a child process and turn whatever happens into a record.

The child is `python -m <runner module> --spec <json> --result <json>` in its family's
interpreter, in a new session so that its whole process group can be killed on timeout or
Ctrl-C. The parent waits on the process (no busy loop), then reads the result file the
child wrote; logs are kept for people, never parsed for numbers.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench import REPO_ROOT
from bench.plan.runs import RunSpec, is_capacity_probe
from bench.records import columns
from bench.records.mfu import TRAINING_FLOPS_FACTOR, mfu, peak_fields
from bench.records.store import SCHEMA_VERSION, json_safe, record_path, runs_dir, write_json_atomic
from bench.run.environment import lock_for
from bench.run.guard import cannot_start, descendants, guarded
from bench.run.telemetry import Sampler, write_series
from bench.run.telemetry import summarise as summarise_telemetry
from bench.run.verdict import CHILD_FIELDS, _first_line, classify
from contract.launch_env import PER_RANK_LAUNCHERS, busy_cpus, math_env, thread_env
from models import spec_of

KILL_GRACE_S = 5.0
# what complete derives from the child's result for every record (None where it does not apply)
DERIVED_FIELDS = ("samples_per_sec", "tokens_per_sec", "tokens_per_sec_per_device",
                  "flops_per_token")


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def sizes_threads(spec: RunSpec) -> bool:
    """Whether the thread policy sizes this run's threads to the host's cores (a CPU run of
    MXNet or of a one-process-per-device launcher): only then is the host's load read."""
    return spec.device == "cpu" and (spec.family == "mxnet"
                                     or spec.launcher in PER_RANK_LAUNCHERS)


def child_env(spec: RunSpec) -> dict[str, str]:
    """The child's environment: the repo importable, and only the GPUs the run may use."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    # each framework's documented thread settings, never over the user's (runners/threads.py)
    # sized to the cores other processes leave free at launch (issue 41: a rank with 2
    # OpenMP threads on a host whose other core is busy ran 10x slower than with 1)
    env.update(thread_env(spec.family, spec.runner, spec.launcher, spec.device,
                          spec.devices_per_node, os.environ,
                          busy=busy_cpus() if sizes_threads(spec) else None))
    if spec.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
        if is_capacity_probe(spec):
            # glibc raises its mmap threshold after the first large free, so later tensors
            # come from the heap and stay resident when freed: the process's peak would
            # count the allocator's leftovers, not the tensors. A fixed threshold (glibc's
            # default, 128 KiB) returns every large tensor to the OS when freed.
            env.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")
    else:
        # CUDA numbers GPUs fastest first by default; NVML (the parent's telemetry) by PCI bus
        env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        visible = env.get("CUDA_VISIBLE_DEVICES")
        ids = [v for v in visible.split(",") if v] if visible else []
        ids = ids or [str(i) for i in range(spec.devices_per_node)]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(ids[: spec.devices_per_node])
    return math_env(spec.precision, spec.device, env)  # fp32 is IEEE, tf32 TF32 (math_mode)


def sampled_gpus(spec: RunSpec, env: dict[str, str]) -> list[int]:
    """The NVML indices of the GPUs the child may use (none for a CPU run)."""
    if spec.device != "gpu":
        return []
    ids = [v for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]
    return [int(v) for v in ids] if all(v.isdigit() for v in ids) else \
        list(range(spec.devices_per_node))


@dataclass(frozen=True)
class NodePlace:
    """This node's place in a multi-node run (bench/run/slurm_job.py reads it from SLURM): its
    rank among the run's nodes, their count, the first node's address and the port the job
    may use there (and the 9 after it), and the SLURM job."""

    rank: int
    count: int
    master_addr: str
    master_port: int
    job_id: str

    def env(self) -> dict[str, str]:
        """What a runner started once per node reads (runners.common.process_rank, the
        frameworks' own rendezvous settings in the runners)."""
        return {"MGBENCH_PROCESS_RANK": str(self.rank), "MGBENCH_NUM_NODES": str(self.count),
                "MGBENCH_MASTER_ADDR": self.master_addr,
                "MGBENCH_MASTER_PORT": str(self.master_port)}


def child_command(spec: RunSpec, python: str | Path, spec_path: Path, result_path: Path,
                  node: NodePlace | None = None) -> list[str]:
    """The command line that starts a run (on one node of a multi-node run: `node`): the
    runner module itself, or a launcher that starts one process (rank) per device running
    it. Rank 0 writes the result."""
    module = ["-m", spec.module, "--spec", str(spec_path), "--result", str(result_path)]
    if spec.launcher == "python":
        return [str(python), *module]
    # --tee: each rank's lines prefixed with its local rank, so a dead rank's last lines are
    # told apart (verdict.dead_rank); --log-dir: torchrun's per-rank copies beside the run's
    # log instead of a temporary folder of its own that nobody removes
    tee = ["--tee=3", f"--log-dir={result_path.parent / (spec.run_id + '.torchrun')}"]
    if spec.launcher == "torchrun" and node is not None:
        # torchrun's multi-node launch with a c10d rendezvous hosted by the first node's
        # torchrun (is_host: on a real cluster it is inferred from the host name; here every
        # node is one host, so it is said)
        return [str(python), "-m", "torch.distributed.run", f"--nnodes={node.count}",
                f"--nproc-per-node={spec.devices_per_node}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={node.master_addr}:{node.master_port}",
                f"--rdzv-id=mgbench-{node.job_id}",
                f"--rdzv-conf=is_host={int(node.rank == 0)}", *tee, *module]
    if spec.launcher == "torchrun":
        # --standalone: a local rendezvous on a free port, so sweeps never collide on one
        return [str(python), "-m", "torch.distributed.run", "--standalone", "--nnodes=1",
                f"--nproc-per-node={spec.num_devices}", *tee, *module]
    if spec.launcher == "horovodrun" and node is not None:
        # horovodrun's gloo launch with srun's task on each node in place of its ssh
        # (runners/torch/horovod_launch.py): the first node hosts Horovod's RendezvousServer
        # on the job's port + 1; every node starts its own devices_per_node ranks with the
        # environment horovodrun gives each slot
        return [str(python), "-m", "runners.torch.horovod_launch",
                "-np", str(spec.num_devices), "--slots-per-node", str(spec.devices_per_node),
                "--nodes", str(node.count), "--node-rank", str(node.rank),
                "--rendezvous", f"{node.master_addr}:{node.master_port + 1}",
                str(python), *module]
    if spec.launcher == "horovodrun":
        horovodrun = Path(python).parent / "horovodrun"
        return [str(horovodrun), "-np", str(spec.num_devices), "--gloo",
                "-H", f"localhost:{spec.num_devices}", str(python), *module]
    raise ValueError(f"unknown launcher {spec.launcher!r}")


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the child's process group, then SIGKILL whatever is left of it and of the
    guard's tree (descendants that left the group, re-parented to the guard); a second
    Ctrl-C meanwhile waits until the kill is done."""
    with signals_deferred():
        _signal_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=KILL_GRACE_S)
        if proc.poll() is None:  # the guard is alive: its tree holds what left the group
            for pid in descendants(proc.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        _signal_group(proc.pid, signal.SIGKILL)  # also what the leader started and left behind
        proc.wait()


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP held while a run is killed (so the kill is never cut off
    half-way, leaving the group alive); one that came is delivered again afterwards."""
    came: list[int] = []
    try:
        old = {s: signal.signal(s, lambda signum, _f: came.append(signum))
               for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    except ValueError:  # not the main thread: signals are not ours to hold
        yield
        return
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if came and not isinstance(sys.exc_info()[1], KeyboardInterrupt):  # else it is one
            os.kill(os.getpid(), came[0])


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def base_record(spec: RunSpec, environment: dict[str, Any], log_path: Path) -> dict[str, Any]:
    """The record's fields known before the child runs."""
    rec: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        **{k: getattr(spec, k) for k in columns.keys("spec")},
        "data_label": spec.data_label,
        "variant": spec.variant,  # the options of an option axis (bench.records.grouping)
        "status": None, "reason": None, "log_path": str(log_path),
        "environment": {**environment,
                        "lock": lock_for(spec.family, spec.device, spec.python)},
        "started_at": now_iso(), "finished_at": None,
        "returncode": None, "wall_time_s": None,
    }
    rec.update({k: None for k in CHILD_FIELDS})
    rec.update({k: None for k in DERIVED_FIELDS})
    rec["placement"] = None
    rec["state_check"] = None  # bench/run/verdict.validate_state fills it
    return rec


def finish(rec: dict[str, Any], results_dir: Path, status: str, reason: str | None) -> dict:
    rec["status"], rec["reason"] = status, reason
    rec["finished_at"] = now_iso()
    rec = json_safe(rec)
    write_json_atomic(record_path(results_dir, rec["run_id"]), rec)
    return rec


def record_without_run(spec: RunSpec, results_dir: Path, environment: dict[str, Any],
                       status: str, reason: str) -> dict[str, Any]:
    """A record for a run that never started (unavailable environment, invalid combination)."""
    rec = base_record(spec, environment, runs_dir(results_dir) / f"{spec.run_id}.log")
    rec["log_path"] = None
    return finish(rec, results_dir, status, reason)


@dataclass
class Watched:
    """What supervising one command saw: how it ended (exit status, timeout, a stop from
    outside, could not start), how long it ran, what it left running, and the telemetry
    samples of its whole life (cut to the timed window by `complete`)."""

    returncode: int | None = None
    timed_out: bool = False
    stopped: str | None = None  # the exception named in stop_on that ended the wait
    cannot_start: str | None = None
    left_running: str | None = None
    wall_time_s: float | None = None
    sampler: Sampler | None = None
    samples: list[dict[str, Any]] | None = None
    telemetry_note: str | None = None


def watch(spec: RunSpec, python: str | Path, cmd: list[str], env: dict[str, str],
          log_path: Path, stop_on: tuple[type[BaseException], ...] = ()) -> Watched:
    """Run cmd through bench.run.guard in a new session (its process group dies with this
    process, a kill -9 of the harness included), its output to log_path; sample its
    telemetry when the spec asks; kill its group at timeout_s. An exception in stop_on (the
    SLURM node's SIGTERM) kills the group and is recorded; any other (Ctrl-C) kills it and
    propagates. The one supervisor of the local launcher and of each SLURM node."""
    seen = Watched()
    t0 = time.monotonic()
    proc = None
    with open(log_path, "wb") as log:
        log.write(f"$ {' '.join(cmd)}\n".encode())
        log.flush()
        reason = cannot_start(cmd[0])
        if reason:
            seen.cannot_start = f"cannot start interpreter {python}: {reason}"
            return seen
        report_r, report_w = os.pipe()  # the guard says what it found left running
        try:
            try:
                guarded_cmd, watch_fd = guarded(cmd, report_w)
                proc = subprocess.Popen(guarded_cmd, cwd=REPO_ROOT, env=env, stdout=log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True, pass_fds=(watch_fd, report_w))
            except OSError as exc:
                seen.cannot_start = f"cannot start interpreter {python}: {exc.strerror}"
                os.close(report_r)
                return seen
            finally:
                os.close(report_w)
            if spec.telemetry:
                _start_sampler(seen, spec, proc.pid, env)
            try:
                proc.wait(timeout=spec.timeout_s)
            except subprocess.TimeoutExpired:
                seen.timed_out = True
                _kill_group(proc)
        except stop_on as exc:
            seen.stopped = str(exc)
            if proc is not None:
                _kill_group(proc)
        except BaseException:  # Ctrl-C or anything else: no orphans, no half record
            if proc is not None:
                _kill_group(proc)
            if seen.sampler:
                seen.sampler.stop()
            os.close(report_r)
            raise
    seen.samples = seen.sampler.stop() if seen.sampler else None
    seen.wall_time_s = round(time.monotonic() - t0, 3)
    left = _guard_report(report_r)
    if proc is not None:
        seen.returncode = proc.returncode
        _end_left_running(seen, proc.pid, left)
    return seen


def _start_sampler(seen: Watched, spec: RunSpec, pid: int, env: dict[str, str]) -> None:
    """Start the telemetry sampler of process pid into seen (a failure is a note: telemetry
    is evidence, never a reason to lose a run)."""
    try:
        seen.sampler = Sampler(pid, sampled_gpus(spec, env),
                               spec.telemetry["interval_s"]).start()
    except Exception as exc:
        seen.telemetry_note = f"sampler did not start: {_first_line(str(exc))}"


def _end_left_running(seen: Watched, pid: int, left: dict[str, Any]) -> None:
    """Say in seen what the run left running (the guard's report `left`, workers or ranks,
    or anything still in its process group), and kill what is still in the group."""
    if left.get("left"):
        detached = left.get("detached") or 0
        seen.left_running = (f"{left['left']} processes of the run outlived it"
                             + (f" ({detached} had left its process group)" if detached
                                else "") + "; killed")
    if _group_alive(pid):
        seen.left_running = seen.left_running or \
            "processes of the run's group outlived it; killed"
        _signal_group(pid, signal.SIGKILL)


def _guard_report(fd: int) -> dict[str, Any]:
    """What the guard wrote into its report pipe (bench/run/guard.end_left_running), read once
    it has exited; {} when it wrote nothing (killed, or never started). Closes fd."""
    try:
        os.set_blocking(fd, False)
        data = os.read(fd, 4096)
        found = json.loads(data) if data else {}
        return found if isinstance(found, dict) else {}
    except (OSError, ValueError):
        return {}
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)


def window_telemetry(rec: dict[str, Any], spec: RunSpec, seen: Watched, path: Path) -> None:
    """The sampled telemetry cut to the timed window rec holds (the series to path, the
    summary and the contention flag to rec), or why there is none."""
    if seen.sampler and seen.samples is not None:
        add_telemetry(rec, spec, seen.sampler, seen.samples, path)
    elif seen.telemetry_note:
        rec["telemetry"] = {"note": seen.telemetry_note}


def complete(rec: dict[str, Any], spec: RunSpec, status: str, reason: str | None,
             results_dir: Path, peak: dict[str, Any] | None) -> dict[str, Any]:
    """The last step of every record, local or SLURM: the metrics derived from the run's
    result (samples and tokens per second, FLOPs per token, MFU against the measured peak,
    when given), then the record written."""
    derive_throughput(rec, spec, status)
    if peak is not None and status == "ok" and spec.mode == "benchmark":
        rec["mfu"] = run_mfu(spec, rec["images_per_sec"], peak, rec)
    return finish(rec, results_dir, status, reason)


def model_tokens(spec: RunSpec) -> int | None:
    """Tokens one sample of the run's model trains on (None for images or an unknown model)."""
    try:
        return spec_of(spec).tokens_per_sample
    except Exception:  # an unknown or malformed model: the child's record says why
        return None


def forward_flops(spec: RunSpec, rec: dict[str, Any] | None = None) -> tuple[int | None, str]:
    """The forward FLOPs per sample MFU and FLOPs per token use, and where they come from: a
    built-in model's spec (the standard count), else the run's own count (a user's model:
    the child counted it with its framework, `flops_per_sample` of its result)."""
    if not getattr(spec, "custom_model", None):
        try:
            model = spec_of(spec)  # a depth variant's (model_layers) count
            return model.flops_per_sample, f"models/{spec.model}/spec.py: {model.flops_source}"
        except KeyError:
            pass
    result = (rec or {}).get("result") or {}
    counted = result.get("flops_per_sample")
    if isinstance(counted, (int, float)) and not isinstance(counted, bool) and counted > 0:
        return counted, f"counted in the run: {result.get('flops_source') or 'the runner'}"
    return None, "no forward FLOPs: not a built-in model and the run counted none"


def derive_throughput(rec: dict[str, Any], spec: RunSpec, status: str) -> None:
    """samples/sec (images/sec: samples of any kind), and for a token model its tokens per
    sample, tokens/sec (over all devices and per device) and training FLOPs per token
    (3 x the forward FLOPs per sample over its tokens)."""
    ips = rec.get("images_per_sec") if status == "ok" and spec.mode == "benchmark" else None
    tokens = rec.get("tokens_per_sample") or model_tokens(spec)
    rec["tokens_per_sample"] = tokens
    rec["samples_per_sec"] = ips
    rec["tokens_per_sec"] = ips * tokens if ips is not None and tokens else None
    rec["tokens_per_sec_per_device"] = (rec["tokens_per_sec"] / spec.num_devices
                                        if rec["tokens_per_sec"] is not None else None)
    forward, _ = forward_flops(spec, rec) if tokens else (None, "")
    rec["flops_per_token"] = TRAINING_FLOPS_FACTOR * forward / tokens if forward else None


def launch(spec: RunSpec, python: str | Path, results_dir: Path,
           environment: dict[str, Any], peak: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run spec in a child process; write and return its record (with its MFU against peak,
    the device's measured matmul peak, when given). Ctrl-C kills the child."""
    rdir = runs_dir(results_dir)
    rdir.mkdir(parents=True, exist_ok=True)
    spec_path = rdir / f"{spec.run_id}.spec.json"
    # this attempt's own result file: a straggler of an earlier attempt (an orphan of a killed
    # sweep, say) writes to its own and can never be read as this one's
    attempt = secrets.token_hex(4)
    result_path = rdir / f"{spec.run_id}.{attempt}.result.json"
    log_path = rdir / f"{spec.run_id}.log"
    write_json_atomic(spec_path, spec.to_dict())
    result_path.unlink(missing_ok=True)
    rec = base_record(spec, environment, log_path)
    rec["python"] = str(python)
    rec["attempt"] = attempt
    seen = watch(spec, python, child_command(spec, python, spec_path, result_path),
                 child_env(spec), log_path)
    if seen.cannot_start:
        return finish(rec, results_dir, "unavailable", seen.cannot_start)
    if seen.left_running:
        rec["left_running"] = seen.left_running
    rec["returncode"] = seen.returncode
    rec["wall_time_s"] = seen.wall_time_s
    if seen.timed_out:
        status, reason = "timeout", f"exceeded timeout_s={spec.timeout_s:g}; process group killed"
    else:
        status, reason = classify(seen.returncode or 0, result_path, log_path, rec, spec)
    window_telemetry(rec, spec, seen, rdir / f"{spec.run_id}.telemetry.csv")
    return complete(rec, spec, status, reason, results_dir, peak)


def run_mfu(spec: RunSpec, images_per_sec: float, peak: dict[str, Any],
            rec: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run's model FLOPs utilisation against the machine's best measured peak (peak), and
    against its own environment's probe (peak["own"]), with what each was; the forward FLOPs
    a built-in model's spec's, a user's model's as the run counted them (rec's result),
    named in flops_source."""
    forward, flops_source = forward_flops(spec, rec)
    def flops(p: dict[str, Any]) -> float | None:
        return p.get("peak_flops") if p.get("status") == "ok" else None

    own = peak.get("own") or peak
    out = mfu(images_per_sec, forward, flops(peak), spec.num_devices,
              shared_device=spec.virtual_devices)
    # against the run's own framework's matmul: how close its kernels get to their own best
    out["mfu_own_peak"] = mfu(images_per_sec, forward, flops(own), spec.num_devices,
                              shared_device=spec.virtual_devices)["mfu"]
    out["peak"], out["own_peak"] = peak_fields(peak), peak_fields(own)
    out["flops_source"] = flops_source
    return out


def add_telemetry(rec: dict[str, Any], spec: RunSpec, sampler: Sampler,
                  samples: list[dict[str, Any]], path: Path) -> None:
    """Cut the samples to the child's timed window: the series to path, a summary to rec."""
    assert spec.telemetry is not None
    start, end = rec.get("window_start"), rec.get("window_end")
    write_series(path, samples, start, end)
    rec["telemetry"] = summarise_telemetry(
        samples, start, end, rec.get("samples"),
        starved_below_pct=spec.telemetry["starved_below_pct"], sampling=sampler.sampling())
    rec["contended"] = rec["telemetry"]["contention"]["contended"]
    rec["telemetry"]["path"] = f"{path.parent.name}/{path.name}"  # within the results folder
