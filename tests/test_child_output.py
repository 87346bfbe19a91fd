"""What the parent starts besides runs (the peak probe, check-model's build): a child's stray
bytes are read as text, never a traceback, and nothing it starts, detached or not, outlives it
(issue 43, items 5 and 6)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from bench.run import check_model
from bench.run.check_model import check_entry
from bench.run.peak import measure_peak

ENTRY = {"name": "mine", "framework": "torch"}


def interpreter(tmp_path: Path, body: str) -> str:
    """An executable standing in for a framework's interpreter: a shell script with `body`."""
    path = tmp_path / "python"
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(0o755)
    return str(path)


def alive_with(arg: str) -> list[int]:
    """The live (not zombie) processes whose command line holds `arg`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if arg.encode() in cmdline and state != "Z":
            found.append(int(pid))
    return found


def test_a_probe_interpreter_printing_non_utf8_bytes_is_a_failed_peak(tmp_path: Path) -> None:
    python = interpreter(tmp_path, r"printf 'caf\351 au lait\n' >&2; exit 1")
    peak = measure_peak("torch", python, "cpu", "fp32", {}, cache_dir=tmp_path / "peaks")
    assert peak["status"] == "failed"
    assert peak["reason"] == "probe exited 1 without a result: caf\ufffd au lait"


def test_a_build_printing_non_utf8_bytes_is_one_error_line(tmp_path: Path) -> None:
    python = interpreter(tmp_path, r"printf 'caf\351\n' >&2; exit 3")
    assert check_entry(ENTRY, "cpu", python) == {
        "error": "models: mine: the check died (exit 3): caf\ufffd"}


def test_what_a_build_starts_ends_with_it_detached_too(tmp_path: Path) -> None:
    mark = f"{3000 + secrets.randbelow(10**6) / 1e3:.3f}"  # a sleep no one else runs
    python = interpreter(tmp_path, f"sleep {mark} & setsid sleep {mark} &\n"
                                   'echo \'CHECK {"params": 1}\'')
    assert check_entry(ENTRY, "cpu", python) == {"params": 1}
    assert alive_with(mark) == []


def test_a_hanging_build_and_its_children_end_at_the_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mark = f"{3000 + secrets.randbelow(10**6) / 1e3:.3f}"
    python = interpreter(tmp_path, f"setsid sleep {mark} &\nsleep {mark}")
    monkeypatch.setattr(check_model, "TIMEOUT_S", 1)
    assert check_entry(ENTRY, "cpu", python) == {
        "error": "models: mine: building it took more than 1 s"}
    assert alive_with(mark) == []
