"""Bounded input (issue 29, classes 3 and 6): what a user types or a file holds, however large,
deep or odd, ends in one line on stderr naming the key or option, exit 2, no traceback, in
seconds and without growing the parent: config files read to 1 MiB (a FIFO or a device
refused unread), YAML depth and alias expansion within a budget, --set keys and values
bounded, every numeric runner option in its range, predict's device counts in range, messages
quoting a short prefix of a value; and --out, the sweep's name, --detach and an emptied
`runners` refused before anything is made. Each behaviour runs the real CLI at least once
(tests/helpers/cli.py: run_cli); its other cases run bench.cli.main in this process
(main_here)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bench.catalog.registry import COMMON_OPTIONS, PIPELINES, PROBES, RUNNERS
from bench.plan.config import MAX_YAML_DEPTH, ConfigError, json_schema, load_config
from tests.helpers.cli import REPO, main_here, run_cli
from tests.helpers.records import gpu_record, write_folder

SMOKE = {"name": "bounded", "runners": ["tf_mirrored"], "models": ["minigooglenet"],
         "devices": [1, 2], "batch_size_per_device": 8, "device": "cpu"}
MEMORY_LIMIT = 1 << 30  # the CLI's address space in the memory-bound cases (a dry run: ~300 MB)


def one_line(proc: subprocess.CompletedProcess[str], *words: str) -> str:
    """The single stderr line of a refused command (exit 2, no traceback), holding words."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert len(lines) == 1, proc.stderr[-3000:]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def cli_bounded(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """run_cli with the child's address space limited to MEMORY_LIMIT: a value that grows
    the parent ends in MemoryError (a traceback), not a quiet pass."""
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    return subprocess.run([sys.executable, str(REPO / "run_bench.py"), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, preexec_fn=limit)


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def smoke(tmp_path: Path, extra: str = "", **changes: object) -> Path:
    """The smoke sweep with changes (a key changed to None is left out), then extra text."""
    doc = {k: v for k, v in {**SMOKE, **changes}.items() if v is not None}
    return write(tmp_path, yaml.safe_dump(doc, sort_keys=False) + extra)


# -- config files: size, kind, depth, aliases ------------------------------------------------

def test_a_config_file_past_1_mib_is_refused_without_parsing(tmp_path: Path) -> None:
    path = smoke(tmp_path, "description: '" + "x" * 2**20 + "'\n")
    one_line(run_cli("--config", str(path), "--dry-run", timeout=60), "--config", "1 MiB")


def test_config_from_dev_zero_ends_at_once_with_one_line() -> None:
    start = time.monotonic()
    one_line(run_cli("--config", "/dev/zero", "--dry-run", timeout=30), "--config",
             "/dev/zero", "character device")
    assert time.monotonic() - start < 20


def test_a_fifo_config_is_refused_unread(tmp_path: Path) -> None:
    """No writer ever opens the FIFO: reading it would wait forever."""
    fifo = tmp_path / "c.yaml"
    os.mkfifo(fifo)
    one_line(run_cli("--config", str(fifo), "--dry-run", timeout=30), "--config", "a FIFO")


@pytest.mark.parametrize("levels", [MAX_YAML_DEPTH + 1, 100_000])
def test_yaml_nested_past_the_depth_limit_is_one_line(tmp_path: Path, levels: int) -> None:
    path = smoke(tmp_path, "description: " + "[" * levels + "]" * levels + "\n")
    one_line(run_cli("--config", str(path), "--dry-run", timeout=60), "--config",
             f"nested at most {MAX_YAML_DEPTH} levels")


def _bomb(levels: int = 9) -> str:
    """A YAML flow list of anchors, each listing the one before ten times: a few hundred bytes
    that expand to 2 x 10**levels strings of 50 characters."""
    items = ['&l0 ["' + "x" * 50 + '", "' + "y" * 50 + '"]']
    items += [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "[" + ", ".join(items) + "]"


@pytest.mark.parametrize("key", ["description", "name", "cluster.partition",
                                 "runner_options.tf_mirrored.python", "models"])
def test_an_alias_bomb_in_any_value_is_refused_in_seconds_and_bounded_memory(
        tmp_path: Path, key: str) -> None:
    """The bomb under each key: the file is refused, naming it, before the value is built or
    shown (once the error message rendered it: 3 GB)."""
    *parents, last = key.split(".")
    text = "".join(f"{'  ' * i}{p}:\n" for i, p in enumerate(parents)) \
        + f"{'  ' * len(parents)}{last}: {_bomb()}\n"
    doc = {k: v for k, v in SMOKE.items() if k != key.split(".")[0]}
    path = write(tmp_path, yaml.safe_dump(doc) + text)
    start = time.monotonic()
    one_line(cli_bounded("--config", str(path), "--dry-run"), f"--config: {str(path)!r}",
             "aliases expand")
    assert time.monotonic() - start < 30


def test_an_alias_bomb_in_a_set_value_is_refused(tmp_path: Path) -> None:
    one_line(cli_bounded("--config", str(smoke(tmp_path)), "--dry-run", "--set",
                         f"description={_bomb()}"), "--set description", "aliases expand")


def test_an_alias_inside_its_own_anchor_is_refused(tmp_path: Path) -> None:
    path = smoke(tmp_path, "description: &a [*a]\n")
    one_line(cli_bounded("--config", str(path), "--dry-run"), "--config", "nested at most")


def test_aliases_within_the_budget_still_load(tmp_path: Path) -> None:
    """The budget refuses expansion, not aliases: a shared list and a merge key load."""
    path = smoke(tmp_path, "runner_options:\n  tf_mirrored: &o {data_format: channels_first}\n"
                 "  keras_torch: {<<: *o}\n", devices=None,
                 runners=["tf_mirrored", "keras_torch"])
    path.write_text(path.read_text() + "devices: &d [1, 2]\nnodes: [*d, *d]\n")
    with pytest.raises(ConfigError, match=r"^nodes: \[1, 2\] is not allowed"):
        load_config(path)  # the alias expanded, then validated as any value
    path.write_text(path.read_text().replace("nodes: [*d, *d]\n", ""))
    cfg = load_config(path)
    assert cfg.devices == [1, 2]
    assert cfg.runner_options["keras_torch"]["data_format"] == "channels_first"


# -- --set -----------------------------------------------------------------------------------

@pytest.mark.parametrize("prefix", ["a", "cluster", "description", "runner_options"])
def test_a_set_key_of_1000_parts_is_one_line(tmp_path: Path, prefix: str) -> None:
    """cluster.a.a... once ended in RecursionError (1,000 nested mappings)."""
    key = ".".join([prefix] + ["a"] * 999)
    cli = run_cli if prefix == "a" else main_here  # one case through the real CLI
    line = one_line(cli("--config", str(smoke(tmp_path)), "--dry-run", "--set", f"{key}=1"),
                    "--set", "1000 dotted parts", "at most 8")
    assert len(line) < 300


def test_a_set_value_past_64_kib_is_one_line(tmp_path: Path) -> None:
    line = one_line(run_cli("--config", str(smoke(tmp_path)), "--dry-run", "--set",
                            "description=" + "x" * 70_000, timeout=60),
                    "--set description", "70000 characters", "64 KiB")
    assert len(line) < 300


# -- numbers in range ------------------------------------------------------------------------

def test_every_numeric_runner_option_declares_its_range() -> None:
    """Each int or float option (but one with allowed values) of every runner, pipeline and
    probe has a minimum and a maximum, and the JSON Schema carries them."""
    schema = json.dumps(json_schema())
    for info in [*RUNNERS.values(), *PIPELINES.values(), *PROBES.values()]:
        for name, opt in {**COMMON_OPTIONS, **info.options}.items():
            types = opt.type if isinstance(opt.type, tuple) else (opt.type,)
            if opt.allowed is None and ({int, float} & set(types)):
                assert opt.minimum is not None and opt.maximum is not None, (info.name, name)
                assert opt.minimum <= opt.default <= opt.maximum, (info.name, name)
    assert '"maximum": 10000, "minimum": 1' in schema


@pytest.mark.parametrize("value", ["0", "-1", "10001", "2.5", "'3'", ".nan"])
def test_steps_per_execution_out_of_range_fails_validation(tmp_path: Path, value: str) -> None:
    cli = run_cli if value == "0" else main_here  # one case through the real CLI
    one_line(cli("--config", str(smoke(tmp_path)), "--dry-run", "--set",
                 f"runner_options.tf_mirrored.steps_per_execution={value}"),
             "runner_options.tf_mirrored.steps_per_execution:", "from 1 to 10000")


@pytest.mark.parametrize("devices", ["18446744073709551616", "1000001", "0", "2,\u0967\u0968",
                                     ",".join(map(str, range(1, 100)))])
def test_predict_devices_out_of_range_is_one_line(tmp_path: Path, devices: str) -> None:
    folder = write_folder(tmp_path / "r", [gpu_record(1, 200.0), gpu_record(2, 380.0)])
    cli = run_cli if devices == "0" else main_here  # one case through the real CLI
    line = one_line(cli("predict", str(folder), "--devices", devices, "--busbw", "10"),
                    "error: devices:", "from 1 to 1000000")
    assert len(line) < 400


BIG = str(2**64)


@pytest.mark.parametrize("args, key", [
    (("--classes", "2", "--images", BIG, "--size", "8"), "--images"),
    (("--classes", BIG, "--images", BIG, "--size", "8"), "--classes"),
    (("--classes", "2", "--images", "4", "--size", "8", "--seed", "-1"), "--seed"),
])
def test_make_dataset_counts_out_of_range_are_one_line(tmp_path: Path, args: tuple[str, ...],
                                                       key: str) -> None:
    """--images 2**64 once wrote images until the disk was full; --seed -1 ended in numpy's
    traceback."""
    out = tmp_path / "ds"
    cli = run_cli if key == "--seed" else main_here  # one case through the real CLI
    one_line(cli("make-dataset", "--out", str(out), *args), f"error: {key}:")
    assert not out.exists()


@pytest.mark.parametrize("option", ["--workers", "--resize"])
def test_prepare_data_numbers_out_of_range_are_one_line(tmp_path: Path, option: str) -> None:
    """Past C's int or long they ended in an OverflowError traceback."""
    src = tmp_path / "src" / "class_0"
    src.mkdir(parents=True)
    cli = run_cli if option == "--workers" else main_here  # one case through the real CLI
    one_line(cli("prepare-data", "--src", str(src.parent), "--out", str(tmp_path / "out"),
                 option, BIG), f"error: {option}:")


