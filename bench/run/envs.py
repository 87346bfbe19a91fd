"""Framework environments: one virtualenv per family and variant, cached outside the repo.

Each family's requirements (`envs/<family>-<variant>.txt`, the top-level pins people edit)
are resolved once into a lock, `envs/<family>-<variant>.lock`: every transitive package
pinned, with the hashes of its files, for Python 3.11 on x86_64 Linux (`tools/lock_envs.py`
writes it; its header holds the hash of the requirements it came from, and
tests/test_envs.py fails when a requirements file changed but its lock did not). An
environment is installed from its lock with hash checking (`--require-hashes`): the same
files on every machine, whatever PyPI has published since.

An environment lives in `$MGBENCH_ENV_DIR` (default `~/.cache/mgbench/envs`) under a name
keyed by the hash of its lock (with the post-install script and the Python version), so a
fresh clone reuses it and a new lock gets a new one. It is built with uv when uv is
installed (`uv venv`, `uv pip install`: parallel downloads, a shared wheel cache) and with
venv and pip otherwise; `MGBENCH_INSTALLER=uv|pip` chooses. A stamp written after a
successful install makes setup idempotent; a half-built environment (no stamp) is rebuilt.
A variant with no lock (its requirements name a package index this project cannot reach), or
a Python other than the one the locks were resolved for, installs the requirements file as
before, and its records say it was not locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import REPO_ROOT
from bench.catalog.registry import FAMILIES
from bench.run.progress import BuildDisplay, clock_text

STAMP = ".mgbench-stamp"
FAILED = ".mgbench-failed"  # a post-install build that failed, with its reason
BUILD_INFO = ".mgbench-build.json"  # which lock, which installer, how long
LOCK_PYTHON = "3.11"  # what the locks are resolved for
LOCK_PLATFORM = "x86_64-manylinux_2_28"
LOCK_HEADER = re.compile(r"^# ([a-z][\w-]*): (.+)$")


class EnvError(RuntimeError):
    """An environment could not be created; the message says why."""


def python_for(spec: Any, pythons: dict[str, Any]) -> Any:
    """The run's interpreter: the user's (spec.python), or its family's from `pythons` (an
    EnvError there if building it failed)."""
    return interpreter_for(spec.family, spec.device, spec.python) if spec.python \
        else pythons.get(spec.family)


def env_root() -> Path:
    """Where environments are cached (`MGBENCH_ENV_DIR` overrides)."""
    override = os.environ.get("MGBENCH_ENV_DIR")
    if override:
        return Path(override).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "mgbench" / "envs"


# ---------------------------------------------------------------------------------------------
# Locks

def requirement_lines(text: str) -> list[str]:
    """A requirements file's requirements and options, without comments and blank lines (a
    comment changes nothing that is installed, so it does not make a lock stale)."""
    lines = (re.sub(r"(^|\s)#.*$", "", ln).strip() for ln in text.splitlines())
    return [ln for ln in lines if ln]


def requirements_digest(path: Path) -> str:
    """The hash of what a requirements file asks for (see requirement_lines)."""
    return hashlib.sha256("\n".join(requirement_lines(path.read_text())).encode()).hexdigest()


def lock_path(requirements: Path) -> Path:
    return requirements.with_suffix(".lock")


def lock_header(lock: Path) -> dict[str, str]:
    """The `# key: value` lines at the top of a lock."""
    found = {}
    for line in lock.read_text().splitlines():
        if not line.startswith("#"):
            break
        if m := LOCK_HEADER.match(line):
            found[m.group(1)] = m.group(2).strip()
    return found


def locked_packages(lock: Path) -> int:
    """How many packages a lock pins."""
    return sum(1 for ln in lock.read_text().splitlines() if re.match(r"^[A-Za-z0-9][^ ]*==", ln))


def other_index(requirements: Path) -> str | None:
    """The package index a requirements file names besides the registry, if any (PyTorch's
    CUDA builds come from their own; this project's machines cannot reach it, so those
    variants have no lock)."""
    for line in requirement_lines(requirements.read_text()):
        if m := re.match(r"^(?:--extra-index-url|--index-url|-i)[=\s]+(\S+)", line):
            return m.group(1)
    return None


def lock_problem(requirements: Path) -> str | None:
    """Why a requirements file's lock is missing or stale; None if it is current, or if it
    is missing because the requirements name another index (other_index)."""
    lock = lock_path(requirements)
    rel = repo_relative(requirements)
    if not lock.exists():
        if other_index(requirements):
            return None
        return f"{repo_relative(lock)} is missing (python tools/lock_envs.py {requirements.stem})"
    recorded = lock_header(lock).get("requirements-sha256")
    if recorded != requirements_digest(requirements):
        return (f"{repo_relative(lock)} is stale: {rel} changed since it was locked "
                f"(python tools/lock_envs.py {requirements.stem})")
    return None


def repo_relative(path: Path) -> str:
    """A path for a message: relative to the repository where it lies inside it."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


# ---------------------------------------------------------------------------------------------
# Installers

