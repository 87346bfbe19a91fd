"""run_bench.py with the toy runner registered: sweeps through the real CLI, in seconds."""

from bench.catalog.registry import RUNNERS, Option, RunnerInfo
from bench.cli import entry

RUNNERS["toy"] = RunnerInfo(
    "toy", "tf", "tests.children.toy", "numpy softmax regression (tests only)",
    options={"behaviour": Option(str, "ok"), "pid_file": Option(str, None),
             "busy_s": Option(float, 0.0), "worker_pid_file": Option(str, None),
             "detached_pid_file": Option(str, None)},
)

if __name__ == "__main__":
    entry()
