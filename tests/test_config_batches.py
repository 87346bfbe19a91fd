"""A batch per model: the batch keys take a mapping of model name (or default) to a batch or a
list of them; the plan runs each model at its own batches in every mode that has a batch; bad
input is one line naming the key, exit 2; the resolved mapping loads back as a mapping, a
--set replaces it and a resume sees its change."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench.plan.config import load_config, validate
from bench.plan.runs import expand
from bench.run.sweep import fingerprint, fingerprint_changes, matrix_grows
from tests.helpers.cli import main_here, run_cli

TWO = ["minigooglenet", "resnet50"]
BASE: dict[str, Any] = {"runners": ["tf_mirrored", "torch_ddp"], "models": TWO,
                        "devices": [1, 2]}
PER_MODEL = {"resnet50": 256, "minigooglenet": [512, 1024]}


def batches_by_model(cfg: Any, mode: str = "benchmark") -> dict[str, Counter[int]]:
    """How many runs of the mode the plan has at each batch per device, by model."""
    out: dict[str, Counter[int]] = {}
    for run in expand(cfg, "s"):
        if run.mode == mode:
            out.setdefault(run.model, Counter())[run.batch_size_per_device] += 1
    return out


def test_a_mapping_plans_each_model_at_its_own_batches() -> None:
    cfg = validate({**BASE, "batch_size_per_device": PER_MODEL})
    assert cfg.batch_sizes == {"minigooglenet": [512, 1024], "resnet50": [256]}
    # 2 runners x 2 device counts per batch
    assert batches_by_model(cfg) == {"minigooglenet": Counter({512: 4, 1024: 4}),
                                     "resnet50": Counter({256: 4})}


def test_default_gives_the_models_the_mapping_does_not_name() -> None:
    cfg = validate({**BASE, "batch_size_per_device": {"resnet50": 64, "default": [8, 16]}})
    assert batches_by_model(cfg) == {"minigooglenet": Counter({8: 4, 16: 4}),
                                     "resnet50": Counter({64: 4})}


def test_strong_scaling_divides_each_model_s_global_batch() -> None:
    cfg = validate({**BASE, "global_batch_size": {"resnet50": 8, "minigooglenet": 4}})
    runs = [r for r in expand(cfg, "s") if r.runner == "torch_ddp"]
    assert [(r.model, r.num_devices, r.global_batch_size, r.batch_size_per_device)
            for r in runs] == [("minigooglenet", 1, 4, 4), ("minigooglenet", 2, 4, 2),
                               ("resnet50", 1, 8, 8), ("resnet50", 2, 8, 4)]


def test_the_same_batches_per_model_plan_what_one_list_plans() -> None:
    """A mapping giving every model the same list is the list: the same runs in order."""
    one = validate({**BASE, "batch_size_per_device": [32, 16]})
    each = validate({**BASE, "batch_size_per_device": {"default": [32, 16]}})
    assert [r.run_id for r in expand(each, "s")] == [r.run_id for r in expand(one, "s")]


def _dataset(tmp_path: Path) -> str:
    """A folder the config takes as a prepared dataset with splits (it reads the manifest and
    sees splits.npz; planning reads neither)."""
    (tmp_path / "manifest.json").write_text(json.dumps({"classes": 10}))
    (tmp_path / "splits.npz").write_bytes(b"")
    return str(tmp_path)


def test_pipeline_and_converge_runs_take_each_model_s_batches(tmp_path: Path) -> None:
    mapping = {"resnet50": 4, "minigooglenet": [8, 16]}
    pipeline = validate({**BASE, "mode": ["pipeline"], "pipelines": ["pil_loop"],
                         "dataset": {"path": _dataset(tmp_path), "workers": [1]},
                         "batch_size_per_device": mapping})
    assert batches_by_model(pipeline, "pipeline") == {
        "minigooglenet": Counter({8: 1, 16: 1}), "resnet50": Counter({4: 1})}
    converge = validate({**BASE, "mode": "converge", "dataset": {"path": str(tmp_path)},
                         "batch_size_per_device": mapping})
    assert batches_by_model(converge, "converge") == {
        "minigooglenet": Counter({8: 4, 16: 4}), "resnet50": Counter({4: 4})}


def test_capacity_depth_probes_train_at_each_model_s_batch() -> None:
    cfg = validate({"mode": "capacity", "runners": "torch_ddp", "models": ["gpt2_tiny", "gpt2"],
                    "devices": [2], "device_memory": "256MiB", "scale": "depth",
                    "batch_size_per_device": {"gpt2_tiny": [2, 4], "gpt2": 1}})
    assert [(r.model, r.batch_size_per_device) for r in expand(cfg, "s")] == [
        ("gpt2_tiny", 2), ("gpt2_tiny", 4), ("gpt2", 1)]


def test_a_user_s_model_is_named_as_the_sweep_names_it(tmp_path: Path) -> None:
    (tmp_path / "mynet.py").write_text("def make():\n    return None\n")
    mine = {"name": "my-net", "framework": "torch", "build": "mynet:make",
            "path": str(tmp_path), "input": {"kind": "image", "shape": [3, 8, 8],
                                             "classes": 10}}
    cfg = validate({**BASE, "runners": "torch_ddp", "models": ["resnet50", mine],
                    "batch_size_per_device": {"my-net": 3, "default": 5}})
    assert batches_by_model(cfg) == {"my-net": Counter({3: 2}), "resnet50": Counter({5: 2})}


BAD = [
    ("batch_size_per_device", {"resnet5": 8, "default": 4},
     "batch_size_per_device: 'resnet5' is not one of this sweep's models (did you mean "
     "'resnet50'?); allowed: minigooglenet, resnet50, default"),
    ("batch_size_per_device", {"vit_tiny": 8, "default": 4},
     "batch_size_per_device: 'vit_tiny' is not one of this sweep's models"),
    ("batch_size_per_device", {"resnet50": 8},
     "batch_size_per_device.minigooglenet: missing; give minigooglenet its batch, or a "
     "default entry"),
    ("batch_size_per_device", {"resnet50": 0, "default": 4},
     "batch_size_per_device.resnet50: 0 is not allowed; allowed: an integer >= 1"),
    ("batch_size_per_device", {"resnet50": [8, -2], "default": 4},
     "batch_size_per_device.resnet50: -2 is not allowed; allowed: an integer >= 1"),
    ("global_batch_size", {"resnet50": 2.5, "default": 4},
     "global_batch_size.resnet50: 2.5 is not allowed; allowed: an integer >= 1"),
    ("global_batch_size", {"resnet50": "big", "default": 4},
     "global_batch_size.resnet50: 'big' is not allowed; allowed: an integer >= 1"),
    ("global_batch_size", {"resnet50": 8, "default": [4, 6]},
     "global_batch_size.minigooglenet: 6 does not divide by 4 devices"),
]


@pytest.mark.parametrize("key, value, message", BAD)
def test_bad_batches_per_model_are_one_line_exit_2(tmp_path: Path, key: str, value: Any,
                                                    message: str) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**BASE, "devices": [1, 2, 4], key: value}))
    proc = main_here("--config", str(path), "--dry-run")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == [proc.stderr.strip()]
    assert proc.stderr.startswith(f"error: {message}"), proc.stderr


def test_the_command_line_refuses_a_bad_mapping_and_plans_a_good_one(tmp_path: Path) -> None:
    """The real CLI, in a process of its own: a model without a batch exits 2 naming it; the
    good mapping's dry run lists each model at its batch."""
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**BASE, "batch_size_per_device": {"resnet50": 8}}))
    proc = run_cli("--config", str(path), "--dry-run", timeout=120)
    assert proc.returncode == 2 and "batch_size_per_device.minigooglenet: missing" in \
        proc.stderr, proc.stdout + proc.stderr
    proc = run_cli("--config", str(path), "--dry-run", "--set",
                   "batch_size_per_device.minigooglenet=1024", timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tf_mirrored__minigooglenet__n2__b1024__" in proc.stdout
    assert "tf_mirrored__resnet50__n2__b8__" in proc.stdout


def test_the_resolved_mapping_loads_back_as_a_mapping() -> None:
    cfg = validate({**BASE, "batch_size_per_device": {"resnet50": 256, "default": 1024}})
    written = cfg.to_dict()
    assert written["batch_size_per_device"] == {"minigooglenet": [1024], "resnet50": [256]}
    # through the YAML a results folder keeps (config.yaml)
    again = validate(yaml.safe_load(yaml.safe_dump(written, sort_keys=False)))
    assert again == cfg and again.to_dict() == written


def test_set_replaces_the_mapping(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**BASE, "batch_size_per_device": PER_MODEL}))
    cfg = load_config(path, ["batch_size_per_device=64"])
    assert cfg.batch_sizes == [64]
    assert batches_by_model(cfg) == {m: Counter({64: 4}) for m in TWO}


