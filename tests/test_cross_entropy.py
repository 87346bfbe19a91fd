"""The `cross_entropy` option of torch_ddp and jax_native (issue 39; contract/cross_entropy.py):
the catalogs, the CLI's refusal of a bad value, and (slow) gpt2_tiny in bf16 with each value
through the CLI: the first timed loss of `chunked` equals `float32`'s within 1e-5 (relative),
`bf16_logits`'s within 2% (docs/EQUIVALENCE.md says why), each record saying what ran and the
dtype the loss computed in, read back from the framework."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.catalog.registry import RUNNERS
from bench.records.store import check_record, load_records
from contract import cross_entropy as ce
from tests.helpers.cli import run_cli

RUNNER_NAMES = ("torch_ddp", "jax_native")
# the first timed loss of each value against float32's: relative tolerance
TOLERANCE = {"chunked": 1e-5, "bf16_logits": 0.02}


@pytest.mark.parametrize("runner", RUNNER_NAMES)
def test_the_option_is_the_runners_with_its_equivalence_cases(runner: str) -> None:
    info = RUNNERS[runner]
    assert info.options["cross_entropy"] is ce.OPTION
    assert ce.OPTION.default == "float32" and ce.OPTION.allowed == ce.VALUES
    for case in ce.EQUIVALENCE:
        assert case in info.equivalence_options


def test_what_the_loss_computes_for_each_value() -> None:
    assert ce.applied("chunked", 3, "torch.bfloat16") == ("chunked", None)
    assert ce.applied("bf16_logits", 3, "bfloat16") == ("bf16_logits", None)
    assert ce.applied("bf16_logits", 3, "float32") == ("float32", ce.NOTE_FP32)
    assert ce.applied("bf16_logits", 3, "torch.float32") == ("float32", ce.NOTE_FP32)
    for value in ce.VALUES:
        assert ce.applied(value, 2, "bfloat16") == ("float32", ce.NOTE_2D)


@pytest.mark.parametrize("runner", RUNNER_NAMES)
def test_a_bad_value_is_refused_in_one_line(runner: str) -> None:
    proc = run_cli("run", "--config", "configs/cpu-smoke.yaml", "--dry-run",
                   "--set", f"runners=[{runner}]",
                   "--set", f"runner_options.{runner}.cross_entropy=fused")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0
    assert "cross_entropy: 'fused' is not allowed" in proc.stderr


def test_list_shows_the_option() -> None:
    proc = run_cli("list")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("cross_entropy='float32' (float32 | bf16_logits | chunked)") == 2


def sweep(tmp_path: Path, runner: str) -> dict[str, dict]:
    """gpt2_tiny on one CPU device in bf16 with each value (1 warm-up and 2 timed steps of 4
    sequences); the records by value."""
    out = tmp_path / runner
    proc = run_cli("--config", "configs/cpu-smoke.yaml", "--out", str(out),
                   "--set", f"runners=[{runner}]", "--set", "models=[gpt2_tiny]",
                   "--set", "devices=[1]", "--set", "precision=bf16",
                   "--set", "warmup_steps=1", "--set", "measure_steps=2",
                   "--set", "batch_size_per_device=4",
                   "--set", f"runner_options.{runner}.cross_entropy=[{','.join(ce.VALUES)}]")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {r["options"]["cross_entropy"]: r for r in load_records(out)}


def check_losses(records: dict[str, dict]) -> None:
    """Every run ok and valid, each value's first timed loss near float32's."""
    assert sorted(records) == sorted(ce.VALUES)
    for rec in records.values():
        assert rec["status"] == "ok", rec["reason"]
        assert check_record(rec) == []
        assert rec["result"]["cross_entropy"]["applied"] == rec["options"]["cross_entropy"]
    base = records["float32"]["first_loss"]
    for value, tolerance in TOLERANCE.items():
        assert records[value]["first_loss"] == pytest.approx(base, rel=tolerance), value


def check_read(records: dict[str, dict], logits: str, expected: dict[str, dict]) -> None:
    """Each value's record: the logits' dtype and the `expected` fields of what was read."""
    for value, fields in expected.items():
        read = records[value]["result"]["cross_entropy"]
        assert read["logits_dtype"] == logits
        assert {k: read[k] for k in fields} == fields, read


@pytest.mark.slow
@pytest.mark.framework("torch")
def test_torch_ddp_gpt2_tiny_with_each_value(tmp_path: Path) -> None:
    records = sweep(tmp_path, "torch_ddp")
    check_losses(records)
    # read back from the autograd graph: autocast left the logits bf16; bf16_logits' loss ran
    # in bfloat16 (outside autocast, whose policy would compute cross_entropy in float32)
    check_read(records, "torch.bfloat16", {
        "float32": {"computed_in": ["torch.float32"], "log_softmax_calls": 1},
        "bf16_logits": {"computed_in": ["torch.bfloat16"], "log_softmax_calls": 1},
        "chunked": {"computed_in": ["torch.float32"], "log_softmax_calls": ce.CHUNKS}})


@pytest.mark.slow
@pytest.mark.framework("jax")
def test_jax_native_gpt2_tiny_with_each_value(tmp_path: Path) -> None:
    records = sweep(tmp_path, "jax_native")
    check_losses(records)
    # read from the loss's jaxpr: the exp over the vocabulary in each dtype; chunked's blocks
    # in lax.map under one checkpoint
    check_read(records, "bfloat16", {
        "float32": {"computed_in": ["float32"], "chunks": 1, "checkpoint_calls": 0},
        "bf16_logits": {"computed_in": ["bfloat16"], "chunks": 1, "checkpoint_calls": 0},
        "chunked": {"computed_in": ["float32"], "chunks": ce.CHUNKS, "checkpoint_calls": 1}})
    for rec in records.values():
        assert rec["result"]["compiled_memory"]["temp_bytes"] > 0
