"""Nothing outside the results folder is written through it, and no input is read without
bound (issue 43, items 3 and 8): the sweep's lock is opened without following a link and only
as a regular file; make-dataset's --from only as a regular file (or a folder) of bounded size."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench.run import sweep_lock
from tests.helpers.cli import run_cli
from tests.helpers.toy import config, toy


def test_a_lock_that_is_a_link_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / sweep_lock.LOCK_NAME).symlink_to(target)
    with pytest.raises(sweep_lock.FolderBusy, match=r"its lock \.sweep\.lock is a link"):
        sweep_lock.acquire(out)
    assert target.read_text() == "keep me\n"


def test_a_lock_that_is_no_regular_file_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / sweep_lock.LOCK_NAME)
    with pytest.raises(sweep_lock.FolderBusy, match="is not a regular file"):
        sweep_lock.acquire(out)


def test_a_sweep_onto_a_linked_lock_is_one_line_and_writes_nothing_through_it(
        tmp_path: Path) -> None:
    target = tmp_path / "precious.txt"
    target.write_text("keep me\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / sweep_lock.LOCK_NAME).symlink_to(target)
    proc = toy("--config", str(config(tmp_path)), "--out", str(out), "--resume")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "is a link" in proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert target.read_text() == "keep me\n"
    assert not (out / "runs").exists()


@pytest.mark.parametrize("kind", ["character device", "FIFO"])
def test_make_dataset_from_a_device_or_fifo_is_refused_unread(kind: str, tmp_path: Path) -> None:
    source = Path("/dev/zero")
    if kind == "FIFO":
        source = tmp_path / "cifar.tar.gz"
        os.mkfifo(source)  # no writer: reading it would block for good
    proc = run_cli("make-dataset", "--source", "cifar10", "--from", str(source),
                   "--out", str(tmp_path / "out"), timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (f"error: --from: {str(source)!r} is not a regular file; "
                                   "allowed: cifar-10-python.tar.gz or the folder "
                                   "cifar-10-batches-py")
