"""A finished child's verdict: its status and one-line reason from its exit, its result file
and its log (classify), and the checks an 'ok' result must pass (the placement the framework
reported, the samples counted, a finite loss, a non-empty timed window, an all-reduce probe's
rows). Shared by the local launcher and the SLURM job's record (bench/run/launch.py)."""

from __future__ import annotations

import json
import math
import os
import re
import signal
from pathlib import Path
from typing import Any

from bench.catalog.registry import RUNNERS
from bench.plan.runs import RunSpec
from bench.records import columns
from bench.records.placement_check import check_placement
from bench.records.state_check import check_state_split
from contract.catalog import expected_shards
from contract.collectives import bus_factor, check_collectives, gradient_bytes, probe_sizes
from contract.launch_env import side_file

OOM_PATTERNS = re.compile(
    r"ResourceExhaustedError|OOM when allocating|out of memory|MemoryError|"
    r"CUDA_ERROR_OUT_OF_MEMORY|std::bad_alloc",
    re.IGNORECASE,
)
ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b.*", re.MULTILINE)
MISSING_MODULE = re.compile(r"ModuleNotFoundError: No module named '[\w.]+'")
# What a rank other than 0 says when it fails (runners/common.main); rank 0 writes the result.
RANK_FAILURE = re.compile(r"^\[runner rank (\d+)\] status=(\w+) reason=(.*)$", re.MULTILINE)
# torchrun's summary of the first rank that failed (torch.distributed.elastic's ChildFailedError)
ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+) "
                        r"\(local_rank: (\d+)\).*?exitcode\s*:\s*(-?\d+)", re.DOTALL)
# torchrun --tee's prefix of each line a rank writes: "[default<local rank>]:"
TEE_PREFIX = re.compile(r"^\[default(\d+)\]:", re.MULTILINE)
LAST_LINES = 3
CHILD_FIELDS = columns.keys("child")  # the child's result fields copied to the top level



def classify(returncode: int, result_path: Path, log_path: Path, rec: dict[str, Any],
             spec: RunSpec) -> tuple[str, str | None]:
    """Decide a finished child's status and one-line reason; copy its result into rec."""
    result: dict[str, Any] | None = None
    if result_path.exists():
        try:
            result = json.loads(result_path.read_text())
            if not isinstance(result, dict):
                raise ValueError(f"top level is {type(result).__name__}, not an object")
        except (ValueError, OSError) as exc:
            return "failed", f"child wrote an unreadable result ({_first_line(str(exc))})"
    raw_tail = read_tail(log_path) or ""
    log_tail = TEE_PREFIX.sub("", raw_tail)
    if result is None:
        if returncode == 0:
            return "failed", "child exited 0 without writing a result"
        if returncode == -signal.SIGKILL:
            return "oom", "killed by SIGKILL (most likely the kernel's out-of-memory killer)"
        if OOM_PATTERNS.search(log_tail):
            return "oom", _reason_from_log(log_tail, OOM_PATTERNS)
        missing = MISSING_MODULE.search(log_tail)
        if missing:
            return "unavailable", f"{missing.group(0)} in the interpreter {rec['python']}"
        rank = RANK_FAILURE.search(log_tail)
        if rank and rank.group(2) != "ok":
            return "failed", _first_line(f"rank {rank.group(1)}: {rank.group(3)}")
        if dead := dead_rank(raw_tail):
            return dead
        return "failed", f"exit {returncode}: {_reason_from_log(log_tail, ERROR_LINE)}"
    for key in CHILD_FIELDS:
        rec[key] = result.get(key)
    rec["result"] = {k: v for k, v in result.items() if k not in CHILD_FIELDS}
    rec["placement"] = result.get("placement")
    rec["environment"]["framework"] = result.get("framework")
    rec["environment"]["devices"] = result.get("devices")
    merge_memory(rec, result_path, spec)
    status = result.get("status", "ok")
    if status != "ok":
        reason = result.get("reason") or _reason_from_log(log_tail, ERROR_LINE)
        return status, _first_line(reason)
    if returncode != 0:
        return "failed", f"exit {returncode} after reporting success: " \
                         f"{_reason_from_log(log_tail, ERROR_LINE)}"
    problems = validate_result(result, spec, rec)
    return ("invalid", "; ".join(problems)) if problems else ("ok", None)


