"""The torch-family runners for real on CPU: a few steps at 1 and 2 gloo ranks through the CLI,
as a user runs them; what CPU ranks cannot do is unavailable; a dying rank ends the run."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from bench.catalog.registry import RUNNERS
from bench.plan.runs import RunSpec
from bench.records.store import check_record
from bench.run.launch import launch
from tests.conftest import smoke_sweep
from tests.test_equivalence import make_inputs, step

pytestmark = [pytest.mark.slow, pytest.mark.framework("torch")]
TORCH_RUNNERS = sorted(n for n, r in RUNNERS.items() if r.family == "torch")
LAYOUTS = {"torch_ddp": "channels_first", "keras_torch": "channels_last"}


def test_torch_family_is_registered() -> None:
    assert TORCH_RUNNERS == ["keras_torch", "torch_ddp"]
    assert all(RUNNERS[n].launcher == "torchrun" for n in TORCH_RUNNERS)


@pytest.mark.parametrize("runner", TORCH_RUNNERS)
def test_runner_at_one_and_two_devices(runner: str, tmp_path: Path, torch_python: str) -> None:
    records = smoke_sweep(tmp_path / runner, f"runners=[{runner}]")
    assert sorted(records) == [1, 2]
    for n, rec in records.items():
        assert check_record(rec) == []
        log = Path(rec["log_path"]).read_text()
        assert rec["status"] == "ok", f"{rec['reason']}\n{log[-3000:]}"
        assert f"-m torch.distributed.run --standalone --nnodes=1 --nproc-per-node={n} " \
               f"-m {RUNNERS[runner].module}" in log.splitlines()[0]
        assert rec["virtual_devices"] is True
        assert rec["samples"] == 3 * 8 * n
        assert rec["images_per_sec"] > 0 and len(rec["step_times_s"]) == 3
        result = rec["result"]
        assert result["replicas"] == n and result["backend"] == "gloo"
        assert result["layout"] == LAYOUTS[runner]
        assert result["framework"]["torch"].startswith("2.13.0")
        assert [d["name"] for d in rec["environment"]["devices"]] == [
            f"cpu (rank {i})" for i in range(n)]
        # every rank's optimizer-hook count, its threads and its process (runners/torch/dist.py)
        assert result["steps_per_rank"] == [3] * n and result["batch_size_per_rank"] == 8
        assert [t["rank"] for t in result["rank_threads"]["per_rank"]] == list(range(n))
        assert all(t["torch_threads"] >= 1 for t in result["rank_threads"]["per_rank"])
        assert result["rank_threads"]["processes"] == n
        assert result["params"] == 1_656_250 and result["flops_per_sample"] == 469_195_840
        # where the timed steps ran, read back from the process group: each rank's device and
        # the rows it stepped on (3 steps of 8), gathered over gloo
        assert rec["placement"] == {f"rank{i}:cpu": 3 * 8 for i in range(n)}
        assert f"get_backend()=gloo, get_world_size()={n}" in result["placement_source"]
        assert [r["param_devices"] for r in result["placement_ranks"]] == [["cpu"]] * n
        # fp32 is IEEE float32, read back from torch's own switches (runners/math_mode.py)
        assert result["math"]["torch"]["matmul"] == "ieee"
        assert result["math"]["torch"]["conv"] == "ieee"


def test_torch_ddp_channels_last_bf16(tmp_path: Path, torch_python: str) -> None:
    records = smoke_sweep(tmp_path, "runners=[torch_ddp]", "devices=[2]", "precision=bf16",
                    "runner_options.torch_ddp.memory_format=channels_last")
    rec = records[2]
    assert rec["status"] == "ok", rec["reason"]
    assert rec["samples"] == 3 * 16
    assert rec["result"]["layout"] == "channels_last"
    assert rec["result"]["precision_details"]["autocast"] == "bfloat16"


def test_keras_torch_bf16_channels_first(tmp_path: Path, torch_python: str) -> None:
    records = smoke_sweep(tmp_path, "runners=[keras_torch]", "devices=[2]", "precision=bf16",
                    "runner_options.keras_torch.data_format=channels_first")
    rec = records[2]
    assert rec["status"] == "ok", rec["reason"]
    assert rec["result"]["dtype_policy"] == "mixed_bfloat16" and rec["samples"] == 3 * 16
    assert rec["result"]["layout"] == "channels_first"


def test_torch_ddp_compiled(tmp_path: Path, torch_python: str) -> None:
    """compile: true runs the step through torch.compile (TorchDynamo captured a graph) on both
    ranks, and the placement shows both."""
    records = smoke_sweep(tmp_path, "runners=[torch_ddp]", "devices=[2]", "models=[probe]",
                          "runner_options.torch_ddp.compile=true")
    rec = records[2]
    assert rec["status"] == "ok", rec["reason"]
    assert rec["result"]["compile"] is True and rec["result"]["compiled_graphs"] >= 1
    assert rec["placement"] == {"rank0:cpu": 3 * 8, "rank1:cpu": 3 * 8}


def test_what_cpu_ranks_cannot_do_is_unavailable(tmp_path: Path, torch_python: str) -> None:
    """fp16 (GradScaler) and the nccl backend need GPUs: unavailable records with the reason."""
    fp16 = smoke_sweep(tmp_path / "fp16", "runners=[torch_ddp]", "devices=[1]", "precision=fp16")
    assert fp16[1]["status"] == "unavailable" and "fp16" in fp16[1]["reason"]
    nccl = smoke_sweep(tmp_path / "nccl", "runners=[torch_ddp]", "devices=[2]",
                 "runner_options.torch_ddp.backend=nccl")
    assert nccl[2]["status"] == "unavailable" and "nccl" in nccl[2]["reason"]


def test_torch_ddp_channels_last_step_equals_one_device(tmp_path: Path,
                                                        torch_python: str) -> None:
    """The equivalence test with channels_last ranks: the same weights as one NCHW device."""
    make_inputs(tmp_path / "inputs.npz")
    one = step("torch_ddp", 1, tmp_path / "inputs.npz", tmp_path, torch_python)
    two = step("torch_ddp", 2, tmp_path / "inputs.npz", tmp_path, torch_python,
               {"memory_format": "channels_last"})
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_dying_rank_fails_the_run_without_a_hang(tmp_path: Path, torch_python: str) -> None:
    """Rank 1 crashes while rank 0 waits: torchrun stops rank 0, the run is a failed record."""
    spec = RunSpec(
        run_id="rank-crash", sweep_id="t", runner="rank_crash", family="torch",
        module="tests.children.rank_crash", model="probe", num_devices=2, device="cpu",
        virtual_devices=True, scaling="weak", batch_size_per_device=8, global_batch_size=16,
        data="synthetic", precision="fp32", warmup_steps=1, measure_steps=1, repeat=0,
        timeout_s=120, launcher="torchrun")
    t0 = time.monotonic()
    rec = launch(spec, torch_python, tmp_path, {})
    assert time.monotonic() - t0 < 60
    assert check_record(rec) == []
    assert rec["status"] == "failed" and rec["returncode"] != 0, rec["reason"]
    assert rec["reason"] == "rank 1: RuntimeError: rank 1 crashed on purpose"
    log = Path(rec["log_path"]).read_text()
    assert "RuntimeError: rank 1 crashed on purpose" in log
    assert "rank 0 was not stopped" not in log
