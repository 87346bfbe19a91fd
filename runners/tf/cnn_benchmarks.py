"""tf_cnn_benchmarks: the real script from a user's checkout of tensorflow/benchmarks, run in a
subprocess with flags mapped from the spec (unset options pass no flag), its output parsed
(the one log the harness parses). Its own models and input pipeline. The pure functions
import no framework. Never copy the script into this project.
docs/runners/tf_cnn_benchmarks.md, "Notes from the code"."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from contract import tf_cnn_checkout as checkout
from contract.reasons import code
from contract.result import join
from contract.tf_cnn_checkout import ENV_VAR, find_script  # noqa: F401  (re-exported)
from models import get_spec
from runners.common import Invalid, Spec, Unavailable, main
from runners.real_data import RealData, check_classes, describe, open_dataset

LAYOUTS = {"channels_last": "NHWC", "channels_first": "NCHW"}
PRECISION_FLAGS = {"fp32": [], "fp16": ["--use_fp16"]}
IMAGES_PER_SEC_SOURCE = "tf_cnn_benchmarks total images/sec"
IMAGENET_CLASSES = 1001  # the script's imagenet models: 1000 classes + background (label 0)

STEP_LINE = re.compile(
    r"^(?P<step>\d+)\timages/sec: (?P<mean>[\d.]+)"
    r"(?: \+/- (?P<unc>[\d.]+) \(jitter = (?P<jitter>[\d.]+)\))?"
    r"\t(?P<loss>[-+\w.]+)")
TOTAL_LINE = re.compile(r"^total images/sec: (?P<value>[\d.]+)\s*$")
GLOBAL_BATCH = re.compile(r"^Batch size:\s+(?P<value>\d+) global\s*$")
PER_DEVICE = re.compile(r"^\s+(?P<value>\d+) per device\s*$")
HEADER = {"model": re.compile(r"^Model:\s+(?P<value>\S+)"),
          "devices": re.compile(r"^Devices:\s+(?P<value>\[.*\])"),
          "dataset": re.compile(r"^Dataset:\s+(?P<value>.+?)\s*$"),
          "data_format": re.compile(r"^Data format:\s+(?P<value>\S+)"),
          "variables": re.compile(r"^Variables:\s+(?P<value>\S+)"),
          "optimizer": re.compile(r"^Optimizer:\s+(?P<value>\S+)"),
          "all_reduce": re.compile(r"^AllReduce:\s+(?P<value>\S+)"),
          "tensorflow": re.compile(r"^TensorFlow:\s+(?P<value>\S+)"),
          "num_batches": re.compile(r"^Num batches:\s+(?P<value>\d+)")}
# the record's names for what the script's header says (parse_output's keys)
SCRIPT_HEADER = {"script_model": "model", "script_dataset": "dataset",
                 "variable_update": "variables", "all_reduce": "all_reduce",
                 "optimizer": "optimizer"}
ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception)\b.*")
OOM = re.compile(r"ResourceExhaustedError|OOM when allocating|out of memory", re.IGNORECASE)


# The script's own flag defaults (benchmark_cnn.py) for what this runner can leave unset; the
# result records which of them a run left to the script and what it passed instead.
SCRIPT_DEFAULTS = {"variable_update": "parameter_server", "local_parameter_device": "gpu",
                   "data_format": "NCHW"}


def layout_flag(device: str, data_format: str | None) -> str | None:
    """--data_format for a run: the given layout, or None for the script's default NCHW; CPU runs
    pass NHWC (the script refuses NCHW on CPU without --mkl)."""
    if data_format:
        layout = LAYOUTS[data_format]
        if device == "cpu" and layout == "NCHW":
            raise Unavailable("tf_cnn_benchmarks refuses --device=cpu with --data_format=NCHW "
                              "('device=cpu requires that data_format=NHWC'); use "
                              "channels_last")
        return layout
    return "NHWC" if device == "cpu" else None


def build_flags(spec: Spec, options: Mapping[str, Any] | None = None,
                trace_file: str | None = None) -> list[str]:
    """tf_cnn_benchmarks flags for a run spec (pure): --batch_size per device, --num_gpus the
    devices of either kind; unset options pass no flag; --trace_file traces step -2."""
    opts = {**spec.options, **(options or {})}  # options: over the spec's own
    n, per_device = int(spec.num_devices), int(spec.batch_size_per_device)
    if per_device * n != int(spec.global_batch_size):
        raise Invalid(f"global batch {spec.global_batch_size} != {per_device} per device x "
                      f"{n} devices")
    precision = spec.precision
    if precision not in PRECISION_FLAGS:
        raise Unavailable(f"tf_cnn_benchmarks runs fp32 or fp16 (--use_fp16), not {precision}")
    device = spec.device
    model = opts["script_model"] or checkout.script_model(spec.model)
    if model not in checkout.SCRIPT_MODELS.get(spec.model, (model,)):
        raise Unavailable(f"script_model {model!r} is not a {spec.model}: "
                          f"{', '.join(checkout.SCRIPT_MODELS[spec.model])}")
    flags = [
        f"--model={model}",
        f"--num_gpus={n}",
        f"--batch_size={per_device}",
        f"--device={device}",
    ]
    layout = layout_flag(device, opts["data_format"])
    if layout:
        flags.append(f"--data_format={layout}")
    for name in ("variable_update", "local_parameter_device", "all_reduce_spec"):
        if opts.get(name):
            flags.append(f"--{name}={opts[name]}")
    flags += [
        f"--num_batches={int(spec.measure_steps)}",
        f"--num_warmup_batches={int(spec.warmup_steps)}",
        "--display_every=1",
    ]
    flags += PRECISION_FLAGS[precision]
    if trace_file:
        flags.append(f"--trace_file={trace_file}")
    if spec.data != "synthetic":
        dataset = spec.dataset or {}
        if not dataset.get("path"):
            raise Unavailable(f"data {spec.data!r} needs a prepared dataset (config key "
                              f"dataset.path) for tf_cnn_benchmarks' --data_dir of TFRecords")
        data_dir = str(Path(dataset["path"]) / "tfrecord")
        # the folder name need not say "imagenet": name the format (train-*-of-* Examples)
        flags += [f"--data_dir={data_dir}", "--data_name=imagenet"]
        if "workers" in dataset:
            flags.append(f"--datasets_num_private_threads={max(1, int(dataset['workers']))}")
    return flags


def left_to_script(flags: list[str]) -> dict[str, str]:
    """The SCRIPT_DEFAULTS flags a run did not pass, with the value the script then uses."""
    passed = {f[2:].split("=", 1)[0] for f in flags}
    return {k: v for k, v in SCRIPT_DEFAULTS.items() if k not in passed}


def compute_events(trace: Mapping[str, Any]) -> Iterator[tuple[str, dict[str, Any], str]]:
    """(device, args, op) of each "X" event of the trace's "<device> Compute" processes (named
    by its metadata events)."""
    devices: dict[int, str] = {}
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") == "M" and ev.get("name") == "process_name":
            name = str((ev.get("args") or {}).get("name", ""))
            if name.endswith(" Compute"):
                devices[ev["pid"]] = name[: -len(" Compute")]
    for ev in trace.get("traceEvents", []):
        if ev.get("ph") == "X" and ev.get("pid") in devices:
            args = ev.get("args") or {}
            yield devices[ev["pid"]], ev, str(args.get("op", ev.get("name", "?")))


def trace_placement(trace: Mapping[str, Any]) -> tuple[dict[str, int], dict[str, int]]:
    """From the script's Chrome trace (pure): the nodes executed on each device and how many of
    each op type, from the "X" events of each "<device> Compute" process."""
    executed = [(dev, op) for dev, ev, op in compute_events(trace)
                if (ev.get("args") or {}).get("name") not in ("_SOURCE", "_SINK")]
    by_device, by_type = Counter(d for d, _ in executed), Counter(op for _, op in executed)
    return dict(sorted(by_device.items())), dict(sorted(by_type.items(), key=lambda kv: -kv[1]))


def trace_op_seconds(trace: Mapping[str, Any]) -> dict[str, float]:
    """Seconds per op type summed over the traced step's executed nodes (all devices; the
    FULL_TRACE step runs slower than an untraced one, so read shares, not totals)."""
    seconds: dict[str, float] = {}
    for _, ev, op in compute_events(trace):
        seconds[op] = seconds.get(op, 0.0) + float(ev.get("dur", 0)) / 1e6
    return {k: round(v, 6) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])}


def parse_output(text: str) -> dict[str, Any]:
    """What tf_cnn_benchmarks printed (pure; missing pieces None or empty): its header, one entry
    per displayed step (its running-mean images/sec and loss), the final `total images/sec`."""
    out: dict[str, Any] = {"steps": [], "total_images_per_sec": None, "global_batch": None,
                           "batch_per_device": None, "devices": None}
    out.update({k: None for k in HEADER})
    for raw in text.splitlines():
        line = raw.rstrip("\r\n")
        if m := STEP_LINE.match(line):
            out["steps"].append({
                "step": int(m["step"]), "images_per_sec_mean": float(m["mean"]),
                "uncertainty": float(m["unc"]) if m["unc"] else None,
                "jitter": float(m["jitter"]) if m["jitter"] else None,
                "loss": float(m["loss"])})
        elif m := TOTAL_LINE.match(line):
            out["total_images_per_sec"] = float(m["value"])
        elif m := GLOBAL_BATCH.match(line):
            out["global_batch"] = int(m["value"])
        elif (m := PER_DEVICE.match(line)) and out["global_batch"] is not None:
            out["batch_per_device"] = int(m["value"])
        else:
            for key, pattern in HEADER.items():
                if out[key] is None and (m := pattern.match(line)):
                    out[key] = m["value"]
    if out["devices"] is not None:
        out["devices"] = re.findall(r"'([^']+)'", out["devices"])
    if out["num_batches"] is not None:
        out["num_batches"] = int(out["num_batches"])
    steps = out["steps"]
    out["losses"] = [s["loss"] for s in steps]
    out["first_loss"] = steps[0]["loss"] if steps else None
    out["last_loss"] = steps[-1]["loss"] if steps else None
    out["timed_steps"] = steps[-1]["step"] if steps else 0
    out["samples"] = (out["timed_steps"] * out["global_batch"]
                      if out["global_batch"] is not None else None)
    out["step_times_s"] = step_times(steps, out["global_batch"]) if out["global_batch"] else None
    return out


def step_times(steps: list[dict[str, Any]], global_batch: int) -> list[float] | None:
    """Per-step seconds from the script's running-mean rates (differences of N x batch / mean_N);
    None if the rates' rounding makes any step non-positive."""
    times: list[float] = []
    prev_step, prev_total = 0, 0.0
    for s in steps:
        if s["images_per_sec_mean"] <= 0 or s["step"] <= prev_step:
            return None
        total = s["step"] * global_batch / s["images_per_sec_mean"]
        span = s["step"] - prev_step
        each = (total - prev_total) / span
        if each <= 0:
            return None
        times.extend([round(each, 6)] * span)
        prev_step, prev_total = s["step"], total
    return times


