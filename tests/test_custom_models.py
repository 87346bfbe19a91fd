"""Your own model as one `models:` entry: validation (one line per bad entry), the plan that
carries it to the child, the runs that cannot take it (planned unavailable, said in the dry
run), and check-model's verdicts in the framework's own environment."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench.catalog.registry import RUNNERS
from bench.plan.config import ConfigError, validate
from bench.plan.runs import expand
from bench.run.sweep import precheck
from tests.helpers.cli import REPO, run_cli


@pytest.fixture()
def mynets(tmp_path: Path) -> Path:
    """A folder outside the repository holding a user's torch model."""
    folder = tmp_path / "code" / "mynets"
    folder.mkdir(parents=True)
    shutil.copy(REPO / "tests/children/torch_user_net.py", folder / "mynets.py")
    return folder


def entry(folder: Path, **changes: Any) -> dict[str, Any]:
    return {"name": "mynet", "framework": "torch", "build": "mynets:make_model",
            "path": str(folder), "args": {"width": 8},
            "input": {"kind": "image", "shape": [3, 16, 16], "classes": 10}, **changes}


def sweep(models: Any, runners: Any = ("torch_ddp",), **more: Any) -> dict[str, Any]:
    return {"runners": list(runners), "models": models, "devices": [1, 2],
            "batch_size_per_device": 4, **more}


