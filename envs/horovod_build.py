"""Build Horovod 0.28.1 from source into the running interpreter's environment.

Run by `bench/envs.py` after `pip install -r envs/horovod-<variant>.txt`, with the
environment's interpreter and the variant (`cpu` | `gpu`) as argv[1]. Why each step exists:

- Download the source distribution (`--no-binary :all:`): Horovod publishes no wheels, and the
  sources need a patch before they build, so pip cannot install it in one go. The download is
  locked like the requirements (envs/horovod-<variant>.lock): pip checks the archive against
  its sha256 (`SDIST_SHA256`, `--require-hashes`), so the same sources are built everywhere.
- Raise the C++ standard from 14 to 17 in the top-level CMakeLists.txt and in
  horovod/torch/CMakeLists.txt: PyTorch 2.x headers use C++17 (`if constexpr`, `std::optional`
  and friends) and do not compile as C++14. A missing pattern fails loudly: a silently
  unpatched file would fail twenty minutes later with a less helpful compiler error.
- `pip install --no-build-isolation --no-deps`: build against the torch already in this
  environment (an isolated build would fetch another torch, and Horovod's extension is tied to
  the exact torch it was compiled with); its Python requirements are in the requirements file.
- HOROVOD_WITH_PYTORCH / _WITHOUT_TENSORFLOW / _WITHOUT_MXNET / _WITHOUT_MPI / _WITH_GLOO: only
  the PyTorch binding, with gloo as the controller (horovodrun --gloo; no MPI installed); a
  requested-but-missing piece then stops the build instead of being skipped. The GPU variant
  adds HOROVOD_GPU_OPERATIONS=NCCL (it needs nvcc and NCCL on the host).
- The environment's bin/ goes first on PATH: setup.py runs `cmake` from PATH, and the pip
  wheel's CMake is the one pinned (the host's may be missing or too old).
- MAKEFLAGS=-j<cores>: setup.py otherwise runs make -j8 whatever the machine has.
- On failure the last line names the compiler's first error, which the harness records as
  the reason (bench/envs.py keeps an output's last line).
- Verify: `import horovod.torch; hvd.init()` in one process, a two-rank allreduce through
  `horovodrun --gloo`, and that horovodrun sits next to the interpreter (the harness starts
  runs with it).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

VERSION = "0.28.1"
# sha256 of horovod-0.28.1.tar.gz, as the registry's index lists it.
SDIST_SHA256 = "92a43f5a94c43907a56805bad15f19700c62ffc83b7ca483f9e104e229f67ef0"
CMAKE_FILES = ("CMakeLists.txt", "horovod/torch/CMakeLists.txt")
CXX14 = re.compile(r"set\(\s*CMAKE_CXX_STANDARD\s+14\s*\)")
COMPILER_ERROR = re.compile(r"^\S+:\d+(:\d+)?: (fatal )?error: ")
PIP_NOISE = ("subprocess-exited-with-error", "metadata-generation-failed",
             "legacy-install-failure", "failed-wheel-build")
VERIFY_ALLREDUCE = (
    "import torch, horovod.torch as hvd; hvd.init(); "
    "s = hvd.allreduce(torch.ones(1), op=hvd.Sum).item(); "
    "assert s == hvd.size() == 2, (s, hvd.size()); print('allreduce ok on', hvd.size(), 'ranks')"
)


class BuildError(RuntimeError):
    """The build cannot go on; the message is the one-line reason."""


def patch_cxx_standard(text: str, name: str = "CMakeLists.txt") -> str:
    """Text with every `set(CMAKE_CXX_STANDARD 14)` raised to 17; BuildError if there is none."""
    patched, count = CXX14.subn("set(CMAKE_CXX_STANDARD 17)", text)
    if count == 0:
        raise BuildError(f"{name}: no 'set(CMAKE_CXX_STANDARD 14)' to raise to 17 (did Horovod "
                         f"{VERSION}'s sources change?)")
    return patched


def patch_sources(src: Path) -> list[str]:
    """Raise the C++ standard in Horovod's CMake files; return the lines changed, for the log."""
    changed = []
    for rel in CMAKE_FILES:
        path = src / rel
        before = path.read_text()
        after = patch_cxx_standard(before, rel)
        path.write_text(after)
        pairs = zip(before.splitlines(), after.splitlines(), strict=True)
        changed += [f"{rel}:{i}: {old.strip()} -> {new.strip()}"
                    for i, (old, new) in enumerate(pairs, start=1) if old != new]
    return changed


