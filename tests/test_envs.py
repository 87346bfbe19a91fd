"""Environments: locked (every pin, with hashes), cached outside the repo, keyed by the lock's
hash, built once, with uv or pip."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import pytest

from bench import REPO_ROOT
from bench.catalog.registry import FAMILIES, Family
from bench.run import envs
from tools import lock_envs

# pip's builds take 6-16 s each: slow where uv is there to run the same path in the fast set
INSTALLERS = [pytest.param("pip", marks=pytest.mark.slow) if envs.find_uv() else "pip"] + \
    (["uv"] if envs.find_uv() else [])


@pytest.fixture
def empty_family(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A family whose requirements and lock install nothing; returns the lock."""
    req = tmp_path / "empty-cpu.txt"
    req.write_text("# nothing to install\n")
    lock = tmp_path / "empty-cpu.lock"
    lock.write_text(f"# requirements-sha256: {envs.requirements_digest(req)}\n")
    monkeypatch.setitem(FAMILIES, "empty", Family("empty", "test family", {"cpu": str(req)}))
    monkeypatch.setenv("MGBENCH_ENV_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MGBENCH_PROGRESS", "plain")
    return lock


def make_wheel(folder: Path, name: str = "mgbench_tiny", version: str = "0.1") -> Path:
    """A real (tiny) wheel, so installs can be tested offline."""
    files = {
        f"{name}/__init__.py": "VALUE = 42\n",
        f"{name}-{version}.dist-info/METADATA":
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{name}-{version}.dist-info/WHEEL":
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = f"{name}-{version}.dist-info/RECORD"
    lines = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest())
        lines.append(f"{path},sha256={digest.decode().rstrip('=')},{len(text.encode())}")
    files[record] = "\n".join(lines + [f"{record},,"]) + "\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