def _error_reason(lines: list[str]) -> str:
    for line in reversed(lines):
        if ERROR_LINE.match(line.strip()):
            return line.strip()[:300]
    tail = [ln.strip() for ln in lines if ln.strip()]
    return tail[-1][:300] if tail else "no output"


def _versions() -> dict[str, str]:
    found = {}
    for dist in ("tensorflow", "tensorflow-cpu", "tf-keras", "keras", "numpy"):
        try:
            found[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def _checkout_commit(script: Path) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(script.parent), "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (proc.stdout.strip() or None) if proc.returncode == 0 else None


def run_script(script: Path, flags: list[str], timeout_s: float
               ) -> tuple[int, list[str], dict[str, float], list[float]]:
    """Run the script, print its lines as they come; return its exit code, its lines, the wall
    times when its marker lines were read, and the wall time of each step line."""
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, str(script), *flags]
    print(f"[tf_cnn_benchmarks] $ cd {script.parent} && TF_USE_LEGACY_KERAS=1 "
          f"{' '.join(cmd)}", flush=True)
    proc = subprocess.Popen(cmd, cwd=script.parent, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                            bufsize=1, errors="replace")
    timed_out = threading.Event()

    def kill() -> None:
        timed_out.set()
        proc.kill()

    watchdog = threading.Timer(timeout_s, kill)
    watchdog.start()
    lines: list[str] = []
    marks: dict[str, float] = {}
    step_walls: list[float] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.time()
            print(line, end="", flush=True)
            lines.append(line.rstrip("\n"))
            if line.startswith("Done warm up"):
                marks["done_warm_up"] = now
            elif STEP_LINE.match(line):
                step_walls.append(now)
            elif TOTAL_LINE.match(line):
                marks["total"] = now
        code = proc.wait()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if timed_out.is_set():
        raise TimeoutError(f"tf_cnn_benchmarks ran past {timeout_s:.0f} s and was killed")
    return code, lines, marks, step_walls


