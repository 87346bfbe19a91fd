"""The harness's own overhead: one run launched by the harness (telemetry on) against the same
run started by hand (the runner module with the same spec, nothing watching), and launched by
the harness with telemetry off (to tell the sampler's cost from the launcher's), rotated so
drift hits all three alike. Prints the medians and the ratios with their intervals
(bench/analysis/stats.py's rule: the range with 2 pairs, the 95% bootstrap CI from 3).

    python -m tools.harness_overhead --config configs/cpu-smoke.yaml --pairs 5 \
        --set devices=1 --set measure_steps=30
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench import REPO_ROOT
from bench.analysis.stats import interval_name, ratio_interval
from bench.plan.config import load_config
from bench.plan.runs import RunSpec, expand
from bench.run import environment
from bench.run.envs import ensure_env
from bench.run.launch import launch


def by_hand(spec: RunSpec, python: Path, work: Path) -> float:
    """Start the runner as a user would, with the spec file: images/sec from its result."""
    spec_path, result_path = work / "hand.spec.json", work / "hand.result.json"
    spec_path.write_text(json.dumps(spec.to_dict()))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    if spec.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    subprocess.run([str(python), "-m", spec.module, "--spec", str(spec_path), "--result",
                    str(result_path)], cwd=REPO_ROOT, env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    result = json.loads(result_path.read_text())
    if result.get("status") != "ok":
        raise SystemExit(f"hand-started run failed: {result.get('reason')}")
    return float(result["images_per_sec"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/cpu-smoke.yaml")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--pairs", type=int, default=5, help="rounds of the three arms")
    args = p.parse_args()
    cfg = load_config(args.config, args.set)
    spec = expand(cfg, "overhead")[0]
    if spec.telemetry is None:
        raise SystemExit("telemetry is off in this config; the point is to measure it on")
    python = ensure_env(spec.family, cfg.device).python
    env = environment.capture()
    arms: dict[str, list[float]] = {"harness": [], "hand": [], "no_telemetry": []}

    def harness_run(telemetry: bool, i: int) -> float:
        s = dataclasses.replace(spec, run_id=f"overhead-{i}-{telemetry}",
                                telemetry=spec.telemetry if telemetry else None)
        rec = launch(s, python, work, env)
        if rec["status"] != "ok":
            raise SystemExit(f"harness run failed: {rec['reason']}")
        return float(rec["images_per_sec"])

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        runs = {"harness": lambda i: harness_run(True, i), "hand": lambda i: by_hand(
            spec, python, work), "no_telemetry": lambda i: harness_run(False, i)}
        order = list(runs)
        for i in range(args.pairs):
            for name in order[i % 3:] + order[:i % 3]:  # rotate who goes first
                arms[name].append(runs[name](i))
            print(f"round {i + 1}/{args.pairs}: " + "  ".join(
                f"{k} {v[-1]:.2f}" for k, v in arms.items()) + " img/s", flush=True)
    med = {k: statistics.median(v) for k, v in arms.items()}
    print(f"\n{spec.runner} {spec.model} n={spec.num_devices} b={spec.global_batch_size} "
          f"{spec.measure_steps} timed steps, telemetry every {spec.telemetry['interval_s']} s")
    print("medians: " + ", ".join(f"{k} {v:.2f} img/s" for k, v in med.items()))
    for num, den in (("harness", "hand"), ("no_telemetry", "hand"), ("harness", "no_telemetry")):
        low, high, kind = ratio_interval(arms[num], arms[den])
        ci = f" ({interval_name(kind)} {low:.3f}-{high:.3f})" if low is not None else ""
        print(f"{num} / {den} = {med[num] / med[den]:.3f}{ci}"
              + ("; target >= 0.98" if (num, den) == ("harness", "hand") else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
