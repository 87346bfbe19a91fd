"""The sweep's exit status a CI acts on (docs/CI.md): 0 when no run's status is one of --fail-on
(default failed, timeout, oom, invalid), 3 when one is, the last line naming what decided; a bad
--fail-on is one line, exit 2, before anything runs. Real sweeps of the toy runner."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.junit import assert_valid_junit
from tests.helpers.toy import config, toy


def last_line(proc) -> str:  # noqa: ANN001
    return proc.stdout.strip().splitlines()[-1]


def test_all_runs_ok_exit_0_and_say_why(tmp_path: Path) -> None:
    proc = toy("--config", str(config(tmp_path)), "--out", str(tmp_path / "ok"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert last_line(proc) == ("exit 0: runs: 2 ok; none counts as a failure (--fail-on "
                               "failed,timeout,oom,invalid)")


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """A sweep whose 2 runs crash (status failed)."""
    tmp = tmp_path_factory.mktemp("crash")
    return tmp, toy("--config", str(config(tmp, "crash")), "--out", str(tmp / "out"))


def test_a_failed_run_exits_3_naming_it(crashed: tuple[Path, object]) -> None:
    _, proc = crashed
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert last_line(proc) == (
        "exit 3: runs: 2 failed; failing (--fail-on failed,timeout,oom,invalid): "
        "toy__probe__n1__b8__synthetic__fp32__r0; toy__probe__n2__b8__synthetic__fp32__r0")
    assert "Traceback" not in proc.stderr
    assert_valid_junit(crashed[0] / "out" / "junit.xml")  # the failures, as a CI reads them


def test_fail_on_chooses_the_statuses(crashed: tuple[Path, object]) -> None:
    tmp, _ = crashed
    out = str(tmp / "out")
    # the report of the same folder again (--resume: nothing left to run), judged otherwise
    kept = toy("--config", str(config(tmp, "crash")), "--out", out, "--resume",
               "--fail-on", "timeout,unavailable")
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert last_line(kept).startswith("exit 0: runs: 2 failed; none counts as a failure "
                                      "(--fail-on timeout,unavailable)")
    none = toy("--config", str(config(tmp, "crash")), "--out", out, "--resume",
               "--fail-on", "none")
    assert none.returncode == 0 and "(--fail-on none)" in last_line(none)


def test_unavailable_fails_only_when_asked(tmp_path: Path) -> None:
    cfg = config(tmp_path, options={"python": str(tmp_path / "no-such-python")})
    default = toy("--config", str(cfg), "--out", str(tmp_path / "a"))
    assert default.returncode == 0, default.stdout + default.stderr
    assert "2 unavailable; none counts" in last_line(default)
    asked = toy("--config", str(cfg), "--out", str(tmp_path / "b"), "--fail-on",
                "failed,unavailable")
    assert asked.returncode == 3 and "failing (--fail-on failed,unavailable)" in last_line(asked)


@pytest.mark.parametrize("value", ["failed,bogus", "", "failed,failed", "none,failed"])
def test_a_bad_fail_on_is_one_line_exit_2(value: str, tmp_path: Path) -> None:
    proc = toy("--config", str(config(tmp_path)), "--out", str(tmp_path / "x"), "--fail-on",
               value)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "--fail-on" in proc.stderr
    assert "allowed: none, or one or more of failed, timeout, oom, invalid" in proc.stderr
    assert not (tmp_path / "x").exists()
