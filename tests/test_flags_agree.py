"""Flags that mean something only together are refused alone, in the dry run as in the run;
an empty --out is refused, not taken for the default folder; a steps_per_execution that cannot
fill the timed window is refused at validation, not after the run started; a mistyped command
is named, not taken for `run`; YAML keys are named as written; predict's --busbw is a physical
bandwidth; a closed output pipe is named as such; an empty `python` is refused; a failed write
names its remedy, "free space" only for a full disk (issue 43, items 10 and 11)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cli import REPO, main_here, run_cli

SMOKE = ("--config", "configs/cpu-smoke.yaml")


@pytest.mark.parametrize("dry", [True, False])
@pytest.mark.parametrize("flag", ["--retry-failed", "--new-fingerprint"])
def test_a_resume_flag_without_resume_is_one_line(flag: str, dry: bool, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cli = run_cli if (flag, dry) == ("--retry-failed", True) else main_here  # one real CLI case
    proc = cli(*SMOKE, "--out", str(out), flag, *(["--dry-run"] if dry else []))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == f"error: {flag}: allowed only with --resume " + {
        "--retry-failed": "(a new sweep has no failed runs to run again)",
        "--new-fingerprint": "(a new sweep writes its own fingerprint)"}[flag]
    assert not out.exists()


@pytest.mark.parametrize("dry", [True, False])
def test_an_empty_out_is_refused_naming_out(dry: bool, tmp_path: Path) -> None:
    cli = run_cli if dry else main_here  # one case through the real CLI
    proc = cli(*SMOKE, "--out", "", *(["--dry-run"] if dry else []))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().startswith("error: --out: '' is not allowed: an empty path")


@pytest.mark.parametrize("value", ["3", "[1, 3]"])
def test_steps_per_execution_that_does_not_divide_the_steps_fails_validation(value: str) -> None:
    cli = run_cli if value == "3" else main_here  # one case through the real CLI
    proc = cli(*SMOKE, "--set", f"runner_options.tf_mirrored.steps_per_execution={value}",
               "--dry-run")  # warmup_steps 3, measure_steps 10
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip() == (
        "error: runner_options.tf_mirrored.steps_per_execution: 3 is not allowed; allowed: a "
        "divisor of warmup_steps (3) and measure_steps (10): the timed window counts whole "
        "calls")


@pytest.mark.parametrize(("word", "hint"), [("reprot", " (did you mean report?)"),
                                            ("configs/cpu-smoke.yaml",
                                             " (did you mean --config configs/cpu-smoke.yaml?)")])
def test_a_word_that_is_no_command_is_named_not_taken_for_run(word: str, hint: str) -> None:
    cli = run_cli if "report" in hint else main_here  # one case through the real CLI
    proc = cli(word, "results")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert line.startswith(f"error: {word!r} is not a command; allowed: run, ") and \
        line.endswith(f"check-model, new-runner{hint}"), line


def test_keys_that_differ_in_yaml_but_not_once_read_are_named_as_written() -> None:
    from bench.plan.config import ConfigError
    from bench.plan.config.yaml_reader import parse_yaml

    with pytest.raises(ConfigError) as info:
        parse_yaml("name: x\n1: a\ntrue: b\n", "m")
    assert str(info.value) == ("m: keys '1' (line 2) and 'true' (line 3) are one key once read "
                               "(both True); give each key once")


@pytest.mark.parametrize("busbw", [1e-300, 0.0, -1.0, float("nan"), float("inf"), 1e7])
def test_a_bus_bandwidth_outside_a_physical_range_is_refused(busbw: float) -> None:
    from bench.analysis.predict import fixed_bandwidth
    from bench.plan.config import ConfigError

    with pytest.raises(ConfigError, match=r"^busbw: .* is not allowed; allowed: a bus bandwidth "
                       r"in GB/s, from 1e-06 \(1 kB/s\) to 1e\+06 \(1 PB/s\)$"):
        fixed_bandwidth(busbw, None)
    assert fixed_bandwidth(1e-6, None) is not None and fixed_bandwidth(1e6, None) is not None


def test_a_sweep_whose_output_pipe_closes_says_so_not_free_space(tmp_path: Path) -> None:
    import subprocess

    from tests.helpers.toy import TOY, config

    out = tmp_path / "out"
    proc = subprocess.Popen([*TOY, "--config", str(config(tmp_path)), "--out", str(out)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().startswith("sweep toy: 2 runs")
    proc.stdout.close()  # as `| head -1` does
    err = proc.stderr.read() if proc.stderr else ""
    assert proc.wait(timeout=120) == 1
    assert err.strip() == ("stopped: the reader of this sweep's output went away (a closed "
                           f"pipe, e.g. `| head`); finished records are kept; --resume --out "
                           f"{out} runs the rest")


@pytest.mark.parametrize("value", ['""', "'  '"])
def test_an_empty_python_is_refused_not_taken_for_the_environment(value: str) -> None:
    cli = run_cli if value == '""' else main_here  # one case through the real CLI
    proc = cli(*SMOKE, "--set", f"runner_options.tf_mirrored.python={value}", "--dry-run")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().startswith("error: runner_options.tf_mirrored.python: ") and \
        proc.stderr.strip().endswith("is not allowed; allowed: a non-empty path of the Python "
                                     "interpreter to use"), proc.stderr


def test_a_folder_where_summary_csv_belongs_is_named_not_free_space(tmp_path: Path) -> None:
    from tests.helpers.toy import config, toy

    out = tmp_path / "out"
    (out / "summary.csv").mkdir(parents=True)
    proc = toy("--config", str(config(tmp_path)), "--out", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert "free space" not in line and line.endswith(
        f"move the folder {out / 'summary.csv'} away (a file is written there), then "
        f"`run_bench.py report {out}`"), line
    report = run_cli("report", str(out))
    assert report.returncode == 1 and report.stderr.strip().endswith(
        f"move the folder {out / 'summary.csv'} away (a file is written there)"), report.stderr


def test_the_remedy_of_a_failed_write_follows_its_cause() -> None:
    import errno

    from bench.errors import write_remedy

    assert write_remedy(OSError(errno.ENOSPC, "No space left", "/r/x.json")) == "free space"
    assert write_remedy(OSError(errno.EFBIG, "File too large", "/r/x.json")) == "free space"
    assert write_remedy(OSError(errno.EACCES, "Permission denied", "/r")) == \
        "let this user write /r"
    assert write_remedy(OSError(errno.ENOTDIR, "Not a directory", "/r/runs")) == \
        "move the file in the path /r/runs away (a folder belongs there)"


def test_an_out_under_proc_is_refused_in_the_dry_run_as_in_the_run() -> None:
    proc = run_cli(*SMOKE, "--out", "/proc/mgbench-results", "--dry-run", timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().startswith(
        "error: --out: '/proc/mgbench-results' is not allowed: '/proc' is not writable")


def test_a_dry_run_of_a_resume_with_other_settings_is_refused_as_the_run_is(
        tmp_path: Path) -> None:
    from tests.helpers.toy import config, toy

    out = tmp_path / "out"
    assert toy("--config", str(config(tmp_path)), "--out", str(out)).returncode == 0
    other = config(tmp_path, measure_steps=5)
    dry = toy("--config", str(other), "--out", str(out), "--resume", "--dry-run")
    real = toy("--config", str(other), "--out", str(out), "--resume")
    assert dry.returncode == real.returncode == 2, dry.stdout + dry.stderr
    assert dry.stderr == real.stderr and dry.stderr.startswith(
        "error: --resume: the settings differ from those of the results in ")