def process_count(spec: RunSpec) -> int:
    """The processes that run the runner: one per device under torchrun and horovodrun, one
    per node otherwise."""
    return spec.num_devices if spec.launcher in ("torchrun", "horovodrun") else spec.num_nodes


def merge_memory(rec: dict[str, Any], result_path: Path, spec: RunSpec) -> None:
    """Merge the memory of the ranks other than 0 (each wrote its own beside the result:
    contract.launch_env.side_file) into rec's memory_per_device, rank 0's from its result; a rank
    whose file is missing or unreadable is said so in memory_source, never guessed; their
    device_peak_bytes and memory_baseline likewise. The side files are removed once read (the
    record holds them)."""
    ranks = process_count(spec)
    if ranks < 2:
        return
    merged = dict(rec.get("memory_per_device") or {})
    # the device peaks capacity mode reads, and the CPU baselines under them, by the same keys
    extra = {key: dict(rec.get(key) or {}) for key in ("device_peak_bytes", "memory_baseline")}
    sources = [rec.get("memory_source")] if rec.get("memory_source") else []
    missing = []
    for rank in range(1, ranks):
        path = side_file(result_path, rank)
        try:
            part = json.loads(path.read_text())
        except FileNotFoundError:
            missing.append(f"{rank} (no {path.name})")
            continue
        except (OSError, ValueError) as exc:
            missing.append(f"{rank} ({path.name} unreadable: {_first_line(str(exc))})")
            continue
        finally:
            path.unlink(missing_ok=True)
        part = part if isinstance(part, dict) else {}
        if not isinstance(part.get("memory_per_device"), dict):
            missing.append(f"{rank} (it measured nothing: {part.get('memory_source')})")
            continue
        merged.update(part["memory_per_device"])
        for key, values in extra.items():
            if isinstance(part.get(key), dict):
                values.update(part[key])
        if part.get("memory_source") and part["memory_source"] not in sources:
            sources.append(part["memory_source"])
    if missing:
        sources.append(f"no memory from rank {', '.join(missing)} of {ranks}: its devices are "
                       "not in memory_per_device")
    rec["memory_per_device"] = merged or None
    for key, values in extra.items():
        rec[key] = values or None
    rec["memory_source"] = "; ".join(sources) or None


def validate_placement(result: dict[str, Any], num_devices: int,
                       rec: dict[str, Any] | None = None) -> list[str]:
    """What is wrong with a training result's `placement` (bench/records/placement_check.py): N
    distinct devices, as the framework names them, normalised; and each device's share of
    the work where the runner reports what it expects. The check's view goes into `rec`."""
    shown, problems = check_placement(result, num_devices)
    if rec is not None and shown:
        rec["placement_check"] = shown
    return problems


def validate_result(result: dict[str, Any], spec: RunSpec,
                    rec: dict[str, Any] | None = None) -> list[str]:
    """What is wrong with an 'ok' benchmark, equivalence, pipeline or all-reduce result (empty
    when nothing is); the placement check's view goes into `rec` when given."""
    if spec.mode == "equivalence":
        return validate_placement(result, spec.num_devices, rec)
    if spec.mode == "allreduce":
        return validate_allreduce(result, spec)
    if spec.mode == "converge":
        return validate_placement(result, spec.num_devices, rec) + validate_converge(result)
    if spec.mode not in ("benchmark", "pipeline"):
        return []
    problems = (validate_placement(result, spec.num_devices, rec)
                if spec.mode == "benchmark" else [])
    if spec.mode == "benchmark":
        problems += validate_state(result, spec, rec)
    expected = spec.measure_steps * spec.global_batch_size
    if result.get("samples") != expected:
        problems.append(f"samples {result.get('samples')!r} != measure_steps x global batch "
                        f"= {expected}")
    for key in ("first_loss", "last_loss") if spec.mode == "benchmark" else ():
        v = result.get(key)
        if not isinstance(v, (int, float)) or not math.isfinite(v):
            problems.append(f"{key} is {v!r}, not a finite number")
    ips = result.get("images_per_sec")
    if not isinstance(ips, (int, float)) or not math.isfinite(ips) or ips <= 0:
        problems.append(f"images_per_sec is {ips!r}")
    start, end = result.get("window_start"), result.get("window_end")
    if not (isinstance(start, (int, float)) and isinstance(end, (int, float)) and end > start):
        problems.append(f"timed window [{start!r}, {end!r}] is empty or missing")
    return problems


