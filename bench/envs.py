"""Framework environments: one virtualenv per family and variant, cached outside the repo.

An environment lives in `$MGBENCH_ENV_DIR` (default `~/.cache/mgbench/envs`) under a name
keyed by a hash of its requirements file and the Python version, so a fresh clone reuses it
and a changed requirements file gets a new one. A stamp written after a successful install
makes setup idempotent; a half-built environment (no stamp) is rebuilt.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench import REPO_ROOT
from bench.registry import FAMILIES

STAMP = ".mgbench-stamp"
FAILED = ".mgbench-failed"  # a post-install build that failed, with its reason
PROGRESS = ("Collecting", "Downloading", "Building", "Installing", "Successfully", "ERROR")


class EnvError(RuntimeError):
    """An environment could not be created; the message says why."""


def env_root() -> Path:
    """Where environments are cached (`MGBENCH_ENV_DIR` overrides)."""
    override = os.environ.get("MGBENCH_ENV_DIR")
    if override:
        return Path(override).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "mgbench" / "envs"


@dataclass(frozen=True)
class FamilyEnv:
    """One family's environment for one variant (cpu or gpu)."""

    family: str
    variant: str
    requirements: Path
    key: str

    @property
    def path(self) -> Path:
        return env_root() / f"{self.family}-{self.variant}-{self.key}"

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    @property
    def ready(self) -> bool:
        stamp = self.path / STAMP
        return self.python.exists() and stamp.exists() and stamp.read_text().strip() == self.key


def family_env(family: str, variant: str) -> FamilyEnv:
    """The environment for a family and variant, whether or not it exists yet."""
    fam = FAMILIES[family]
    if variant not in fam.requirements:
        raise EnvError(f"family {family!r} has no {variant!r} variant; it has "
                       f"{', '.join(fam.requirements)}")
    req = REPO_ROOT / fam.requirements[variant]
    digest = hashlib.sha256(req.read_bytes())
    if fam.post_install:
        digest.update((REPO_ROOT / fam.post_install).read_bytes())
    digest.update(f"{sys.version_info.major}.{sys.version_info.minor}".encode())
    return FamilyEnv(family, variant, req, digest.hexdigest()[:12])


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


def ensure_env(family: str, variant: str, *, quiet: bool = False,
               retry: bool = False) -> FamilyEnv:
    """Create the environment if it is missing or stale; return it ready to use.

    A post-install build that failed before is not retried (it can take many minutes): its
    reason is raised again, unless `retry` (what `run_bench.py setup` asks for)."""
    env = family_env(family, variant)
    if env.ready:
        return env
    with _locked(env.path.with_suffix(".lock")):
        if env.ready:  # another process built it while we waited
            return env
        failed = env.path / FAILED
        if failed.exists() and not retry:
            raise EnvError(f"{failed.read_text().strip()} (cached; `run_bench.py setup "
                           f"{family}` retries)")
        say = (lambda *_: None) if quiet else (lambda msg: print(msg, flush=True))
        say(f"[setup] {family}-{variant}: creating {env.path}")
        say(f"[setup] {family}-{variant}: installing {FAMILIES[family].requirements[variant]} "
            "(first time only; framework wheels are large)")
        if env.path.exists():
            shutil.rmtree(env.path)
        _run([sys.executable, "-m", "venv", str(env.path)], quiet)
        _run([str(env.python), "-m", "pip", "install", "--progress-bar", "off",
              "-r", str(env.requirements)], quiet)
        post = FAMILIES[family].post_install
        if post:
            say(f"[setup] {family}-{variant}: running {post} (a source build; can take minutes)")
            try:
                _run([str(env.python), str(REPO_ROOT / post), variant], quiet, all_lines=True)
            except EnvError as exc:
                failed.write_text(str(exc) + "\n")
                raise
        (env.path / STAMP).write_text(env.key + "\n")
        say(f"[setup] {family}-{variant}: ready")
    return env


def _run(cmd: list[str], quiet: bool, all_lines: bool = False) -> None:
    """Run an install step; stream its output (progress lines only unless all_lines) unless
    quiet; raise EnvError with its last line."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        tail = (tail + [line.rstrip()])[-20:]
        if not quiet and (all_lines or line.startswith(PROGRESS)):
            print(f"    {line.rstrip()}", flush=True)
    if proc.wait() != 0:
        reason = next((t for t in reversed(tail) if t.strip()), "no output")
        raise EnvError(f"{' '.join(cmd[:4])} ... failed (exit {proc.returncode}): {reason}")


def interpreter_for(family: str, variant: str, override: str | None = None) -> Path | None:
    """The Python to run a family's runners with, or None if its environment is not ready."""
    if override:
        return Path(override).expanduser()
    env = family_env(family, variant)
    return env.python if env.ready else None
