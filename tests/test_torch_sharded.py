"""The sharded torch runners for real on CPU (issue 27): torch_zero1 (DDP +
ZeroRedundancyOptimizer) and torch_fsdp2 (fully_shard per block and root) train gpt2_tiny at 1
and 2 gloo ranks through the CLI, beside torch_ddp, and each 2-device record shows its model
state split as its strategy says, read from the framework (ZeroRedundancyOptimizer's partition,
DTensor shards); a CNN with BatchNorm in bf16 at 2 ranks each; the precision policy recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.catalog.registry import RUNNERS
from bench.records.store import check_record, load_records
from contract.reasons import sentence
from models import get_spec
from models.gpt2_tiny.spec import SHAPE as GPT2_TINY
from tests.helpers.cli import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.framework("torch")]
SHARDED = ("torch_zero1", "torch_fsdp2")
PARTS = ("params", "grads", "optimizer")


def sweep(out: Path, *sets: str) -> dict[tuple[str, str, int], dict]:
    """The CPU smoke config through the CLI (1 warm-up, 3 timed steps of 4 samples per rank)
    with `sets`; its records by (runner, model, devices)."""
    args = ["--config", "configs/cpu-smoke.yaml", "--out", str(out), "--set", "warmup_steps=1",
            "--set", "measure_steps=3", "--set", "batch_size_per_device=4"]
    for s in sets:
        args += ["--set", s]
    proc = run_cli(*args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {(r["runner"], r["model"], r["num_devices"]): r for r in load_records(out)}


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory, torch_python: str
            ) -> dict[tuple[str, str, int], dict]:
    """gpt2_tiny on torch_ddp, torch_zero1 and torch_fsdp2 at 1 and 2 ranks (fp32), and
    minigooglenet (BatchNorm) on the two sharded runners at 2 ranks in bf16."""
    out = tmp_path_factory.mktemp("sharded")
    recs = sweep(out / "gpt2", "runners=[torch_ddp,torch_zero1,torch_fsdp2]",
                 "models=[gpt2_tiny]", "devices=[1,2]")
    recs.update(sweep(out / "cnn", "runners=[torch_zero1,torch_fsdp2]",
                      "models=[minigooglenet]", "devices=[2]", "precision=bf16"))
    for rec in recs.values():
        log = Path(rec["log_path"]).read_text()
        assert rec["status"] == "ok", f"{rec['reason']}\n{log[-3000:]}"
        assert check_record(rec) == []
    return recs


def test_the_sharded_runners_are_registered_as_they_shard() -> None:
    assert RUNNERS["torch_zero1"].shards == ("optimizer",)
    assert RUNNERS["torch_fsdp2"].shards == ("params", "grads", "optimizer")
    for name in SHARDED:
        info = RUNNERS[name]
        assert info.launcher == "torchrun" and info.workloads == ("cnn", "transformer")
        assert info.multi_node == RUNNERS["torch_ddp"].multi_node


@pytest.mark.parametrize("runner", ["torch_ddp", *SHARDED])
@pytest.mark.parametrize("n", [1, 2])
def test_gpt2_tiny_trains_and_reports_its_state(records: dict, runner: str, n: int) -> None:
    rec, s = records[(runner, "gpt2_tiny", n)], get_spec("gpt2_tiny")
    result = rec["result"]
    assert rec["samples"] == 3 * 4 * n and result["steps_per_rank"] == [3] * n
    assert rec["placement"] == {f"rank{i}:cpu": 3 * 4 for i in range(n)}
    assert result["params"] == s.params and rec["tokens_per_sample"] == 64
    per_device, whole = rec["state_bytes_per_device"], rec["state_bytes_global"]
    assert sorted(per_device) == [f"rank{i}:cpu" for i in range(n)]
    # float32 parameters (the tied embedding once), a gradient for each, one momentum buffer
    # each: the logical sizes as the framework states them
    assert whole == {part: 4 * s.params for part in PARTS}
    assert "after the timed window" in sentence(rec["state_source"])
    policy = rec["precision_policy"]
    assert policy["precision"] == "fp32" and policy["follows"] is True
    assert (policy["compute"], policy["params"], policy["reduce"]) == ("float32",) * 3
    assert policy["master"] is None and policy["loss_scaling"] is None


def held(rec: dict, part: str) -> list[int]:
    return [v[part] for _, v in sorted(rec["state_bytes_per_device"].items())]


def test_ddp_holds_full_replicas(records: dict) -> None:
    rec = records[("torch_ddp", "gpt2_tiny", 2)]
    whole = rec["state_bytes_global"]
    for part in PARTS:
        assert held(rec, part) == [whole[part]] * 2, part


def test_zero1_splits_only_the_optimizer_state_by_its_partition(records: dict) -> None:
    """ZeroRedundancyOptimizer: each rank's local optimizer holds the momentum of the whole
    parameters its partition assigns it (about half the elements each); parameters and
    gradients stay full DDP replicas."""
    rec = records[("torch_zero1", "gpt2_tiny", 2)]
    result, whole = rec["result"], rec["state_bytes_global"]
    assert held(rec, "params") == [whole["params"]] * 2
    assert held(rec, "grads") == [whole["grads"]] * 2
    optimizer = held(rec, "optimizer")
    assert sum(optimizer) == whole["optimizer"]
    assert all(0 < b <= 0.55 * whole["optimizer"] for b in optimizer), optimizer
    partition = result["optimizer_partition"]["ranks"]
    assert [r["rank"] for r in partition] == [0, 1]
    assert sum(r["elements"] for r in partition) == get_spec("gpt2_tiny").params
    # whole parameters: the largest, the tied embedding (vocab x d), on one rank
    assert result["optimizer_partition"]["largest_parameter_elements"] == \
        GPT2_TINY.vocab * GPT2_TINY.d_model
    # each rank's momentum buffers are exactly its partition's elements, in float32
    assert [4 * r["elements"] for r in partition] == optimizer
    assert rec["precision_policy"]["how"] == "no autocast: float32 parameters and compute"


def test_fsdp2_splits_parameters_gradients_and_optimizer_state(records: dict) -> None:
    """fully_shard: every parameter a DTensor sharded over the 2 ranks (gpt2_tiny's dims are
    even, so exactly half each), its gradient and momentum buffer too; the units as torchtitan
    makes them, the last block left gathered after forward."""
    rec = records[("torch_fsdp2", "gpt2_tiny", 2)]
    result, whole = rec["result"], rec["state_bytes_global"]
    for part in PARTS:
        assert held(rec, part) == [whole[part] // 2] * 2, part
    assert "DTensor.to_local()" in sentence(rec["state_source"])
    units = {u["module"]: u for u in result["fsdp"]["units"]}
    assert sorted(units) == ["(root)", "blocks.0", "blocks.1"]
    assert units["blocks.0"]["reshard_after_forward"] is True
    assert units["blocks.1"]["reshard_after_forward"] is False  # backward starts with it
    assert result["fsdp"]["mesh"] == {"shape": [2], "dim_names": ["dp_shard"],
                                      "device_type": "cpu"}
    assert "MixedPrecisionPolicy(param_dtype=None, reduce_dtype=None)" in \
        rec["precision_policy"]["how"]


@pytest.mark.parametrize("runner", SHARDED)
def test_a_batchnorm_cnn_in_bf16(records: dict, runner: str) -> None:
    """minigooglenet at 2 ranks in bf16: the split as the strategy says, and the harness's
    bf16 policy (bfloat16 compute, float32 parameters and reduction) read back; under FSDP2
    the BatchNorm layers are units of their own that keep float32 parameters."""
    rec = records[(runner, "minigooglenet", 2)]
    result, whole = rec["result"], rec["state_bytes_global"]
    assert rec["samples"] == 3 * 4 * 2
    sharded = RUNNERS[runner].shards
    for part in PARTS:
        if part in sharded:
            assert sum(held(rec, part)) == whole[part]
            assert max(held(rec, part)) <= 0.55 * whole[part], part
        else:
            assert held(rec, part) == [whole[part]] * 2, part
    policy = rec["precision_policy"]
    assert policy["precision"] == "bf16" and policy["follows"] is True
    assert (policy["compute"], policy["params"], policy["reduce"]) == (
        "bfloat16", "float32", "float32")
    if runner == "torch_fsdp2":
        assert "param_dtype=bfloat16, reduce_dtype=float32" in policy["how"]
        norms = [u for u in result["fsdp"]["units"] if u.get("param_dtype") == "None"]
        assert norms and all(u["reduce_dtype"] == "torch.float32" for u in norms)
    else:
        assert policy["how"] == "torch.autocast(cpu, bfloat16)"