def validate_converge(result: dict[str, Any]) -> list[str]:
    """What is wrong with an ok converge result (runners/converge.py): a curve of epochs 1..k
    whose accuracies are fractions, final and best accuracy read from it, the target's epoch
    and time from its point, finite BatchNorm moving statistics, a positive images/sec."""
    curve = result.get("curve")
    if not isinstance(curve, list) or not curve or not all(isinstance(p, dict) for p in curve):
        return [f"no curve of epochs (curve={curve!r})"]
    problems = []
    accs = [p.get("accuracy") for p in curve]
    if [p.get("epoch") for p in curve] != list(range(1, len(curve) + 1)):
        problems.append("the curve's epochs are not 1, 2, ...")
    if not all(_fraction(a) for a in accs):
        problems.append(f"held-out accuracies {accs!r} are not all numbers in [0, 1]")
        return problems
    if result.get("final_accuracy") != accs[-1] or result.get("best_accuracy") != max(accs):
        problems.append(f"final/best accuracy {result.get('final_accuracy')!r}/"
                        f"{result.get('best_accuracy')!r} are not the curve's "
                        f"{accs[-1]!r}/{max(accs)!r}")
    epoch = result.get("epochs_to_target")
    if epoch is not None:
        point = curve[epoch - 1] if isinstance(epoch, int) and 0 < epoch <= len(curve) else None
        target = (result.get("converge") or {}).get("target_accuracy")
        if point is None or target is None or point["accuracy"] < target \
                or result.get("time_to_target_s") != point.get("wall_s"):
            problems.append(f"epochs_to_target {epoch!r} / time_to_target_s "
                            f"{result.get('time_to_target_s')!r} are not the curve's first "
                            f"point at the target {target!r}")
    elif result.get("time_to_target_s") is not None or not result.get("target_reason"):
        problems.append("a run that did not reach its target must say why (target_reason) "
                        "and have no time_to_target_s")
    if result.get("moving_stats_finite") is False:
        problems.append("BatchNorm moving statistics are not finite")
    if not _positive(result.get("images_per_sec")):
        problems.append(f"images_per_sec is {result.get('images_per_sec')!r}")
    return problems


def _fraction(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and 0 <= value <= 1


def validate_state(result: dict[str, Any], spec: RunSpec,
                   rec: dict[str, Any] | None = None) -> list[str]:
    """What is wrong with the model state's split over the devices (bench/records/
    state_check.py), against what the runner's strategy shards with the run's options; the
    check's view goes into `rec` (state_check)."""
    info = RUNNERS.get(spec.runner)
    shards = expected_shards(info, spec.options) if info is not None else ()
    view, problems = check_state_split(result, shards, spec.num_devices)
    if rec is not None and view is not None:
        rec["state_check"] = view
    return problems


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) and value > 0


