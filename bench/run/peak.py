"""A device's measured peak FLOP/s at a precision: the matmul probe (runners/peak_probe.py) run
in a family's environment once per interpreter, device type and precision, then cached.

The cache lives next to the environments (`<env_root>/../peaks`); its key includes the probe's
source and the CPU's vector extensions, so a changed probe or another CPU generation measures
again. Failures, disagreeing trials, a probe that shared the CPU and a peak implausibly below
the machine's best are never cached (docs/RESULTS.md, "A peak that is a peak").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bench import REPO_ROOT
from bench.plan.runs import RunSpec
from bench.records.mfu import AGREE, implausibly_low, spread
from bench.records.store import write_json_atomic
from bench.run.envs import env_root, python_for
from bench.run.guard import cannot_start, run_guarded
from bench.run.telemetry import CONTENDED_CPU_SHARE
from contract.launch_env import POLICY_VAR, math_env, thread_env

FAMILY_FRAMEWORK = {"tf": "tf", "mxnet": "mxnet", "torch": "torch", "jax": "jax",
                    "horovod": "torch"}  # horovod's environment has torch
PROBE = REPO_ROOT / "runners" / "peak_probe.py"
SECONDS_VAR, DEFAULT_SECONDS = "MGBENCH_PEAK_SECONDS", 3.0  # the probe's trials, at least


def probe_seconds() -> float:
    """How long the probe times its trials: $MGBENCH_PEAK_SECONDS (0.1 to 60; the test suite
    sets 0.5: its probes share the CPUs and are never kept) or DEFAULT_SECONDS."""
    try:
        value = float(os.environ.get(SECONDS_VAR, DEFAULT_SECONDS))
    except ValueError:
        return DEFAULT_SECONDS
    return value if 0.1 <= value <= 60 else DEFAULT_SECONDS


def default_cache_dir() -> Path:
    """Where peaks are cached: beside the environments they were measured in."""
    return env_root().parent / "peaks"


def device_type(device: str, environment: dict[str, Any]) -> str:
    """The kind of device a peak belongs to: the first GPU's name, or the host's CPU (model,
    cores and vector extensions: one model name covers CPUs with and without AVX-512)."""
    if device == "gpu":
        gpus = environment.get("gpus") or []
        return gpus[0]["name"] if gpus else "gpu: unknown"
    isa = environment.get("cpu_isa")
    return (f"cpu: {environment.get('cpu_model', 'unknown')} x{environment.get('cpu_cores')}"
            + (f" ({isa})" if isa else ""))


def cache_key(python: str | Path, device_type: str, precision: str, framework: str,
              threads: str = "", seconds: float = DEFAULT_SECONDS) -> str:
    """A short hash naming one peak: interpreter, device type, precision, framework, probe,
    the thread settings the policy gave it (runners/threads.py) and the probe's seconds where
    not the default (a shorter probe's peak never stands for a full one)."""
    # resolve the folder, not the file: a venv's bin/python links to the base interpreter,
    # which every environment shares
    path = Path(python).expanduser()
    path = path.parent.resolve() / path.name
    probe = hashlib.sha256(PROBE.read_bytes()).hexdigest()
    text = json.dumps([str(path), device_type, precision, framework, probe]
                      + ([threads] if threads else [])
                      + ([seconds] if seconds != DEFAULT_SECONDS else []))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def measure_peak(family: str, python: str | Path, device: str, precision: str,
                 environment: dict[str, Any], *, cache_dir: Path | None = None,
                 timeout_s: float = 300, seconds: float | None = None) -> dict[str, Any]:
    """The peak record for a family's interpreter on a device at a precision (cached), its
    trials timed for `seconds` (default probe_seconds())."""
    framework = FAMILY_FRAMEWORK[family]
    seconds = probe_seconds() if seconds is None else seconds
    dtype = device_type(device, environment)
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    env = _child_env(device, family, precision)
    threads = env.get(POLICY_VAR, "")
    key = cache_key(python, dtype, precision, framework, threads, seconds)
    cache_path = cache_dir / f"peak-{key}.json"
    meta = {"family": family, "device": device, "device_type": dtype, "precision": precision,
            "python": str(python), "thread_policy": threads or None, "probe_seconds": seconds}
    with contextlib.suppress(OSError, ValueError):  # a keeper, and still no implausible one
        cached = json.loads(cache_path.read_text())
        if cached.get("status") == "ok" and not_cacheable(cached) is None and implausibly_low(
                cached, machine_peak(dtype, precision, cache_dir)) is None:
            return {**cached, "family": family, "cached": True, "cache_path": str(cache_path)}
    result = _run_probe(framework, python, env, device, precision, cache_dir, timeout_s,
                        seconds)
    rec = {**result, **meta,
           "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
           "cached": False, "cache_path": None}
    rec["implausible"] = implausibly_low(rec, machine_peak(dtype, precision, cache_dir, (rec,)))
    rec["not_cached"] = not_cacheable(result) or rec["implausible"]
    if rec["status"] == "ok" and rec["not_cached"] is None:
        rec["cache_path"] = str(cache_path)
        write_json_atomic(cache_path, rec)
    return rec


def not_cacheable(result: dict[str, Any]) -> str | None:
    """Why an ok probe is no peak to keep, judged from its recorded trials: fewer than three,
    the best three more than AGREE apart, or other processes shared the CPU while it ran (a
    later sweep measures again); None for a keeper."""
    if result.get("status") != "ok":
        return None
    trials = [t for t in result.get("trials_flops") or [] if isinstance(t, (int, float))]
    if len(trials) < 3:
        return f"{len(trials)} trials recorded, 3 needed"
    if spread(trials) > AGREE:
        return f"the best three trials differ by {spread(trials):.0%} (more than {AGREE:.0%})"
    share = result.get("others_cpu_share")
    if isinstance(share, (int, float)) and share > CONTENDED_CPU_SHARE:
        return f"other processes used {share:.0%} of the CPUs while it ran"
    return None


def _run_probe(framework: str, python: str | Path, env: dict[str, str], device: str,
               precision: str, workdir: Path, timeout_s: float, seconds: float
               ) -> dict[str, Any]:
    """Run the probe in a child process; its result, or a failed/timeout/unavailable one."""
    try:
        workdir.mkdir(parents=True, exist_ok=True)
        fd, result = tempfile.mkstemp(dir=workdir, prefix=".probe-", suffix=".json")
        os.close(fd)
    except OSError as exc:
        return {"status": "failed", "reason": f"cannot write to {workdir}: {exc.strerror}"}
    result_path = Path(result)
    cmd = [str(python), "-m", "runners.peak_probe", "--framework", framework, "--device",
           device, "--precision", precision, "--result", str(result_path),
           "--seconds", str(seconds)]
    t0 = time.monotonic()
    try:
        reason = cannot_start(python)
        if reason:
            return {"status": "unavailable",
                    "reason": f"cannot start interpreter {python}: {reason}"}
        done = run_guarded(cmd, REPO_ROOT, env, timeout_s)  # the probe dies with the harness
        if done.returncode is None:
            return {"status": "timeout", "reason": f"probe exceeded {timeout_s:g} s; killed"}
        try:
            out = json.loads(result_path.read_text() or "null")
        except (OSError, ValueError):
            out = None
        if not isinstance(out, dict) or "status" not in out:
            lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
            last = lines[-1].strip()[:300] if lines else "no output"
            return {"status": "failed",
                    "reason": f"probe exited {done.returncode} without a result: {last}"}
        out.setdefault("reason", None)
        out["probe_wall_s"] = round(time.monotonic() - t0, 3)
        return out
    finally:
        result_path.unlink(missing_ok=True)


def _child_env(device: str, family: str, precision: str) -> dict[str, str]:
    """The probe's environment: the repo importable, no GPU on cpu, one GPU on gpu, and the
    family's thread policy for one device and the precision's float32 math, as its 1-device
    runs get them."""
    env = dict(os.environ)
    env.update(thread_env(family, "peak_probe", "python", device, 1, os.environ))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    else:  # the probe uses the first GPU; TF would take memory on every one it sees
        visible = [v for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v]
        env["CUDA_VISIBLE_DEVICES"] = visible[0] if visible else "0"
    return math_env(precision, device, env)


def machine_peak(device_type_name: str, precision: str, cache_dir: Path | None = None,
                 extra: tuple[dict[str, Any], ...] = ()) -> dict[str, Any] | None:
    """The highest ok peak any environment measured on this device type at this precision
    (cached probes plus `extra`): the machine's demonstrated limit. Frameworks' matmuls differ
    (MXNet's CPU dot reached 40% of TensorFlow's here), so one framework's probe is no
    ceiling for another's convolutions."""
    cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    found = list(extra)
    for path in cache_dir.glob("peak-*.json"):
        with contextlib.suppress(OSError, ValueError):
            found.append(json.loads(path.read_text()))
    ok = [p for p in found if p.get("status") == "ok" and p.get("device_type") ==
          device_type_name and p.get("precision") == precision and p.get("peak_flops")]
    return max(ok, key=lambda p: p["peak_flops"]) if ok else None


def peak_for(spec: Any, python: str | Path, environment: dict[str, Any],
             measured: tuple[dict[str, Any], ...] = ()) -> dict[str, Any] | None:
    """The peak a benchmark run's MFU is taken against: the machine's best measured peak on
    the run's device type and precision (cached probes, `measured` and this interpreter's
    own, measured now unless cached), with the interpreter's own under "own"; None for a
    family without a matmul probe."""
    if spec.family not in FAMILY_FRAMEWORK:
        return None
    own = measure_peak(spec.family, python, spec.device, spec.precision, environment)
    return against_machine_best(own, spec.precision, measured)


def against_machine_best(own: dict[str, Any], precision: str,
                         measured: tuple[dict[str, Any], ...] = (),
                         cache_dir: Path | None = None) -> dict[str, Any]:
    """An interpreter's own peak record turned into what MFU is taken against: the machine's
    best on its device type and precision (machine_peak over the cache, `measured` and own),
    with own under "own", flagged `implausible` when far below that best."""
    best = machine_peak(own.get("device_type", ""), precision, cache_dir, (*measured, own))
    flagged = {**own, "implausible": implausibly_low(own, best)}
    return {**(flagged if best is None or best is own else best), "own": flagged}


def peak_line(used: dict[str, Any]) -> str:
    """The terminal's words for one probe (against_machine_best's record): the figure just
    measured or read from the cache, or why there is none, and beside it the figure MFU is
    taken against, with what is wrong with the first."""
    own = used.get("own") or used
    text = (f"{own['status']}: {own.get('reason')}" if own.get("status") != "ok" else
            f"{own['peak_flops'] / 1e9:.1f} GFLOP/s"
            + (" (cached)" if own.get("cached") else
               f" (not cached: {own['not_cached']})"
               if own.get("not_cached") and own["not_cached"] != own.get("implausible") else ""))
    if used.get("status") != "ok":
        text += "; no MFU: no peak of this device type and precision"
    elif all(used.get(k) == own.get(k) for k in ("peak_flops", "family", "measured_at")):
        text += "; MFU against it, the machine's best"
    else:
        text += (f"; MFU against {used['peak_flops'] / 1e9:.1f} GFLOP/s, the machine's best "
                 f"({used.get('family')}'s probe, {used.get('measured_at')})")
    return text + (f"; IMPLAUSIBLE: {own['implausible']}" if own.get("implausible") else "")


def measure_peaks(runs: list[RunSpec], pythons: dict[str, Any], env: dict[str, Any],
                  out: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """The measured matmul peak (cached) of each interpreter and precision the benchmark runs
    use (written to peaks.json), each line on the terminal as it is measured; each key maps
    to the machine's best peak on that device type and precision, with the interpreter's own
    under "own". A line whose best a later probe raised is printed again."""
    peaks: dict[tuple[str, str], dict[str, Any]] = {}
    shown: dict[tuple[str, str], float | None] = {}
    for spec in runs:
        python = python_for(spec, pythons)
        key = (str(python), spec.precision)
        if spec.mode != "benchmark" or key in peaks or spec.family not in FAMILY_FRAMEWORK \
                or python is None or isinstance(python, Exception):
            continue
        print(f"peak: {spec.family} {spec.device} {spec.precision} matmul probe ...", end=" ",
              flush=True)
        peaks[key] = measure_peak(spec.family, python, spec.device, spec.precision, env)
        now = against_machine_best(peaks[key], spec.precision, tuple(peaks.values()))
        shown[key] = now.get("peak_flops")
        print(peak_line(now), flush=True)
    used = {key: against_machine_best(own, key[1], tuple(peaks.values()))
            for key, own in peaks.items()}
    if peaks:
        write_json_atomic(out / "peaks.json", [{"python": k[0], **u["own"]}
                                               for k, u in used.items()])
    for key, now in used.items():
        if now.get("peak_flops") != shown[key]:
            own = now["own"]
            print(f"peak: {own['family']} {own['device']} {own['precision']}: "
                  f"{peak_line(now)}", flush=True)
    return used