def find_uv() -> Path | None:
    """uv's binary: the `uv` package's (requirements.txt), else one on PATH."""
    try:
        import uv

        found = Path(uv.find_uv_bin())
        if found.exists():
            return found
    except (ImportError, FileNotFoundError, AttributeError):
        pass
    which = shutil.which("uv")
    return Path(which) if which else None


def installer() -> tuple[str, Path | None]:
    """("uv", its binary) or ("pip", None): MGBENCH_INSTALLER=uv|pip, else uv if installed."""
    choice = os.environ.get("MGBENCH_INSTALLER", "auto").lower()
    if choice not in ("auto", "uv", "pip"):
        raise EnvError(f"MGBENCH_INSTALLER={choice!r} is not allowed; allowed: auto, uv, pip")
    uv = find_uv() if choice != "pip" else None
    if choice == "uv" and uv is None:
        raise EnvError("MGBENCH_INSTALLER=uv but uv is not installed (pip install uv)")
    return ("uv", uv) if uv else ("pip", None)


def pip_find_links() -> list[str]:
    """The find-links locations pip is configured with (PIP_FIND_LINKS, pip.conf). uv reads
    no pip configuration, so the lock tool and the uv installer pass them on: a wheel that
    only lies in such a folder (this project's machines keep PyTorch's CPU build in one) is
    then seen by both installers, and the hashes in the lock say which file is right."""
    found: list[str] = []
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                             capture_output=True, text=True, errors="replace", timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    values = [os.environ.get("PIP_FIND_LINKS", "")]
    values += [m.group(1) for m in re.finditer(r"^\S*\.find-links='(.*)'$", out, re.MULTILINE)]
    for value in values:
        for item in value.split():
            if item not in found:
                found.append(item)
    return found


# ---------------------------------------------------------------------------------------------
# Environments

@dataclass(frozen=True)
class FamilyEnv:
    """One family's environment for one variant (cpu or gpu)."""

    family: str
    variant: str
    requirements: Path
    key: str
    lock: Path | None = None  # None: no lock, installed from the requirements file

    @property
    def path(self) -> Path:
        return env_root() / f"{self.family}-{self.variant}-{self.key}"

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def source(self) -> Path:
        """What is installed: the lock, or the requirements file where there is none."""
        return self.lock or self.requirements

    @property
    def ready(self) -> bool:
        stamp = self.path / STAMP
        return self.python.exists() and stamp.exists() and stamp.read_text().strip() == self.key

    def lock_record(self) -> dict[str, Any]:
        """What a record says of the environment's lock: its file and hash, whether it was a
        lock at all, and (once built) the installer that built it."""
        info: dict[str, Any] = {
            "file": repo_relative(self.source),
            "sha256": hashlib.sha256(self.source.read_bytes()).hexdigest(),
            "locked": self.lock is not None,
            "env_key": self.key,
        }
        with contextlib.suppress(OSError, ValueError):
            info["installer"] = json.loads((self.path / BUILD_INFO).read_text()).get("installer")
        return info


def family_env(family: str, variant: str) -> FamilyEnv:
    """The environment for a family and variant, whether or not it exists yet."""
    fam = FAMILIES[family]
    if variant not in fam.requirements:
        raise EnvError(f"family {family!r} has no {variant!r} variant; it has "
                       f"{', '.join(fam.requirements)}")
    req = REPO_ROOT / fam.requirements[variant]
    lock: Path | None = lock_path(req)
    # a lock holds what was resolved for one Python: another installs the requirements
    if not lock.exists() or lock_header(lock).get("python") not in (None, _python()):
        lock = None
    digest = hashlib.sha256((lock or req).read_bytes())
    if fam.post_install:
        digest.update((REPO_ROOT / fam.post_install).read_bytes())
    digest.update(f"{sys.version_info.major}.{sys.version_info.minor}".encode())
    return FamilyEnv(family, variant, req, digest.hexdigest()[:12], lock)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise setup of one environment across processes (CI, tests, two sweeps)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def install_commands(env: FamilyEnv, tool: str, uv: Path | None) -> list[list[str]]:
    """The commands that make the virtualenv and install its lock (or requirements) into it."""
    hashes = ["--require-hashes"] if env.lock else []
    if tool == "uv":
        assert uv is not None
        links = [arg for item in pip_find_links() for arg in ("--find-links", item)]
        return [[str(uv), "venv", "--python", sys.executable, str(env.path)],
                # --compile-bytecode: pip compiles at install, uv does not; without it every
                # run recompiles the framework's modules on import wherever Python may not
                # write bytecode (PYTHONDONTWRITEBYTECODE, a read-only environment)
                [str(uv), "pip", "install", "--python", str(env.python), "--compile-bytecode",
                 *hashes, "-r", str(env.source), *links]]
    return [[sys.executable, "-m", "venv", str(env.path)],
            [str(env.python), "-m", "pip", "install", "--progress-bar", "off", *hashes,
             "-r", str(env.source)]]