def validate_allreduce(result: dict[str, Any], spec: RunSpec) -> list[str]:
    """What is wrong with an ok all-reduce probe result (contract/collectives.py says what it
    holds): a row for every size of the model's probe_sizes, each checked correct, with a
    positive time and nccl-tests' algbw and busbw for the run's device count; the figure at
    the gradient size; and the framework's own word that the collective spanned
    spec.num_devices replicas on as many distinct devices. Images/sec and MFU do not apply."""
    probe = result.get("allreduce")
    if not isinstance(probe, dict):
        return [f"no allreduce section in the result ({type(probe).__name__})"]
    n, problems = spec.num_devices, []
    evidence = probe.get("evidence")
    if not isinstance(evidence, dict):
        return [f"no evidence read back from the framework (evidence={evidence!r})"]
    replicas = evidence.get("replicas")
    if isinstance(replicas, bool) or replicas != n:
        problems.append(f"the framework says the all-reduce spanned {replicas!r} replicas, "
                        f"not the run's {n} ({evidence.get('source') or 'no source given'})")
    devices = evidence.get("devices")
    if not isinstance(devices, list) or len({str(d) for d in devices}) != n \
            or len(devices) != n:
        problems.append(f"evidence devices {devices!r} are not {n} distinct devices")
    rows = probe.get("sizes")
    if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
        return [*problems, f"no measured sizes (sizes={rows!r})"]
    want = probe_sizes(spec.model)
    got = [r.get("bytes") for r in rows]
    if got != want:
        problems.append(f"sizes {got} are not the probe's sizes for {spec.model}: {want}")
    for row in rows:
        size = row.get("bytes")
        if row.get("correct") is not True:
            problems.append(f"the all-reduce of {size!r} bytes gave a wrong sum "
                            f"(correct={row.get('correct')!r})")
        t, alg, bus = row.get("time_s"), row.get("algbw_gbps"), row.get("busbw_gbps")
        if not all(_positive(v) for v in (t, alg, bus)) or not _positive(size):
            problems.append(f"size {size!r}: time {t!r} s, algbw {alg!r}, busbw {bus!r} GB/s "
                            "are not all positive finite numbers")
            continue
        want_alg = size / t / 1e9
        if not (math.isclose(alg, want_alg, rel_tol=1e-6)
                and math.isclose(bus, want_alg * bus_factor(n), rel_tol=1e-6)):
            problems.append(f"size {size}: algbw {alg:.6g} and busbw {bus:.6g} GB/s are not "
                            f"nccl-tests' for {size} bytes in {t:.6g} s over {n} devices "
                            f"({want_alg:.6g}, {want_alg * bus_factor(n):.6g})")
    top = next((r for r in rows if r.get("bytes") == gradient_bytes(spec.model)), None)
    if top is None or not _positive(probe.get("busbw_gbps")) \
            or probe.get("busbw_gbps") != top.get("busbw_gbps"):
        problems.append(f"busbw_gbps {probe.get('busbw_gbps')!r} is not the row at the "
                        f"gradient size ({gradient_bytes(spec.model)} bytes)")
    problems += check_collectives(result, spec.num_devices, spec.model)
    return problems


def dead_rank(log_tail: str) -> tuple[str, str] | None:
    """(status, reason) of the rank torchrun names as the root cause of a failed run: which
    rank, its exit code or signal, and its last lines (told apart by --tee's prefixes); None
    without torchrun's summary. A rank killed by SIGKILL is `oom`, as a killed child is."""
    cause = ROOT_CAUSE.search(log_tail)
    if cause is None:
        return None
    rank, local, code = cause.group(1), int(cause.group(2)), int(cause.group(3))
    status, how = "failed", f"exited with code {code}"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        how = f"was killed by {name}"
        if -code == signal.SIGKILL:
            status, how = "oom", f"{how} (most likely the kernel's out-of-memory killer)"
    own = [line[m.end():].strip() for line in log_tail[:cause.start()].splitlines()
           if (m := TEE_PREFIX.match(line)) and int(m.group(1)) == local and line[m.end():].strip()]
    said = " | ".join(own[-LAST_LINES:]) if own else "no output of its own"
    return status, _first_line(f"rank {rank} (local rank {local}) {how}; its last lines: {said}",
                               limit=600)


def read_tail(path: Path, size: int = 16384) -> str | None:
    """The last `size` bytes of a log as text (undecodable bytes replaced); None where it is
    no regular file (never open a FIFO or a device) or cannot be read."""
    try:
        if not path.is_file():
            return None
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - size))
            return fh.read().decode(errors="replace")
    except OSError:
        return None


def _reason_from_log(text: str, pattern: re.Pattern[str]) -> str:
    """The last line of the log that matches pattern, else its last non-empty line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if pattern.search(line):
            return _first_line(line)
    return _first_line(lines[-1]) if lines else "no output"


def _first_line(text: str, limit: int = 300) -> str:
    line = (text.strip().splitlines() or [""])[0]
    return line if len(line) <= limit else line[: limit - 3] + "..."
