"""The orchestrator against real child programs that succeed, crash, hang and write garbage."""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import pytest

from bench.plan.runs import RunSpec
from bench.records.store import check_record, load_records
from bench.run.launch import child_command, launch
from bench.run.verdict import validate_result


def spec(behaviour: str = "ok", timeout_s: float = 60, **options: object) -> RunSpec:
    return RunSpec(
        run_id=f"toy-{behaviour}", sweep_id="t", runner="toy", family="host",
        module="tests.children.toy", model="probe", num_devices=1, device="cpu",
        virtual_devices=True, scaling="weak", batch_size_per_device=8, global_batch_size=8,
        data="synthetic", precision="fp32", warmup_steps=2, measure_steps=5, repeat=0,
        timeout_s=timeout_s, options={"behaviour": behaviour, **options})


def run(tmp_path: Path, s: RunSpec) -> dict:
    rec = launch(s, sys.executable, tmp_path, {"host": "test"})
    assert check_record(rec) == [], rec
    on_disk = json.loads((tmp_path / "runs" / f"{s.run_id}.json").read_text())
    assert on_disk == json.loads(json.dumps(rec))
    return rec


def test_ok_child_gives_ok_record(tmp_path: Path) -> None:
    rec = run(tmp_path, spec())
    assert rec["status"] == "ok" and rec["reason"] is None
    assert rec["images_per_sec"] > 0 and rec["samples"] == 5 * 8
    assert len(rec["step_times_s"]) == 5
    assert rec["window_end"] > rec["window_start"]
    assert rec["environment"]["framework"]["numpy"]
    assert Path(rec["log_path"]).read_text().count("[runner]") == 2


def test_crash_becomes_failed_with_reason(tmp_path: Path) -> None:
    rec = run(tmp_path, spec("crash"))
    assert rec["status"] == "failed"
    assert rec["reason"] == "RuntimeError: the toy runner crashed on purpose"
    assert "Traceback" in Path(rec["log_path"]).read_text()


def test_hang_is_killed_with_its_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    t0 = time.monotonic()
    rec = run(tmp_path, spec("hang", timeout_s=3, pid_file=str(pid_file)))
    assert rec["status"] == "timeout" and "timeout_s=3" in rec["reason"]
    assert time.monotonic() - t0 < 30
    grandchild = int(pid_file.read_text())
    assert not alive(grandchild)


def alive(pid: int) -> bool:
    """True while pid runs (a zombie waiting for PID 1 to reap it counts as dead)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_garbage_result_is_failed(tmp_path: Path) -> None:
    rec = run(tmp_path, spec("garbage"))
    assert rec["status"] == "failed" and "unreadable result" in rec["reason"]


def test_oom_message_is_oom(tmp_path: Path) -> None:
    rec = run(tmp_path, spec("oom"))
    assert rec["status"] == "oom" and "OOM when allocating" in rec["reason"]


def test_sigkill_is_reported_as_likely_oom(tmp_path: Path) -> None:
    rec = run(tmp_path, spec("sigkill"))
    assert rec["status"] == "oom" and "SIGKILL" in rec["reason"]


@pytest.mark.parametrize("module", ["tests.children.toy", "tests.children.no_framework"])
def test_missing_framework_is_unavailable(tmp_path: Path, module: str) -> None:
    rec = run(tmp_path, dataclasses.replace(spec("import_error"), module=module))
    assert rec["status"] == "unavailable"
    assert "No module named 'tensorflow_that_is_not_installed'" in rec["reason"]
    assert sys.executable in rec["reason"]


@pytest.mark.parametrize("behaviour, words", [("nan", "last_loss is nan"),
                                               ("short", "samples 32 != measure_steps")])
def test_untrustworthy_numbers_are_invalid(tmp_path: Path, behaviour: str, words: str) -> None:
    rec = run(tmp_path, spec(behaviour))
    assert rec["status"] == "invalid" and words in rec["reason"]


def test_multi_device_run_whose_work_stayed_on_one_device_is_invalid(tmp_path: Path) -> None:
    """A 2-device run must show both devices in the placement the child read back; one that
    only used one is invalid, with the device it used named."""
    two = dict(num_devices=2, global_batch_size=16)
    ok = run(tmp_path, dataclasses.replace(spec(), run_id="spread", **two))
    assert ok["status"] == "ok" and ok["placement"] == {"toy:shard0": 8, "toy:shard1": 8}
    rec = run(tmp_path, dataclasses.replace(spec("one_device"), **two))
    assert rec["status"] == "invalid"
    assert "did not spread over the 2 devices" in rec["reason"] and "toy:shard0" in rec["reason"]


def test_result_without_placement_is_invalid() -> None:
    s = dataclasses.replace(spec(), num_devices=2, global_batch_size=16)
    base = {"samples": 80, "first_loss": 1.0, "last_loss": 1.0, "images_per_sec": 3.0,
            "window_start": 1.0, "window_end": 2.0}
    assert any("no placement" in p for p in validate_result(base, s))
    assert any("positive" in p for p in validate_result(
        {**base, "placement": {"a": 8, "b": 0}}, s))
    collapsed = {**base, "placement": {"cpu(0)": 2}, "placement_collapsed": "keras-mxnet"}
    assert validate_result(collapsed, s) == []


def test_missing_interpreter_is_unavailable(tmp_path: Path) -> None:
    rec = launch(spec(), "/nonexistent/python", tmp_path, {})
    assert rec["status"] == "unavailable" and "/nonexistent/python" in rec["reason"]


def test_records_accumulate(tmp_path: Path) -> None:
    run(tmp_path, spec())
    run(tmp_path, dataclasses.replace(spec("crash")))
    assert {r["status"] for r in load_records(tmp_path)} == {"ok", "failed"}


@pytest.mark.parametrize("launcher, prefix", [
    ("python", ["/env/bin/python"]),
    ("torchrun", ["/env/bin/python", "-m", "torch.distributed.run", "--standalone",
                  "--nnodes=1", "--nproc-per-node=4", "--tee=3", "--log-dir={dir}/{run}.torchrun"]),
    ("horovodrun", ["/env/bin/horovodrun", "-np", "4", "--gloo", "-H", "localhost:4",
                    "/env/bin/python"]),
])
def test_child_command_per_launcher(tmp_path: Path, launcher: str, prefix: list[str]) -> None:
    """Every launcher ends in the runner module with its spec and result paths."""
    s = dataclasses.replace(spec(), num_devices=4, launcher=launcher)
    cmd = child_command(s, "/env/bin/python", tmp_path / "s.json", tmp_path / "r.json")
    prefix = [p.format(dir=tmp_path, run=s.run_id) for p in prefix]
    assert cmd == [*prefix, "-m", "tests.children.toy", "--spec", str(tmp_path / "s.json"),
                   "--result", str(tmp_path / "r.json")]


def test_unknown_launcher_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown launcher 'mpirun'"):
        child_command(dataclasses.replace(spec(), launcher="mpirun"), "/env/bin/python",
                      tmp_path / "s.json", tmp_path / "r.json")