# -- messages quote a short prefix -----------------------------------------------------------

@pytest.mark.parametrize("changes, key, run", [
    ({"runners": "z" * 5000}, "runners", "z" * 61),
    ({"description": ["d" * 1000] * 500}, "description", "d" * 61),
    ({"devices": list(range(1, 5000)), "batch_size_per_device": None, "global_batch_size": 7},
     "global_batch_size", "100, 101"),
])
def test_a_long_value_is_quoted_by_a_short_prefix_and_its_length(
        tmp_path: Path, changes: dict[str, object], key: str, run: str) -> None:
    cli = run_cli if key == "runners" else main_here  # one case through the real CLI
    line = one_line(cli("--config", str(smoke(tmp_path, **changes)), "--dry-run"), key)
    assert run not in line and len(line) < 1000, line
    assert "characters)" in line or "items)" in line, line


@pytest.mark.parametrize("text", ["description: *" + "a" * 100_000,
                                  "description: !" + "t" * 100_000 + " x"])
def test_a_yaml_error_quoting_a_long_token_is_cut(tmp_path: Path, text: str) -> None:
    """PyYAML's own message quotes the alias or tag whole."""
    cli = run_cli if text.startswith("description: *") else main_here  # one through the CLI
    line = one_line(cli("--config", str(smoke(tmp_path, text + "\n")), "--dry-run"),
                    "--config", "is not valid YAML", "characters)")
    assert len(line) < 400, line