def test_env_root_override(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MGBENCH_ENV_DIR", str(tmp_path))
    assert envs.env_root() == tmp_path
    monkeypatch.delenv("MGBENCH_ENV_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert envs.env_root() == tmp_path / "xdg" / "mgbench" / "envs"


def test_key_follows_the_lock(empty_family: Path) -> None:
    first = envs.family_env("empty", "cpu")
    assert first.path.parent == envs.env_root() and not first.ready
    assert first.lock == empty_family and first.source == empty_family
    empty_family.write_text(empty_family.read_text() + "# regenerated\n")
    assert envs.family_env("empty", "cpu").key != first.key


def test_without_a_lock_the_requirements_are_installed(empty_family: Path) -> None:
    req = empty_family.with_suffix(".txt")
    empty_family.unlink()
    env = envs.family_env("empty", "cpu")
    assert env.lock is None and env.source == req
    req.write_text("# changed\n")
    assert envs.family_env("empty", "cpu").key != env.key
    assert env.lock_record()["locked"] is False


def test_unknown_variant(empty_family: Path) -> None:
    with pytest.raises(envs.EnvError, match="no 'gpu' variant"):
        envs.family_env("empty", "gpu")


@pytest.mark.parametrize("tool", INSTALLERS)
def test_ensure_env_builds_once_and_rebuilds_half_built(
        empty_family: Path, tool: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MGBENCH_INSTALLER", tool)
    env = envs.ensure_env("empty", "cpu", quiet=True)
    assert env.ready and env.python.exists()
    assert env.lock_record()["installer"].startswith(tool)
    stamp = env.path / envs.STAMP
    mtime = stamp.stat().st_mtime_ns
    assert envs.ensure_env("empty", "cpu", quiet=True).path == env.path
    assert stamp.stat().st_mtime_ns == mtime  # not rebuilt
    stamp.unlink()  # as if an install had been interrupted
    assert not envs.family_env("empty", "cpu").ready
    assert envs.ensure_env("empty", "cpu", quiet=True).ready
    assert envs.interpreter_for("empty", "cpu") == env.python
    assert envs.interpreter_for("empty", "cpu", "/my/python") == Path("/my/python")
    assert env.path.with_suffix(".log").exists()  # every line of the installers' output


@pytest.mark.parametrize("tool", INSTALLERS)
def test_failed_install_says_why(empty_family: Path, tool: str,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MGBENCH_INSTALLER", tool)
    empty_family.write_text("this-package-does-not-exist-anywhere==0.0.0 "
                            f"--hash=sha256:{'0' * 64}\n")
    with pytest.raises(envs.EnvError, match="failed"):
        envs.ensure_env("empty", "cpu", quiet=True)
    assert not envs.family_env("empty", "cpu").ready


@pytest.mark.parametrize("tool", INSTALLERS)
def test_installs_from_the_lock_and_checks_hashes(empty_family: Path, tool: str,
                                                  tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The lock's files are installed only if their hashes match (offline: a local wheel)."""
    monkeypatch.setenv("MGBENCH_INSTALLER", tool)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    digest = hashlib.sha256(make_wheel(wheels).read_bytes()).hexdigest()
    empty_family.write_text(f"--no-index\n--find-links {wheels}\n"
                            f"mgbench-tiny==0.1 --hash=sha256:{digest}\n")
    env = envs.ensure_env("empty", "cpu", quiet=True)
    assert list(env.path.glob("lib/python*/site-packages/mgbench_tiny/__init__.py"))
    # compiled at install by either installer: a run never recompiles a framework on import
    # where Python may not write bytecode (PYTHONDONTWRITEBYTECODE)
    assert list(env.path.glob("lib/python*/site-packages/mgbench_tiny/__pycache__/*.pyc"))

    empty_family.write_text(f"--no-index\n--find-links {wheels}\n"
                            f"mgbench-tiny==0.1 --hash=sha256:{'0' * 64}\n")
    with pytest.raises(envs.EnvError, match="(?i)hash"):
        envs.ensure_env("empty", "cpu", quiet=True)
    # ... and a lock line without a hash is refused too (--require-hashes)
    empty_family.write_text(f"--no-index\n--find-links {wheels}\nmgbench-tiny==0.1\n")
    with pytest.raises(envs.EnvError, match="failed"):
        envs.ensure_env("empty", "cpu", quiet=True)


def test_plain_setup_prints_the_lines_it_always_did(
        empty_family: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MGBENCH_INSTALLER", INSTALLERS[-1])
    env = envs.ensure_env("empty", "cpu")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"[setup] empty-cpu: creating {env.path}"
    assert out[1].startswith(f"[setup] empty-cpu: installing {empty_family} with ")
    assert out[-1] == "[setup] empty-cpu: ready"


def test_installer_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MGBENCH_INSTALLER", "pip")
    assert envs.installer() == ("pip", None)
    monkeypatch.setenv("MGBENCH_INSTALLER", "conda")
    with pytest.raises(envs.EnvError, match="not allowed"):
        envs.installer()
    monkeypatch.setenv("MGBENCH_INSTALLER", "uv")
    monkeypatch.setattr(envs, "find_uv", lambda: None)
    with pytest.raises(envs.EnvError, match="uv is not installed"):
        envs.installer()
    monkeypatch.setenv("MGBENCH_INSTALLER", "auto")
    assert envs.installer() == ("pip", None)  # no uv: plain pip


def test_uv_is_handed_pips_find_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_FIND_LINKS", f"{tmp_path / 'a'} {tmp_path / 'b'}")
    links = envs.pip_find_links()
    assert links[:2] == [str(tmp_path / "a"), str(tmp_path / "b")]
    env = envs.FamilyEnv("x", "cpu", tmp_path / "x.txt", "k", tmp_path / "x.lock")
    make_venv, install = envs.install_commands(env, "uv", Path("/bin/uv"))
    assert install[:3] == ["/bin/uv", "pip", "install"] and "--require-hashes" in install
    assert install[install.index("--find-links") + 1] == str(tmp_path / "a")
    _, pip_install = envs.install_commands(env, "pip", None)
    assert pip_install[-3:] == ["--require-hashes", "-r", str(tmp_path / "x.lock")]


def test_comments_do_not_make_a_lock_stale(tmp_path: Path) -> None:
    req = tmp_path / "r.txt"
    req.write_text("# a family\nnumpy==2.4.6\n\n--extra-index-url https://x  # why\n")
    before = envs.requirements_digest(req)
    req.write_text("# the family, reworded\nnumpy==2.4.6   # pinned\n"
                   "--extra-index-url https://x\n")
    assert envs.requirements_digest(req) == before
    assert envs.other_index(req) == "https://x"
    req.write_text("numpy==2.4.5\n")
    assert envs.requirements_digest(req) != before


@pytest.mark.parametrize("req", sorted({REPO_ROOT / r for fam in FAMILIES.values()
                                        for r in fam.requirements.values()}),
                         ids=lambda p: p.stem)
def test_every_lock_is_current(req: Path) -> None:
    """A requirements file changed without regenerating its lock fails here:
    `python tools/lock_envs.py <family>-<variant>` (the lock's header holds the hash of the
    requirements it came from). Only a variant whose requirements name another package index
    (PyTorch's CUDA builds) may go without a lock."""
    problem = envs.lock_problem(req)
    assert problem is None, problem
    lock = envs.lock_path(req)
    if not lock.exists():
        assert envs.other_index(req), f"{lock.name} is missing"
        return
    header = envs.lock_header(lock)
    assert header["python"] == envs.LOCK_PYTHON and header["platform"] == envs.LOCK_PLATFORM
    # every package pinned, every pin hashed; the requirements' own pins all there
    blocks = lock.read_text().split("\n")
    pins = [ln.split(" ")[0] for ln in blocks if ln and not ln.startswith((" ", "#"))]
    assert pins and all("==" in p for p in pins)
    assert lock.read_text().count(" \\\n    --hash=sha256:") >= len(pins)
    names = {p.split("==")[0].lower().replace("_", "-") for p in pins}
    for line in envs.requirement_lines(req.read_text()):
        if not line.startswith("-"):
            name = line.split("==")[0].split("[")[0].lower().replace("_", "-")
            assert name in names, f"{req.name} pins {name}; {lock.name} has no such package"


def test_lock_tool_names_and_check() -> None:
    assert [p.name for p in lock_envs.targets(["tf"])] == ["tf-cpu.txt", "tf-gpu.txt"]
    assert [p.name for p in lock_envs.targets(["torch-cpu"])] == ["torch-cpu.txt"]
    with pytest.raises(SystemExit, match="not allowed"):
        lock_envs.targets(["tensorflow"])
    assert lock_envs.main(["--check"]) == 0


@pytest.mark.slow  # three virtualenvs
def test_post_install_runs_and_a_failure_is_cached(empty_family: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "build.py"
    script.write_text("import sys, pathlib\n"
                      "pathlib.Path(sys.prefix, 'built').write_text(sys.argv[1])\n")
    req = empty_family.with_suffix(".txt")
    monkeypatch.setitem(FAMILIES, "empty", Family("empty", "test family",
                                                  {"cpu": str(req)}, str(script)))
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