def test_a_models_entry_plans_runs_that_carry_it_with_its_path_absolute(
        mynets: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(mynets.parent)
    cfg = validate(sweep([entry(Path("mynets")), "gpt2_tiny"]))
    runs = expand(cfg, "s")
    assert [(r.model, r.num_devices) for r in runs] == [
        ("mynet", 1), ("mynet", 2), ("gpt2_tiny", 1), ("gpt2_tiny", 2)]
    custom = runs[0].custom_model
    assert custom["path"] == str(mynets) and custom["build"] == "mynets:make_model"
    assert custom["input"] == {"kind": "image", "shape": [3, 16, 16], "classes": 10}
    assert runs[0].run_id == "torch_ddp__mynet__n1__b4__synthetic__fp32__r0"
    assert runs[2].custom_model is None
    # the child reads it back from the spec JSON
    assert json.loads(json.dumps(runs[1].to_dict()))["custom_model"] == custom


@pytest.mark.parametrize(("change", "message"), [
    ({"framework": "pytorch"}, "models[0].framework: 'pytorch' is not allowed (did you mean "
     "'torch'?); allowed: torch, jax, keras, tf, mxnet"),
    ({"build": "mynets"}, "models[0].build: 'mynets' is not allowed; allowed: module:function "
     "(e.g. mynets:make_model)"),
    ({"path": "/no/such/folder"}, "models[0].path: '/no/such/folder' is not allowed; allowed: "
     "an existing folder (the one holding the build's module)"),
    ({"input": {"kind": "image", "shape": [3, 16, 16]}}, "models[0].input.classes: missing; "
     "this key is required with kind image"),
    ({"input": {"kind": "tokens", "seq_len": 8, "vocab": 100, "classes": 3}},
     "models[0].input.classes: 3 is not allowed; allowed: nothing with kind tokens (it is kind "
     "image's)"),
    ({"input": {"kind": "audio"}}, "models[0].input.kind: 'audio' is not allowed; allowed: "
     "image, tokens"),
    ({"name": "resnet50"}, "models[0].name: 'resnet50' is not allowed; allowed: a name that is "
     "not a built-in model's"),
    ({"args": [1]}, "models[0].args: [1] is not allowed; allowed: a mapping of argument name "
     "to value"),
    ({"weights": "x"}, "models[0].weights: 'x' is not allowed; allowed: keys name, framework, "
     "build, path, args, input"),
])
def test_a_bad_entry_is_one_line_naming_its_key(mynets: Path, change: dict[str, Any],
                                                message: str) -> None:
    with pytest.raises(ConfigError) as info:
        validate(sweep([entry(mynets, **change)]))
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_a_models_entry_is_for_benchmark_runs_only(mynets: Path) -> None:
    with pytest.raises(ConfigError, match="models: 'mynet' is not allowed; allowed: a built-in "
                       "model with mode allreduce"):
        validate(sweep([entry(mynets)], mode=["allreduce"], probes=["torch_allreduce"]))


def test_runs_that_cannot_take_a_model_are_planned_unavailable_with_the_reason(
        mynets: Path) -> None:
    cfg = validate(sweep([entry(mynets), "gpt2_tiny", "minigooglenet"],
                         runners=["torch_ddp", "jax_native", "keras_tf_kuza55"]))
    verdicts = {(r.runner, r.model): precheck(r, None) for r in expand(cfg, "s")}
    assert verdicts[("torch_ddp", "mynet")] is None
    assert verdicts[("torch_ddp", "gpt2_tiny")] is None
    assert verdicts[("jax_native", "gpt2_tiny")] is None
    assert verdicts[("keras_tf_kuza55", "minigooglenet")] is None
    # every runner that takes a torch model, in the catalog's order
    takers = [n for n, r in RUNNERS.items() if "torch" in r.custom_models]
    assert {"torch_ddp", "horovod", "deepspeed"} <= set(takers) and "jax_native" not in takers
    assert verdicts[("jax_native", "mynet")] == ("unavailable", (
        "mynet is a torch model; jax_native cannot run it: it takes jax models (a torch model "
        f"runs on {', '.join(takers)})"))
    status, reason = verdicts[("keras_tf_kuza55", "mynet")]
    assert status == "unavailable" and "builds only the models of models/" in reason
    assert verdicts[("keras_tf_kuza55", "gpt2_tiny")] == ("unavailable", (
        "gpt2_tiny is a transformer model; keras_tf_kuza55: a 2017 system: its builders are "
        "the 2017 CNNs; transformers are not of its era"))


def test_the_dry_run_says_which_runs_will_not_launch_and_why(mynets: Path,
                                                             tmp_path: Path) -> None:
    config = tmp_path / "mine.yaml"
    config.write_text(json.dumps(sweep([entry(mynets)], runners=["torch_ddp", "jax_native"])))
    proc = run_cli("--config", str(config), "--dry-run", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert ("  unavailable (2 runs: #3-#4): mynet is a torch model; jax_native cannot run it"
            in proc.stdout)
    assert "3  jax_native__mynet__n1__b4__synthetic__fp32__r0" in proc.stdout


@pytest.mark.slow
@pytest.mark.framework("torch")
def test_check_model_counts_a_good_model_and_catches_each_bad_entry_with_one_line(
        mynets: Path, tmp_path: Path, torch_python: str) -> None:
    models = [
        entry(mynets),
        entry(mynets, name="no_module", build="mynetz:make_model"),
        entry(mynets, name="no_function", build="mynets:make_modle"),
        entry(mynets, name="not_a_model", build="mynets:not_a_model", args={}),
        entry(mynets, name="wrong_classes",
              input={"kind": "image", "shape": [3, 16, 16], "classes": 7}),
        entry(mynets, name="syntax", build="broken:make_model", args={}),
        entry(mynets, name="raises", build="raising:make_model", args={}),
    ]
    (mynets / "broken.py").write_text("import torch\n\ndef make_model()\n    return None\n")
    (mynets / "raising.py").write_text(
        "def helper():\n    raise ValueError('no width given')\n\n\n"
        "def make_model():\n    return helper()\n")
    config = tmp_path / "mine.yaml"
    config.write_text(json.dumps(sweep(models)))
    proc = run_cli("check-model", str(config), timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    # conv 3x3x3x8 + 8, dense 8x10 + 10: counted by torch; FLOPs by FlopCounterMode
    assert proc.stdout.startswith("mynet (torch, mynets:make_model): 314 parameters (314 "
                                  "trainable), "), proc.stdout
    assert "FlopCounterMode" in proc.stdout and "output [2, 10] for a batch of 2: ok" in \
        proc.stdout
    errors = proc.stderr.strip().splitlines()
    assert errors == [
        f"error: models: no_module: module 'mynetz' not found in {mynets}",
        f"error: models: no_function: function 'make_modle' not found in module mynets "
        f"({mynets / 'mynets.py'})",
        "error: models: not_a_model: mynets:not_a_model returned builtins.dict, not a "
        "torch.nn.Module",
        "error: models: wrong_classes: output shape [2, 10] for a batch of 2 does not match "
        "classes 7 (expected [2, 7])",
        # the user's file and line, not a bare "SyntaxError: expected ':'" (issue 41, item 7)
        "error: models: syntax: importing broken failed: SyntaxError: expected ':' "
        "(broken.py, line 3)",
        "error: models: raises: raising:make_model(**{}) raised ValueError: no width given "
        "(raising.py, line 2)",
    ], proc.stderr