def real_input_line(data: RealData, flags: list[str]) -> str:
    """What feeds the script's models on real data: its own ImageNet training preprocessing,
    not runners/real_data.py's (the `augmentation` setting does not reach it)."""
    threads = next((f.split("=", 1)[1] for f in flags
                    if f.startswith("--datasets_num_private_threads=")), "default")
    return (f"tf_cnn_benchmarks' own input (--data_name=imagenet) over {len(data.tfrecords)} "
            f"TFRecord shard(s): parallel_interleave reads, shuffle_and_repeat 10000, "
            f"map_and_batch of its training preprocessing (sample_distorted_bounding_box crop, "
            f"INTEGER_FAST decode, random flip, bilinear resize to the model's size; dataset "
            f"augmentation {data.augmentation!r} not applied), {threads} private dataset "
            f"thread(s), a pipeline per device")


def script_memory(spec: Spec, n: int) -> dict[str, Any]:
    """The script's memory as read from outside: on CPU its children's peak resident memory
    (ru_maxrss) shared by its n virtual devices; on GPUs null (not readable here, said)."""
    if spec.device != "cpu":
        return {"memory_per_device": None,
                "memory_source": code("tf.cnn_memory_unreadable")}
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # KiB on Linux
    return {"memory_per_device": {f"process0:cpu ({n} virtual devices)": peak},
            "memory_source": f"{code('tf.cnn_process_maxrss')}; shared by its {n} virtual devices"}


