"""Environments: cached outside the repo, keyed by the requirements' hash, built once."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import envs
from bench.registry import FAMILIES, Family


@pytest.fixture
def empty_family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    req = tmp_path / "empty-cpu.txt"
    req.write_text("# nothing to install\n")
    monkeypatch.setitem(FAMILIES, "empty", Family("empty", "test family", {"cpu": str(req)}))
    monkeypatch.setenv("MGBENCH_ENV_DIR", str(tmp_path / "cache"))
    return req


def test_env_root_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MGBENCH_ENV_DIR", str(tmp_path))
    assert envs.env_root() == tmp_path
    monkeypatch.delenv("MGBENCH_ENV_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert envs.env_root() == tmp_path / "xdg" / "mgbench" / "envs"


def test_key_follows_requirements(empty_family: Path) -> None:
    first = envs.family_env("empty", "cpu")
    assert first.path.parent == envs.env_root() and not first.ready
    empty_family.write_text("# changed\n")
    assert envs.family_env("empty", "cpu").key != first.key


def test_unknown_variant(empty_family: Path) -> None:
    with pytest.raises(envs.EnvError, match="no 'gpu' variant"):
        envs.family_env("empty", "gpu")


def test_ensure_env_builds_once_and_rebuilds_half_built(empty_family: Path) -> None:
    env = envs.ensure_env("empty", "cpu", quiet=True)
    assert env.ready and env.python.exists()
    stamp = env.path / envs.STAMP
    mtime = stamp.stat().st_mtime_ns
    assert envs.ensure_env("empty", "cpu", quiet=True).path == env.path
    assert stamp.stat().st_mtime_ns == mtime  # not rebuilt
    stamp.unlink()  # as if an install had been interrupted
    assert not envs.family_env("empty", "cpu").ready
    assert envs.ensure_env("empty", "cpu", quiet=True).ready
    assert envs.interpreter_for("empty", "cpu") == env.python
    assert envs.interpreter_for("empty", "cpu", "/my/python") == Path("/my/python")


def test_failed_install_says_why(empty_family: Path) -> None:
    empty_family.write_text("this-package-does-not-exist-anywhere==0.0.0\n")
    with pytest.raises(envs.EnvError, match="failed"):
        envs.ensure_env("empty", "cpu", quiet=True)
    assert not envs.family_env("empty", "cpu").ready


@pytest.mark.slow  # three virtualenvs
def test_post_install_runs_and_a_failure_is_cached(empty_family: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "build.py"
    script.write_text("import sys, pathlib\n"
                      "pathlib.Path(sys.prefix, 'built').write_text(sys.argv[1])\n")
    monkeypatch.setitem(FAMILIES, "empty", Family("empty", "test family",
                                                  {"cpu": str(empty_family)}, str(script)))
    env = envs.ensure_env("empty", "cpu", quiet=True)
    assert (env.path / "built").read_text() == "cpu"

    script.write_text("print('compiling'); print('error: C++17 needed'); raise SystemExit(1)\n")
    failed = envs.family_env("empty", "cpu")
    assert failed.key != env.key  # the build script is part of the key
    with pytest.raises(envs.EnvError, match="C\\+\\+17 needed"):
        envs.ensure_env("empty", "cpu", quiet=True)
    script.write_text("")  # would succeed now, but the same key's failure is cached ...
    monkeypatch.setattr(envs, "family_env", lambda *_: failed)
    with pytest.raises(envs.EnvError, match="cached"):
        envs.ensure_env("empty", "cpu", quiet=True)
    assert envs.ensure_env("empty", "cpu", quiet=True, retry=True).ready  # ... until a retry