def run(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> list[str]:
    """Run cmd, streaming its output; return the output lines. BuildError if it fails."""
    print(f"$ {' '.join(cmd)}", flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, cwd=cwd, errors="replace")
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        print(line, end="", flush=True)
        lines.append(line.rstrip())
    if proc.wait() != 0:
        raise BuildError(f"{' '.join(cmd[:5])} ... exit {proc.returncode}: "
                         f"{first_error(lines)}")
    return lines


def first_error(lines: list[str]) -> str:
    """The most telling error line of a build log: the compiler's first error, else CMake's,
    else any other error line pip did not write, else the last line."""
    for test in (COMPILER_ERROR.search,
                 lambda ln: "CMake Error" in ln,
                 lambda ln: "error:" in ln.lower() and not any(p in ln for p in PIP_NOISE)):
        found = next((ln.strip() for ln in lines if test(ln.strip())), None)
        if found:
            return found
    return next((ln.strip() for ln in reversed(lines) if ln.strip()), "no output")


def build_env(variant: str) -> dict[str, str]:
    """The environment for Horovod's setup.py: which bindings, how many make jobs, which cmake."""
    bindir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": os.pathsep.join([bindir, os.environ.get("PATH", "")]),
        "HOROVOD_WITH_PYTORCH": "1",
        "HOROVOD_WITHOUT_TENSORFLOW": "1",
        "HOROVOD_WITHOUT_MXNET": "1",
        "HOROVOD_WITHOUT_MPI": "1",
        "HOROVOD_WITH_GLOO": "1",
        "MAKEFLAGS": f"-j{os.cpu_count() or 1}",
    }
    if variant == "gpu":
        env["HOROVOD_GPU_OPERATIONS"] = "NCCL"
        env.setdefault("HOROVOD_NCCL_LINK", "SHARED")
    return env


def download(dest: Path) -> Path:
    """Fetch Horovod's source distribution (checked against SDIST_SHA256) and unpack it; return
    the source directory."""
    pinned = dest / "horovod-source.txt"
    pinned.write_text(f"horovod=={VERSION} --hash=sha256:{SDIST_SHA256}\n")
    run([sys.executable, "-m", "pip", "download", "-r", str(pinned), "--require-hashes",
         "--no-binary", ":all:", "--no-deps", "--no-build-isolation", "--progress-bar", "off",
         "-d", str(dest)])
    archive = dest / f"horovod-{VERSION}.tar.gz"
    if not archive.exists():
        raise BuildError(f"pip download left no {archive.name} in {dest}")
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    return dest / f"horovod-{VERSION}"


def verify(env: dict[str, str]) -> None:
    """Horovod imports and initialises, two gloo ranks allreduce, and horovodrun is in place."""
    horovodrun = Path(sys.executable).parent / "horovodrun"
    if not horovodrun.exists():
        raise BuildError(f"no horovodrun next to {sys.executable}")
    run([sys.executable, "-c", "import horovod, horovod.torch as hvd; hvd.init(); "
         "assert hvd.gloo_built(), 'gloo not built'; "
         "print('horovod', horovod.__version__, 'size', hvd.size())"])
    run([str(horovodrun), "-np", "2", "--gloo", "-H", "localhost:2", sys.executable, "-c",
         VERIFY_ALLREDUCE], env=env)


def build(variant: str) -> None:
    """Download, patch, build and install Horovod, then check that it works."""
    if variant not in ("cpu", "gpu"):
        raise BuildError(f"variant must be cpu or gpu, not {variant!r}")
    env = build_env(variant)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="horovod-build-") as tmp:
        src = download(Path(tmp))
        for change in patch_sources(src):
            print(f"[horovod_build] patched {change}", flush=True)
        print(f"[horovod_build] building with {env['MAKEFLAGS']} (takes minutes)", flush=True)
        run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-deps",
             "--no-cache-dir", "-v", str(src)], env=env)
    verify(env)
    print(f"[horovod_build] horovod {VERSION} ({variant}) built and verified in "
          f"{time.monotonic() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    try:
        build(sys.argv[1] if len(sys.argv) > 1 else "cpu")
    except BuildError as exc:
        # The last line is what the harness records as the reason.
        reason = re.sub(r"\S*/horovod-build-[^/\s]+/", "", str(exc)).replace("\n", " ")
        print(f"horovod {VERSION} build failed: {reason[:400]}", flush=True)
        sys.exit(1)