def run_traced(spec: Spec, script: Path) -> tuple[list[str], int, list[str], dict[str, float],
                                                 list[float], Any]:
    """Run the script with a --trace_file: flags, exit code, lines, marks, step times, trace."""
    with tempfile.TemporaryDirectory(prefix="tf_cnn_trace_") as tmp:
        trace_path = Path(tmp) / "trace.json"
        flags = build_flags(spec, spec.options, trace_file=str(trace_path))
        model = flags[0].split("=", 1)[1]
        checkout.check_model_in_checkout(script, model)
        # leave the launcher time to record what happened before it kills our process group
        timeout = max(float(spec.timeout_s) - max(15.0, 0.05 * float(spec.timeout_s)),
                      1.0)
        code, lines, marks, step_walls = run_script(script, flags, timeout)
        trace = json.loads(trace_path.read_text()) if trace_path.is_file() else None
    return flags, code, lines, marks, step_walls, trace


def check_parsed(parsed: dict[str, Any], global_batch: int) -> None:
    """Invalid unless the script printed its total, the spec's global batch and every step."""
    if parsed["total_images_per_sec"] is None:
        raise Invalid("tf_cnn_benchmarks finished without printing 'total images/sec'")
    if parsed["global_batch"] != global_batch:
        raise Invalid(f"tf_cnn_benchmarks reports a global batch of {parsed['global_batch']}, "
                      f"the spec {global_batch}")
    if parsed["timed_steps"] != len(parsed["steps"]):
        raise Invalid(f"expected a line per step (--display_every=1); got "
                      f"{len(parsed['steps'])} lines up to step {parsed['timed_steps']}")


