"""A runner option's GPU default (contract/catalog.py Option.gpu_default): a run on device gpu
takes it where the sweep file left the option unset; a value the file gives wins on every
device, and CPU runs keep the plain default. Fast: no framework."""

from __future__ import annotations

from typing import Any

import pytest

from bench.catalog.registry import RUNNERS
from bench.plan.config import validate
from bench.plan.runs import RunSpec, expand
from contract.catalog import Option

BASE = {"runners": ["torch_ddp"], "models": ["probe"], "devices": [1],
        "batch_size_per_device": 8}
GPU = {"memory_format": "channels_last", "compile": True, "optimizer_impl": "fused",
       "cudnn_benchmark": True, "gradient_as_bucket_view": True}
CPU = {"memory_format": "channels_first", "compile": False, "optimizer_impl": "foreach",
       "cudnn_benchmark": True, "gradient_as_bucket_view": True}


def options(device: str, given: dict[str, Any] | None = None) -> dict[str, Any]:
    raw = {**BASE, "device": device, "runner_options": {"torch_ddp": given or {}}}
    cfg = validate(raw)
    [run] = expand(cfg, "t")
    # the plan's options are the config's (less `python`, which the launcher takes)
    assert run.options == {k: v for k, v in cfg.runner_options["torch_ddp"].items()
                           if k != "python"}
    return {k: run.options[k] for k in GPU}


def test_torch_ddp_takes_the_gpu_defaults_on_gpus_only() -> None:
    assert options("gpu") == GPU
    assert options("cpu") == CPU


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_a_value_the_file_gives_always_wins(device: str) -> None:
    given = {"compile": False, "memory_format": "channels_first", "optimizer_impl": "for-loop"}
    got = options(device, given)
    assert {k: got[k] for k in given} == given
    if device == "gpu":  # the options it left unset still take their GPU defaults
        assert got["cudnn_benchmark"] is True
    # a value equal to the CPU default is still the user's on a GPU
    assert options(device, {"compile": False})["compile"] is False


def test_a_spec_made_by_hand_resolves_the_same_way() -> None:
    fields = dict(run_id="r", sweep_id="t", runner="torch_ddp", family="torch",
                  module="runners.torch.ddp", model="probe", num_devices=1,
                  virtual_devices=False, scaling="weak", batch_size_per_device=8,
                  global_batch_size=8, data="synthetic", precision="fp32", warmup_steps=1,
                  measure_steps=1, repeat=0, timeout_s=60, launcher="torchrun")
    gpu = RunSpec(device="gpu", options={"compile": False}, **fields).options
    assert gpu["compile"] is False and gpu["memory_format"] == "channels_last"
    assert RunSpec(device="cpu", options={}, **fields).options["compile"] is False


def test_gpu_default_is_the_default_unless_given() -> None:
    plain = Option(bool, False)
    assert not plain.has_gpu_default and plain.default_on("gpu") is False
    tuned = Option(bool, False, gpu_default=True)
    assert tuned.has_gpu_default and tuned.default_on("gpu") is True
    assert tuned.default_on("cpu") is False


def test_every_gpu_default_is_an_allowed_value() -> None:
    chosen = [(name, key, opt) for name, info in RUNNERS.items()
              for key, opt in info.options.items()
              if opt.has_gpu_default and opt.allowed is not None]
    assert chosen, "no runner option has a GPU default among allowed values"
    for name, key, opt in chosen:
        assert opt.gpu_default in opt.allowed, (name, key)