def test_a_resume_sees_a_model_s_batch_change() -> None:
    old = fingerprint(validate({**BASE, "batch_size_per_device": PER_MODEL}))
    new = fingerprint(validate({**BASE, "batch_size_per_device": {**PER_MODEL,
                                                                  "resnet50": 128}}))
    changes = fingerprint_changes(old, new)
    assert changes == [("batch_size_per_device.resnet50", [256], [128])]
    assert not any(matrix_grows(*c, old, new) for c in changes)
    # from one list for every model to a mapping: a change too
    flat = fingerprint(validate({**BASE, "batch_size_per_device": 256}))
    assert fingerprint_changes(flat, new)


def test_a_resume_may_add_a_model_with_its_batch_or_a_batch_to_a_model() -> None:
    """The matrix grows (new runs beside the old, as a device count added): allowed; a model's
    batch replaced, or an entry for a model the sweep already had, is not."""
    old = fingerprint(validate({**BASE, "models": ["resnet50"],
                                "batch_size_per_device": {"resnet50": 256}}))
    new = fingerprint(validate({**BASE, "batch_size_per_device": {**PER_MODEL,
                                                                  "resnet50": [256, 512]}}))
    changes = fingerprint_changes(old, new)
    assert {c[0] for c in changes} == {"models", "batch_size_per_device.minigooglenet",
                                       "batch_size_per_device.resnet50"}
    assert all(matrix_grows(*c, old, new) for c in changes), changes
    assert not matrix_grows("batch_size_per_device.resnet50", [256, 512], [256], new, old)


def test_set_models_drops_the_file_s_entries_for_the_models_it_leaves_out(
        tmp_path: Path) -> None:
    """A --set models=[...] narrowing the file's models leaves their batch entries out, with
    a note once the sweep is valid (as --set runners does with runner_options); an entry the
    file did not owe to a model of its own still fails."""
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**BASE, "batch_size_per_device": PER_MODEL}))
    proc = main_here("--config", str(path), "--dry-run", "--set", "models=[resnet50]")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stderr.splitlines() == ["note: batch_size_per_device.minigooglenet not used: "
                                        "--set models left minigooglenet out of this sweep"]
    assert "__minigooglenet__" not in proc.stdout and "__resnet50__n2__b256__" in proc.stdout
    # the mapping a --set gives is taken as given
    proc = main_here("--config", str(path), "--dry-run", "--set", "models=[resnet50]", "--set",
                     "batch_size_per_device={minigooglenet: 8, resnet50: 4}")
    assert proc.returncode == 2 and proc.stderr.startswith(
        "error: batch_size_per_device: 'minigooglenet' is not one of this sweep's models"), \
        proc.stderr
