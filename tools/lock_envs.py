"""Resolve each family's requirements into a lock: every transitive package pinned, with the
hashes of its files, for Python 3.11 on x86_64 Linux (bench/run/envs.py installs environments from
these locks with `--require-hashes`).

    python tools/lock_envs.py                 # every family and variant
    python tools/lock_envs.py tf torch-cpu    # a family (both variants) or one variant
    python tools/lock_envs.py --upgrade tf    # newest versions of the unpinned dependencies
    python tools/lock_envs.py --check         # exit 1 if a lock is missing or stale

It runs `uv pip compile --generate-hashes --python-version 3.11 --python-platform
x86_64-manylinux_2_28` (uv from requirements.txt) on `envs/<family>-<variant>.txt` and writes
`envs/<family>-<variant>.lock` with a header holding the hash of the requirements it came from
(comments and blank lines aside), so tests/test_envs.py can tell a stale lock. Without
--upgrade the existing lock's pins are kept where the requirements still allow them, so a
small change to a requirements file changes little else. pip's find-links folders are passed
on to uv (it reads no pip configuration): this project's machines keep PyTorch's CPU build in
one. A variant whose requirements name an index that cannot be reached is reported and left
without a lock (bench/run/envs.py then installs it from the requirements file, unpinned).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import REPO_ROOT
from bench.catalog.registry import FAMILIES
from bench.run.envs import (
    LOCK_PLATFORM,
    LOCK_PYTHON,
    find_uv,
    lock_header,
    lock_path,
    lock_problem,
    locked_packages,
    other_index,
    pip_find_links,
    requirements_digest,
)


def targets(names: list[str]) -> list[Path]:
    """The requirements files named (a family: both variants; `family-variant`: one)."""
    every = {f"{fam.name}-{variant}": REPO_ROOT / req
             for fam in FAMILIES.values() for variant, req in fam.requirements.items()}
    if not names:
        return list(every.values())
    chosen = []
    for name in names:
        found = [p for key, p in every.items() if name in (key, key.rsplit("-", 1)[0])]
        if not found:
            raise SystemExit(f"error: {name!r} is not allowed; allowed: "
                             f"{', '.join(sorted({*FAMILIES, *every}))}")
        chosen += [p for p in found if p not in chosen]
    return chosen


def header(req: Path, resolver: str) -> str:
    rel = req.relative_to(REPO_ROOT)
    return (f"# mgbench lock of {rel}: every package it needs, pinned, with the hashes of its\n"
            f"# files. Written by tools/lock_envs.py; do not edit. After changing {rel} run\n"
            f"# `python tools/lock_envs.py {req.stem}` (tests/test_envs.py fails until then).\n"
            f"# requirements-sha256: {requirements_digest(req)}\n"
            f"# python: {LOCK_PYTHON}\n"
            f"# platform: {LOCK_PLATFORM}\n"
            f"# resolver: {resolver} pip compile --generate-hashes\n")


def compile_lock(req: Path, uv: Path, upgrade: bool = False) -> str | None:
    """Write req's lock; None, or why it could not be resolved."""
    lock = lock_path(req)
    links = [arg for item in pip_find_links() for arg in ("--find-links", item)]
    resolver = subprocess.run([str(uv), "--version"], capture_output=True, text=True,
                              check=True).stdout.split()[:2]
    with tempfile.TemporaryDirectory(prefix="mgbench-lock-") as tmp:
        out = Path(tmp) / lock.name
        if lock.exists() and not upgrade:  # uv keeps an existing output file's pins
            out.write_text(lock.read_text())
        cmd = [str(uv), "pip", "compile", str(req.relative_to(REPO_ROOT)), "--generate-hashes",
               "--python-version", LOCK_PYTHON, "--python-platform", LOCK_PLATFORM,
               "--no-header", "--quiet", "-o", str(out), *links]
        if upgrade:
            cmd.append("--upgrade")
        done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            lines = [ln.strip() for ln in (done.stderr or done.stdout).splitlines() if ln.strip()]
            picked = dict.fromkeys(lines[:2] + lines[-1:])  # what failed, where, and why
            return " / ".join(picked) or f"exit {done.returncode}"
        lock.write_text(header(req, " ".join(resolver)) + out.read_text())
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools/lock_envs.py", description=__doc__.split("\n\n")[0])
    p.add_argument("names", nargs="*", help="families (tf) or variants (tf-cpu); default all")
    p.add_argument("--check", action="store_true", help="only say which locks are missing or "
                   "stale (exit 1 if any)")
    p.add_argument("--upgrade", action="store_true",
                   help="resolve afresh instead of keeping the existing lock's pins")
    args = p.parse_args(argv)
    reqs = targets(args.names)
    if args.check:
        problems = [why for req in reqs if (why := lock_problem(req))]
        for why in problems:
            print(why)
        unlocked = [req for req in reqs if not lock_path(req).exists() and other_index(req)]
        for req in unlocked:
            print(f"{req.stem}: no lock (its requirements name {other_index(req)}); installed "
                  "from the requirements file")
        if not problems:
            print(f"{len(reqs) - len(unlocked)} locks current")
        return 1 if problems else 0
    uv = find_uv()
    if uv is None:
        print("error: uv is not installed (python -m pip install -r requirements.txt)",
              file=sys.stderr)
        return 2
    failed = 0
    for req in reqs:
        why = compile_lock(req, uv, args.upgrade)
        lock = lock_path(req)
        if why:
            failed += 1
            print(f"{req.stem}: NOT locked: {why}", file=sys.stderr)
        else:
            print(f"{req.stem}: {lock.relative_to(REPO_ROOT)} ({locked_packages(lock)} packages, "
                  f"requirements {lock_header(lock)['requirements-sha256'][:12]})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
