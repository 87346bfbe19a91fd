"""The harness's precision policy and the record of a run's resolved one
(contract/precision_policy.py)."""

from __future__ import annotations

import pytest

from contract.precision_policy import declared, dtype_name, harness_policy, resolve, summary


def test_bf16_keeps_float32_params_and_reduce() -> None:
    assert harness_policy("bf16") == {"compute": "bfloat16", "params": "float32",
                                      "master": None, "reduce": "float32",
                                      "loss_scaling": None}
    with pytest.raises(KeyError):
        harness_policy("int8")


def test_a_run_that_does_what_the_harness_says_follows_it() -> None:
    p = resolve("bf16", how="torch.autocast(cpu, bfloat16)", compute="torch.bfloat16",
                params="torch.float32", reduce="torch.float32")
    assert p["follows"] is True and p["differs"] is None
    assert p["compute"] == "bfloat16" and p["params"] == "float32"
    assert summary(p) == "bf16 compute, fp32 params, fp32 reduce"


def test_bf16_params_with_fp32_master_copies_differ_and_say_how() -> None:
    p = resolve("bf16", how="DeepSpeed bf16", compute="bfloat16", params="bfloat16",
                master="float32", reduce="float32")
    assert p["follows"] is False
    assert p["differs"] == "params bfloat16 (harness: float32); master float32 (harness: none)"
    assert summary(p) == "bf16 compute, bf16 params, fp32 reduce, fp32 master (differs)"


def test_fp16_without_loss_scaling_differs() -> None:
    p = resolve("fp16", how="x", compute="float16", params="float32", reduce="float32")
    assert p["differs"] == "loss_scaling none (harness: dynamic)"


def test_a_policy_not_read_back_is_declared() -> None:
    p = declared("fp32")
    assert p["follows"] is None and "not read back" in p["how"]
    assert summary(p) == "fp32 compute, fp32 params, fp32 reduce (declared)"
    assert summary(None) == ""


def test_dtype_names_of_each_framework_are_plain() -> None:
    assert dtype_name("torch.bfloat16") == "bfloat16"
    assert dtype_name("<dtype: 'float32'>") == "float32"
    assert dtype_name(None) is None
