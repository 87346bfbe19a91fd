"""torch_ddp's compile_mode (issue 39): torch.compile's mode as a runner option, default
"default" on every device, each of torch's modes planned as given (an option axis too), an
unknown mode refused, and a mode other than default refused without compile: true (Option.needs,
bench/plan/config/rules.py), in one line with exit 2 from the CLI. Its equivalence case is the
catalog's. No framework (fast); what torch records of a compiled run:
tests/test_torch_runners.py."""

from __future__ import annotations

from typing import Any

import pytest

from bench.catalog.equivalence_coverage import cases_run_here
from bench.plan.config import ConfigError, validate
from bench.plan.runs import expand
from contract.catalogs.torch import COMPILE_MODES
from tests.helpers.cli import run_cli

BASE = {"runners": ["torch_ddp"], "models": ["probe"], "devices": [1],
        "batch_size_per_device": 8}
NEEDS_COMPILE = ("runner_options.torch_ddp.compile_mode: {mode!r} is not allowed; allowed: "
                 "'default' unless compile is true (compile_mode is used only with it)")


def planned(given: dict[str, Any], device: str = "cpu") -> list[dict[str, Any]]:
    """The runs' (compile, compile_mode) options of a sweep with torch_ddp's `given` options."""
    cfg = validate({**BASE, "device": device, "runner_options": {"torch_ddp": given}})
    return [{k: run.options[k] for k in ("compile", "compile_mode")} for run in expand(cfg, "t")]


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_the_default_mode_is_torch_compiles_own(device: str) -> None:
    assert planned({}, device) == [{"compile": device == "gpu", "compile_mode": "default"}]


def test_each_of_torchs_modes_is_planned_as_given_and_as_an_axis() -> None:
    assert COMPILE_MODES == ("default", "reduce-overhead", "max-autotune-no-cudagraphs",
                             "max-autotune")
    for mode in COMPILE_MODES:
        assert planned({"compile": True, "compile_mode": mode}) == [
            {"compile": True, "compile_mode": mode}]
    assert planned({"compile": True, "compile_mode": list(COMPILE_MODES)}) == [
        {"compile": True, "compile_mode": mode} for mode in COMPILE_MODES]
    # on a GPU compile is on by default: a mode alone is taken
    assert planned({"compile_mode": "reduce-overhead"}, "gpu") == [
        {"compile": True, "compile_mode": "reduce-overhead"}]


def test_an_unknown_mode_is_refused_naming_torchs() -> None:
    with pytest.raises(ConfigError, match="compile_mode: 'fast' is not allowed; allowed: "
                                          "default, reduce-overhead, max-autotune-no-cudagraphs"):
        planned({"compile": True, "compile_mode": "fast"})


@pytest.mark.parametrize("given", [
    {"compile_mode": "reduce-overhead"},  # compile's CPU default: false
    {"compile": False, "compile_mode": "max-autotune"},
    {"compile": [True, False], "compile_mode": ["default", "max-autotune"]},  # an axis's run
])
def test_a_mode_without_compile_is_refused(given: dict[str, Any]) -> None:
    mode = next(m for m in ([given["compile_mode"]] if isinstance(given["compile_mode"], str)
                            else given["compile_mode"]) if m != "default")
    with pytest.raises(ConfigError) as exc:
        planned(given)
    assert str(exc.value) == NEEDS_COMPILE.format(mode=mode)
    # the default mode is no use of compile_mode: taken with compile false
    assert planned({"compile": False, "compile_mode": "default"}) == [
        {"compile": False, "compile_mode": "default"}]


def test_the_cli_refuses_a_mode_without_compile_in_one_line() -> None:
    proc = run_cli("run", "--config", "configs/cpu-smoke.yaml", "--dry-run",
                   "--set", "runners=[torch_ddp]",
                   "--set", "runner_options.torch_ddp.compile_mode=reduce-overhead")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "error: " + NEEDS_COMPILE.format(mode="reduce-overhead")


def test_reduce_overhead_is_an_equivalence_case() -> None:
    assert ("torch_ddp", {"compile": True, "compile_mode": "reduce-overhead"}) in cases_run_here()