# -- class 6: --out, the name, --detach, runners ---------------------------------------------

def test_out_that_is_a_file_or_under_one_is_refused_naming_out(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("x")
    config = str(smoke(tmp_path))
    for out, words in ((afile, "it is a file"), (afile / "sub", f"{str(afile)!r} is a file")):
        cli = run_cli if out == afile else main_here  # the first through the real CLI
        one_line(cli("--config", config, "--dry-run", "--out", str(out)), "--out", words)
        one_line(cli("--config", config, "--out", str(out)), "--out", words)
    assert afile.read_text() == "x"


def test_out_with_a_name_past_255_bytes_is_refused_naming_out(tmp_path: Path) -> None:
    out = tmp_path / ("o" * 300)
    one_line(run_cli("--config", str(smoke(tmp_path)), "--dry-run", "--out", str(out),
                     timeout=60), "--out", "300 bytes", "at most 255")


def test_an_unwritable_out_is_refused_naming_out(tmp_path: Path) -> None:
    """A folder this user cannot write in (read-only for a user; for root, whom permissions do
    not stop, /proc, where no folder can be made): exit 2 naming --out, nothing made."""
    if os.geteuid() == 0:
        out = Path("/proc") / f"mgbench-out-{os.getpid()}"
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        out = locked / "out"
    one_line(run_cli("--config", str(smoke(tmp_path)), "--out", str(out), timeout=60),
             "--out", str(out))
    assert not out.exists()


def test_a_300_character_name_fails_in_the_dry_run(tmp_path: Path) -> None:
    config = str(smoke(tmp_path))
    line = one_line(run_cli("--config", config, "--dry-run", "--set", "name=" + "n" * 300,
                            timeout=60), "error: name:", "300 characters", "255 bytes")
    assert len(line) < 400
    proc = run_cli("--config", config, "--dry-run", "--set", "name=" + "n" * 239, timeout=60)
    assert proc.returncode == 0, proc.stderr  # the longest that fits <name>-<time>


def test_detach_with_the_local_backend_refuses_before_making_a_folder(tmp_path: Path) -> None:
    out = tmp_path / "out"
    one_line(run_cli("--config", str(smoke(tmp_path)), "--detach", "--out", str(out),
                     timeout=60), "--detach", "cluster.backend: slurm")
    assert not out.exists()


@pytest.mark.parametrize("value", ["[]", "null", ""])
def test_emptying_runners_is_one_line(tmp_path: Path, value: str) -> None:
    """With two runners' options in the file, the notes that they go unused once printed
    before the error: three lines for one mistake."""
    path = smoke(tmp_path, runners=["tf_mirrored", "torch_ddp"],
                 runner_options={"tf_mirrored": {"xla": False}, "torch_ddp": {"compile": False}})
    cli = run_cli if value == "[]" else main_here  # one case through the real CLI
    one_line(cli("--config", str(path), "--dry-run", "--set", f"runners={value}"), "runners:")
