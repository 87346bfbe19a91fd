"""Progress a person can read: the installers' lines parsed, plain lines where there is no
terminal (as before), a live display where there is one."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bench.records.store import load_records
from bench.run import progress
from bench.run.progress import BuildDisplay, InstallState, SweepClock, SweepProgress
from tests.helpers.cli import REPO

PIP_LINES = """\
Looking in indexes: https://pypi.org/simple
Collecting certifi==2026.10.18 (from -r envs/mxnet-cpu.lock (line 1))
  Downloading certifi-2026.10.18-py3-none-any.whl (134 kB)
WARNING: Location 'file:///mirror/simple/mxnet/' is ignored: it is neither a file nor a directory.
Collecting mxnet==1.9.1 (from -r envs/mxnet-cpu.lock (line 250))
  Downloading mxnet-1.9.1-py3-none-manylinux2014_x86_64.whl (49.1 MB)
Processing /mirror/files/numpy-1.23.5-cp311-cp311-manylinux_2_17_x86_64.whl (from -r x (line 3))
Installing collected packages: numpy, mxnet, certifi
Successfully installed certifi-2026.10.18 mxnet-1.9.1 numpy-1.23.5
""".splitlines()

UV_LINES = """\
Using Python 3.11.7 environment at: /envs/mxnet-cpu-abc
Resolved 16 packages in 1.06s
Downloading pillow (6.8MiB)
Downloading mxnet (46.8MiB)
 Downloaded pillow
Prepared 16 packages in 2.75s
Installed 16 packages in 77ms
 + certifi==2026.10.18