def cached_failure(env: FamilyEnv, family: str) -> str | None:
    """The reason a post-install build failed, kept in the environment folder (FAILED) so that
    sweeps say it at once instead of rebuilding for minutes; None when there is none."""
    failed = env.path / FAILED
    try:
        if not failed.is_file():
            return None
        with open(failed, "rb") as fh:  # a reason is a few lines: read a bounded prefix
            said = fh.read(2000).decode(errors="replace").strip()
    except OSError:
        return None
    return f"{said} (cached; `run_bench.py setup {family}` retries)"


def ensure_env(family: str, variant: str, *, quiet: bool = False,
               retry: bool = False) -> FamilyEnv:
    """Create the environment if it is missing or stale; return it ready to use.

    A post-install build that failed before is not retried (it can take many minutes): its
    reason is raised again, unless `retry` (what `run_bench.py setup` asks for). Progress goes
    to bench/run/progress.py (a live display on a terminal, plain lines elsewhere); every line of
    the installers' output to `<env>.log` beside the environment."""
    env = family_env(family, variant)
    if env.ready:
        return env
    with _locked(env.path.with_suffix(".lock")):
        if env.ready:  # another process built it while we waited
            return env
        if not retry and (why := cached_failure(env, family)):
            raise EnvError(why)
        tool, uv = installer()
        name = f"{family}-{variant}"
        packages = locked_packages(env.lock) if env.lock else None
        log_path = env.path.with_suffix(".log")
        t0 = time.monotonic()
        with BuildDisplay(name, log_path, quiet=quiet, packages=packages) as show:
            show.installer = tool
            show.say(f"[setup] {name}: creating {env.path}")
            what = repo_relative(env.source) + (
                "" if env.lock else " (no lock for this variant and "
                f"Python {_python()}: unpinned dependencies)")
            show.say(f"[setup] {name}: installing {what} with {tool} "
                     "(first time only; framework wheels are large)")
            if env.path.exists():
                shutil.rmtree(env.path)
            make_venv, install = install_commands(env, tool, uv)
            show.step("venv")
            _run(make_venv, show)
            show.step("resolve")
            _run(install, show)
            post = FAMILIES[family].post_install
            if post:
                show.say(f"[setup] {name}: running {post} (a source build; can take minutes)")
                show.step("build", post)
                try:
                    _run([str(env.python), str(REPO_ROOT / post), variant], show,
                         all_lines=True)
                except EnvError as exc:
                    (env.path / FAILED).write_text(str(exc) + "\n")
                    raise
            show.step("done")
            (env.path / BUILD_INFO).write_text(json.dumps({
                "installer": _installer_version(tool, uv, env), "source": repo_relative(env.source),
                "sha256": hashlib.sha256(env.source.read_bytes()).hexdigest(),
                "seconds": round(time.monotonic() - t0, 1)}, indent=1) + "\n")
            (env.path / STAMP).write_text(env.key + "\n")
            took = clock_text(time.monotonic() - t0)
            summary = "; ".join(filter(None, [f"in {took}", show.state.summary()]))
            show.say(f"[setup] {name}: ready" + (f" ({summary})" if show.live else ""))
    return env


def _python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def _installer_version(tool: str, uv: Path | None, env: FamilyEnv) -> str:
    cmd = [str(uv), "--version"] if tool == "uv" else [str(env.python), "-m", "pip", "--version"]
    with contextlib.suppress(OSError, subprocess.SubprocessError, IndexError):
        out = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                             timeout=60).stdout.split()
        return f"{out[0]} {out[1]}"
    return tool


def _run(cmd: list[str], show: BuildDisplay, all_lines: bool = False) -> None:
    """Run an install step, its output to the display (and the log); raise EnvError with the
    reason (install_reason; a build script's last line)."""
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace")
    except OSError as exc:
        raise EnvError(f"{' '.join(cmd[:4])} ... cannot start: {exc}") from exc
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        tail = (tail + [line.rstrip()])[-20:]
        show.line(line, all_lines)
    if proc.wait() != 0:
        last = next((t.strip() for t in reversed(tail) if t.strip()), "no output")
        reason = last if all_lines else install_reason(tail) or last
        raise EnvError(f"{' '.join(cmd[:4])} ... failed (exit {proc.returncode}): {reason}")


def install_reason(lines: list[str]) -> str | None:
    """Why pip or uv failed, from the end of its output: pip's first `ERROR:` line (a hash
    mismatch, no such version), uv's `error:` line with its innermost cause."""
    errors = [ln.strip() for ln in lines if ln.strip().startswith(("ERROR:", "error:"))]
    causes = [ln.strip() for ln in lines
              if ln.strip().startswith(("Caused by:", "cause:"))]
    if not errors:
        return None
    return (errors[0] + (f" ({causes[-1]})" if causes else ""))[:400]


def interpreter_for(family: str, variant: str, override: str | None = None) -> Path | None:
    """The Python to run a family's runners with, or None if its environment is not ready."""
    if override:
        return Path(override).expanduser()
    env = family_env(family, variant)
    return env.python if env.ready else None
