"""tools/gpu_oneshot.sh, the one-shot GPU check for a machine without a registry, run here on CPU:
it installs the carried wheels on PYTHONPATH, runs each config with the torch and jax runners in
the given Python (here the harness's own, which holds no torch: the run is unavailable naming
it), and packs the results folders with a manifest into one archive; bad arguments are one
line, exit 2; wheels that do not install, exit 1."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.helpers.cli import REPO

TOOL = REPO / "tools" / "gpu_oneshot.sh"
CONFIG = ("name: oneshot-cpu\nrunners: [torch_ddp]\nmodels: [small_cnn]\ndevices: [1]\n"
          "batch_size_per_device: 8\ndevice: cpu\nwarmup_steps: 1\nmeasure_steps: 2\n"
          "timeout_s: 120\n")


def wheel(folder: Path, name: str = "oneshot_carried") -> Path:
    """A real (pure-Python) wheel of one module, as pip download would save one."""
    path = folder / f"{name}-1.0-py3-none-any.whl"
    info = f"{name}-1.0.dist-info"
    files = {f"{name}.py": "CARRIED = True\n",
             f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for arc, text in files.items():
            z.writestr(arc, text)
    return path


def oneshot(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(TOOL), *args], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_the_oneshot_check_packs_the_sweeps_run_in_the_given_python(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel(wheels)
    config = tmp_path / "cpu.yaml"
    config.write_text(CONFIG)
    archive = tmp_path / "out.tar.gz"
    proc = oneshot(sys.executable, str(wheels), str(archive), str(config))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        (manifest,) = [n for n in names if n.endswith("/MANIFEST.txt")]
        text = tar.extractfile(manifest).read().decode()  # type: ignore[union-attr]
        (record,) = [n for n in names if n.endswith("__r0.json")]
        rec = tar.extractfile(record).read().decode()  # type: ignore[union-attr]
    assert "wheels: oneshot_carried-1.0-py3-none-any.whl" in text
    assert "sweep: cpu.yaml exit 0 -> oneshot-" in text
    assert {n.rsplit("/", 1)[-1] for n in names} >= {"report.html", "results.md", "junit.xml"}
    # torch_ddp ran in the given interpreter (runner_options.torch_ddp.python), which has no torch
    assert '"status": "unavailable"' in rec and f"{sys.executable}" in rec


def test_bad_arguments_are_one_line_exit_2(tmp_path: Path) -> None:
    for args, words in ((["/no/python", str(tmp_path), str(tmp_path / "a.tar.gz")], "PYTHON"),
                        ([sys.executable, str(tmp_path / "none"), str(tmp_path / "a.tar.gz")],
                         "WHEELS"),
                        ([sys.executable, str(tmp_path), str(tmp_path / "a.zip")], "ARCHIVE"),
                        ([sys.executable, str(tmp_path), str(tmp_path / "a.tar.gz"),
                          str(tmp_path / "missing.yaml")], "CONFIG")):
        proc = oneshot(*args)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith(f"gpu_oneshot: {words}:"), proc.stderr


def test_wheels_that_do_not_install_stop_it_before_any_run(tmp_path: Path) -> None:
    (tmp_path / "broken-1.0-py3-none-any.whl").write_text("not a zip")
    proc = oneshot(sys.executable, str(tmp_path), str(tmp_path / "a.tar.gz"))
    assert proc.returncode == 1 and "did not install" in proc.stderr, proc.stderr
    assert not (tmp_path / "a.tar.gz").exists()