""".splitlines()


def test_sizes() -> None:
    assert progress.parse_size("49.1 MB") == 49_100_000
    assert progress.parse_size("46.8MiB") == int(46.8 * 2**20)
    assert progress.parse_size("134 kB") == 134_000
    assert progress.parse_size("from -r") is None
    assert progress.size_text(49_100_000) == "49.1 MB" and progress.size_text(12) == "12 B"
    assert progress.clock_text(3725) == "1:02:05" and progress.clock_text(65) == "1:05"


def test_pip_lines_give_step_package_and_bytes() -> None:
    s = InstallState(packages=16)
    seen = []
    for line in PIP_LINES:
        s.feed(line)
        seen.append((s.step, s.package))
    assert seen[1] == ("resolve", "certifi==2026.10.18")
    assert seen[5] == ("download", "mxnet-1.9.1-py3-none-manylinux2014_x86_64.whl")
    assert s.in_flight == {}  # landed once the next event came
    assert seen[6][1].startswith("numpy-1.23.5")
    assert seen[7] == ("install", "numpy, mxnet, certifi")
    assert s.step == "done" and s.installed == 3
    assert s.downloads == 2 and s.downloaded == 134_000 + 49_100_000
    assert s.summary() == "2 downloaded, 49.2 MB; 3 installed"


def test_build_lines() -> None:
    s = InstallState()
    s.feed("Building wheels for collected packages: horovod")
    assert s.step == "start"
    s.feed("  Building wheel for horovod (setup.py): started")
    assert (s.step, s.package) == ("build", "horovod")
    s = InstallState()
    s.feed("   Building horovod @ file:///tmp/horovod-0.28.1")
    assert (s.step, s.package) == ("build", "horovod")
    s.feed("  [  5%] Building CXX object third_party/gloo/allreduce.cc.o")
    assert s.package == "horovod" and s.last.startswith("[  5%]")


def test_uv_lines_give_step_package_and_bytes() -> None:
    s = InstallState()
    s.set_step("resolve")
    s.feed(UV_LINES[0])
    assert s.step == "resolve"
    s.feed(UV_LINES[1])
    assert (s.step, s.packages) == ("download", 16)
    s.feed(UV_LINES[2])
    s.feed(UV_LINES[3])
    assert s.package == "mxnet" and set(s.in_flight) == {"pillow", "mxnet"}
    s.feed(UV_LINES[4])
    assert s.downloads == 1 and s.downloaded == int(6.8 * 2**20)
    s.feed(UV_LINES[5])
    assert s.step == "install" and s.downloads == 2  # mxnet landed too
    for line in UV_LINES[6:]:
        s.feed(line)
    assert s.step == "done" and s.installed == 16


def test_plain_build_prints_as_before_and_logs_everything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "env.log"
    with BuildDisplay("mxnet-cpu", log, live=False) as show:
        show.say("[setup] mxnet-cpu: creating /envs/x")
        for line in PIP_LINES:
            show.line(line + "\n")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[setup] mxnet-cpu: creating /envs/x"
    assert out[1:] == [f"    {ln.rstrip()}" for ln in PIP_LINES
                       if ln.startswith(progress.PLAIN_PREFIXES)]
    assert "Looking in indexes" not in "\n".join(out)  # pip's chatter stays in the log
    assert log.read_text().splitlines() == ["[setup] mxnet-cpu: creating /envs/x", *PIP_LINES]
    with BuildDisplay("mxnet-cpu", None, quiet=True) as show:
        show.say("[setup] quiet")
        show.line("Collecting x")
    assert capsys.readouterr().out == ""


def render(thing: object, width: int = 100) -> str:
    from rich.console import Console

    console = Console(file=io.StringIO(), force_terminal=True, width=width, color_system=None)
    console.print(thing)
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_live_build_shows_step_package_and_bytes(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    show = BuildDisplay("tf-cpu", tmp_path / "x.log", live=True, packages=42)
    show.installer = "uv"
    show.step("resolve")
    for line in UV_LINES[:4]:
        show.line(line)
    text = render(show)
    assert "setup tf-cpu with uv" in text
    assert "download" in text and "mxnet (49.1 MB) and 1 more" in text
    assert "16 packages" in text
    show.line(UV_LINES[4])
    assert "1 downloaded, 7.1 MB" in render(show)


def test_live_build_failure_prints_the_logs_tail(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from rich.console import Console

    console = Console(file=io.StringIO(), force_terminal=True, width=100)
    log = tmp_path / "x.log"
    with pytest.raises(RuntimeError), \
            BuildDisplay("tf-cpu", log, live=True, console=console) as show:
        for i in range(30):
            show.line(f"line {i}")
        show.line("ERROR: No matching distribution found for tensorflow==9")
        raise RuntimeError("install failed")
    err = capsys.readouterr().err
    assert "the last 20 lines of its log" in err
    assert "ERROR: No matching distribution" in err and "line 10" not in err
    assert f"full log: {log}" in err
    assert "line 0" in log.read_text()


def test_sweep_plain_lines_are_the_old_ones(capsys: pytest.CaptureFixture[str]) -> None:
    show = SweepProgress([True, True], live=False)
    with show:
        show.started("[1/2] toy probe n=1")
        show.finished("[1/2] toy probe n=1", "ok (1.0s) 5.0 img/s", 1.0)
        show.started("[until_stable: ...]")
        show.finished("[until_stable: ...]", "ok (1.0s) 5.0 img/s", 1.0, counted=False)
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[1/2] toy probe n=1 ... ok (1.0s) 5.0 img/s  [1/2 done, 0:00, ~0:01 left]"
    assert out[1] == "[until_stable: ...] ... ok (1.0s) 5.0 img/s"


def test_sweep_live_footer() -> None:
    show = SweepProgress([True, False, True, True], live=True)
    show.clock.t0 -= 65
    show.started("[1/4] tf_mirrored minigooglenet n=1")
    assert "0/4 runs done" in render(show) and "[1/4] tf_mirrored" in render(show)
    show.clock.tick(10.0)
    show.current = None
    text = render(show)
    assert "1/4 runs done" in text and "elapsed 1:05" in text and "~0:20 left" in text
    show.started("[2/4] ...")
    show.current_t0 -= 4
    assert "~0:16 left" in render(show) and "running 0:04" in render(show)


def test_clock_estimate_left() -> None:
    clock = SweepClock([True, False, True])
    assert clock.left_s() is None  # nothing to go by yet
    clock.tick(10.0)
    assert clock.left_s() == 10.0 and clock.left_s(running_s=4) == 6.0
    clock.tick(0.0)
    clock.tick(20.0)
    assert clock.left_s() == 0.0


def test_live_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MGBENCH_PROGRESS", raising=False)
    assert not progress.live_wanted()  # pytest captures stdout: no terminal
    monkeypatch.setenv("MGBENCH_PROGRESS", "live")
    assert progress.live_wanted()
    monkeypatch.setenv("MGBENCH_PROGRESS", "plain")
    assert not progress.live_wanted()


def test_a_sweep_on_a_terminal_draws_the_live_display(tmp_path: Path) -> None:
    """The real CLI in a pseudo-terminal: a finished line per run above the footer, no
    half-printed `... ` lines, and the same records."""
    cfg = {"name": "toy", "runners": ["toy"], "models": ["probe"], "devices": [1, 2],
           "batch_size_per_device": 8, "warmup_steps": 1, "measure_steps": 3,
           "timeout_s": 60, "runner_options": {"toy": {"python": sys.executable}}}
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(cfg))
    leader, follower = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "120"}
    env.pop("MGBENCH_PROGRESS", None)
    proc = subprocess.Popen([sys.executable, "-m", "tests.children.cli_with_toy", "--config",
                             str(path), "--out", str(tmp_path / "out")], cwd=REPO,
                            stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, env=env)
    os.close(follower)
    chunks = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if ready:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(leader)
    assert proc.wait(timeout=30) == 0
    screen = b"".join(chunks).decode(errors="replace")
    assert "[1/2] toy probe n=1" in screen and "runs done" in screen  # the footer was drawn
    lines = [ln for ln in screen.replace("\r", "\n").splitlines() if " ... ok (" in ln]
    assert any("[1/2 done, " in ln for ln in lines) and any("[2/2 done, " in ln for ln in lines)
    assert [r["status"] for r in load_records(tmp_path / "out")] == ["ok", "ok"]