def timed_window(parsed: dict[str, Any], marks: dict[str, float], step_walls: list[float]
                 ) -> dict[str, Any]:
    """The step times (from the running-mean rates, else the step lines' arrival) and the
    window between the 'Done warm up' and 'total images/sec' lines; Invalid without one."""
    times, times_source = parsed["step_times_s"], "derived from the per-step running-mean " \
                                                  "images/sec lines (0.1 images/sec precision)"
    start = marks.get("done_warm_up", step_walls[0] if step_walls else None)
    end = marks.get("total")
    if times is None and step_walls and start is not None:
        times = [round(b - a, 6) for a, b in zip([start, *step_walls[:-1]], step_walls,
                                                 strict=True)]
        times_source = "intervals between the step lines' arrival (rounded rates gave <= 0)"
    if start is None or end is None or end <= start:
        raise Invalid("could not place the timed window in the script's output")
    return {"step_times_s": times, "step_times_source": times_source, "window_start": start,
            "window_end": end, "window_s": end - start,
            "window_source": code("tf.cnn_window_source")}


def data_fields(spec: Spec, data: RealData | None, flags: list[str]) -> dict[str, Any]:
    """What the record says of the script's input."""
    if data is None:
        return {"data_placement": "the script's synthetic images, generated on each device"}
    return {**describe(data, get_spec(spec.model).input_shape[0]),
            "input_pipeline": real_input_line(data, flags),
            "data_placement": "the script's per-device tf.data input pipelines (its own "
                              "preprocessing), staged onto each device"}


def benchmark(spec: Spec) -> dict[str, Any]:
    script = find_script(spec.options)
    data = None
    if spec.data == "real":
        data = open_dataset(spec)
        check_classes(data, IMAGENET_CLASSES, "tf_cnn_benchmarks' imagenet models")
    if int(spec.warmup_steps) < 2:
        raise Invalid("tf_cnn_benchmarks needs warmup_steps >= 2 here: the placement comes from "
                      "the script's --trace_file, which traces step -2 (a warm-up step)")
    flags, code, lines, marks, step_walls, trace = run_traced(spec, script)
    text = "\n".join(lines)
    if code != 0:
        reason = f"tf_cnn_benchmarks exited {code}: {_error_reason(lines)}"
        if OOM.search(text):
            raise MemoryError(reason)
        raise RuntimeError(reason)
    parsed = parse_output(text)
    n = int(spec.num_devices)
    check_parsed(parsed, int(spec.global_batch_size))
    window = timed_window(parsed, marks, step_walls)
    kind = "virtual CPU device (the script's device_count['CPU'])" if spec.device == "cpu" \
        else "GPU"
    devices = [{"name": d, "kind": kind} for d in (parsed["devices"] or [])]
    if len(devices) != n:
        raise Invalid(f"tf_cnn_benchmarks ran on {parsed['devices']}, not {n} devices")
    if spec.data == "real" and "synthetic" in (parsed["dataset"] or "synthetic"):
        raise Invalid(f"a real-data run, but the script reports dataset {parsed['dataset']!r}")
    if trace is None:
        raise Invalid("the script wrote no --trace_file: no placement from TensorFlow")
    placement, ops_by_type = trace_placement(trace)
    memory = script_memory(spec, n)  # before git's rev-parse, as ru_maxrss was read
    return join({
        "images_per_sec": parsed["total_images_per_sec"],
        "images_per_sec_source": IMAGES_PER_SEC_SOURCE,
        **{k: parsed[k] for k in ("timed_steps", "samples", "first_loss", "last_loss")},
        "loss_kind": "the script's total_loss of each displayed step (cross-entropy + L2)",
    }, window, {
        "replicas": n,
        "framework": {**_versions(), "tensorflow_reported": parsed["tensorflow"]},
        "devices": devices,
        "layout": "channels_last" if parsed["data_format"] == "NHWC" else "channels_first",
        **{ours: parsed[theirs] for ours, theirs in SCRIPT_HEADER.items()},
        "placement": placement,
        "placement_source": code("tf.cnn_trace_executed_nodes"),
        "traced_ops_by_type": ops_by_type,
        "traced_op_seconds_by_type": trace_op_seconds(trace),
        "flags": [f for f in flags if not f.startswith("--trace_file=")],
        "left_to_script": left_to_script(flags),
        "script": str(script),
        "checkout_commit": _checkout_commit(script),
    }, memory, data_fields(spec, data, flags))


if __name__ == "__main__":
    main(benchmark)
