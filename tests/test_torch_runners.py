"""The torch-family runners for real on CPU: a few steps at 1 and 2 gloo ranks through the CLI,
as a user runs them; what CPU ranks cannot do is unavailable; a dying rank ends the run."""

from __future__ import annotations

import re
import shutil
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bench.catalog.registry import RUNNERS
from bench.plan.runs import RunSpec
from bench.records.store import check_record
from bench.run.launch import launch
from contract.reasons import sentence
from models import get_spec
from tests.helpers.cli import REPO, run_cli
from tests.helpers.equivalence import make_inputs, step
from tests.helpers.sweeps import SAMPLED, SAMPLED_STEPS, by_runner, smoke_runs, smoke_sweep

pytestmark = [pytest.mark.slow, pytest.mark.framework("torch")]
# the data-parallel ones; the sharded torch_zero1 and torch_fsdp2: tests/test_torch_sharded.py
TORCH_RUNNERS = sorted(n for n, r in RUNNERS.items() if r.family == "torch" and not r.shards)
LAYOUTS = {"torch_ddp": "channels_first", "keras_torch": "channels_last"}
# every sweep here checks mechanics (the runners at 1 and 2 ranks, layout, precision, what CPU
# ranks refuse) on small_cnn; torch's MiniGoogLeNet: test_torch_models.py
MECHANICS = "models=[small_cnn]"
STEPS = SAMPLED_STEPS  # torch_sweep's timed steps


def test_torch_family_is_registered() -> None:
    assert TORCH_RUNNERS == ["keras_torch", "torch_ddp"]
    assert {"keras_torch", "torch_ddp", "torch_fsdp2", "torch_zero1", "deepspeed"} <= {
        n for n, r in RUNNERS.items() if r.family == "torch"}
    assert all(RUNNERS[n].launcher == "torchrun" for n in TORCH_RUNNERS)


@pytest.fixture(scope="module")
def torch_sweep(tmp_path_factory: pytest.TempPathFactory, torch_python: str
                ) -> dict[str, dict[int, dict]]:
    """The smoke config shortened with every runner of TORCH_RUNNERS in one sweep, on small_cnn
    (what is checked is the runners' mechanics, not the model) for SAMPLED steps (golden
    records); records by runner and devices."""
    out = tmp_path_factory.mktemp("torch-runners")
    return by_runner(smoke_runs(out, f"runners=[{','.join(TORCH_RUNNERS)}]", MECHANICS,
                                *SAMPLED))


@pytest.mark.parametrize("runner", TORCH_RUNNERS)
def test_runner_at_one_and_two_devices(runner: str, torch_sweep: dict) -> None:
    records = torch_sweep[runner]
    small_cnn = get_spec("small_cnn")
    assert sorted(records) == [1, 2]
    for n, rec in records.items():
        assert check_record(rec) == []
        log = Path(rec["log_path"]).read_text()
        assert rec["status"] == "ok", f"{rec['reason']}\n{log[-3000:]}"
        assert re.search(rf"-m torch\.distributed\.run --standalone --nnodes=1 "
                         rf"--nproc-per-node={n} --tee=3 --log-dir=\S+ "
                         rf"-m {re.escape(RUNNERS[runner].module)}", log.splitlines()[0])
        assert rec["virtual_devices"] is True
        assert rec["samples"] == STEPS * 8 * n
        assert rec["images_per_sec"] > 0 and len(rec["step_times_s"]) == STEPS
        result = rec["result"]
        assert result["replicas"] == n and result["backend"] == "gloo"
        assert result["layout"] == LAYOUTS[runner]
        assert result["framework"]["torch"].startswith("2.13.0")
        assert [d["name"] for d in rec["environment"]["devices"]] == [
            f"cpu (rank {i})" for i in range(n)]
        # every rank's optimizer-hook count, its threads and its process (runners/torch/dist.py)
        assert result["steps_per_rank"] == [STEPS] * n and result["batch_size_per_rank"] == 8
        assert [t["rank"] for t in result["rank_threads"]["per_rank"]] == list(range(n))
        assert all(t["torch_threads"] >= 1 for t in result["rank_threads"]["per_rank"])
        assert result["rank_threads"]["processes"] == n
        assert result["params"] == small_cnn.params == 60_746
        assert result["flops_per_sample"] == small_cnn.flops_per_sample == 11_288_576
        # where the timed steps ran, read back from the process group: each rank's device and
        # the rows it stepped on (STEPS steps of 8), gathered over gloo
        assert rec["placement"] == {f"rank{i}:cpu": STEPS * 8 for i in range(n)}
        assert f"get_backend()=gloo, get_world_size()={n}" in sentence(result["placement_source"])
        assert [r["param_devices"] for r in result["placement_ranks"]] == [["cpu"]] * n
        # fp32 is IEEE float32, read back from torch's own switches (runners/math_mode.py)
        assert result["math"]["torch"]["matmul"] == "ieee"
        assert result["math"]["torch"]["conv"] == "ieee"


@pytest.fixture(scope="module")
def bf16_sweep(tmp_path_factory: pytest.TempPathFactory, torch_python: str) -> dict[str, dict]:
    """Both runners at 2 ranks in bf16 in one sweep, each in its other layout (torch_ddp
    channels_last, keras_torch channels_first); the records by runner."""
    out = tmp_path_factory.mktemp("torch-bf16")
    records = smoke_runs(out, f"runners=[{','.join(TORCH_RUNNERS)}]", "devices=[2]",
                         "precision=bf16", MECHANICS,
                         "runner_options.torch_ddp.memory_format=channels_last",
                         "runner_options.keras_torch.data_format=channels_first")
    return {r["runner"]: r for r in records}


def test_torch_ddp_channels_last_bf16(bf16_sweep: dict) -> None:
    rec = bf16_sweep["torch_ddp"]
    assert rec["num_devices"] == 2 and rec["status"] == "ok", rec["reason"]
    assert rec["samples"] == 3 * 16
    assert rec["result"]["layout"] == "channels_last"
    assert rec["result"]["precision_details"]["autocast"] == "bfloat16"


def test_keras_torch_bf16_channels_first(bf16_sweep: dict) -> None:
    rec = bf16_sweep["keras_torch"]
    assert rec["num_devices"] == 2 and rec["status"] == "ok", rec["reason"]
    assert rec["result"]["dtype_policy"] == "mixed_bfloat16" and rec["samples"] == 3 * 16
    assert rec["result"]["layout"] == "channels_first"


def test_torch_ddp_compiled(tmp_path: Path, torch_python: str) -> None:
    """compile: true in mode reduce-overhead runs the step through torch.compile (TorchDynamo
    captured a graph) on both ranks, and the placement shows both; compile_evidence carries
    what torch reports: the mode, its graphs and graph breaks (reason -> count), DDPOptimizer's
    compiled graphs, and Inductor's CUDA graphs asked by the mode but skipped on CPU, with the
    reason a compiled graph holds (runners/torch/compile_evidence.py)."""
    records = smoke_sweep(tmp_path, "runners=[torch_ddp]", "devices=[2]", "models=[probe]",
                          "runner_options.torch_ddp.compile=true",
                          "runner_options.torch_ddp.compile_mode=reduce-overhead")
    rec = records[2]
    assert rec["status"] == "ok", rec["reason"]
    assert rec["result"]["compile"] is True and rec["result"]["compiled_graphs"] >= 1
    assert rec["placement"] == {"rank0:cpu": 3 * 8, "rank1:cpu": 3 * 8}
    evidence = rec["result"]["compile_evidence"]
    assert evidence["mode"] == "reduce-overhead"
    assert evidence["mode_options"]["triton.cudagraphs"] is True
    assert evidence["unique_graphs"] == rec["result"]["compiled_graphs"]
    assert isinstance(evidence["graph_breaks"], dict)
    assert all(isinstance(n, int) and n >= 1 for n in evidence["graph_breaks"].values())
    assert evidence["ddp_optimizer"]["aot_autograd_graphs"] >= evidence["unique_graphs"]
    cudagraphs = evidence["cudagraphs"]
    assert cudagraphs["asked"] is True and cudagraphs["skips"] >= 1
    # torch's words (on CPU: "skipping cudagraphs due to multiple devices: ", no device named)
    reasons = cudagraphs["graph_disable_reasons"]
    assert any(r.startswith("skipping cudagraphs due to") for r in reasons), reasons
    assert "tree_functions" not in cudagraphs  # no cudagraph trees on CPU


def test_what_cpu_ranks_cannot_do_is_unavailable(tmp_path: Path, torch_python: str) -> None:
    """fp16 (GradScaler) and the nccl backend need GPUs: unavailable records with the reason."""
    fp16 = smoke_sweep(tmp_path / "fp16", "runners=[torch_ddp]", "devices=[1]", "precision=fp16",
                       MECHANICS)
    assert fp16[1]["status"] == "unavailable" and "fp16" in fp16[1]["reason"]
    nccl = smoke_sweep(tmp_path / "nccl", "runners=[torch_ddp]", "devices=[2]", MECHANICS,
                       "runner_options.torch_ddp.backend=nccl")
    assert nccl[2]["status"] == "unavailable" and "nccl" in nccl[2]["reason"]


def test_torch_ddp_channels_last_step_equals_one_device(tmp_path: Path,
                                                        torch_python: str) -> None:
    """The equivalence test with channels_last ranks: the same weights as one NCHW device."""
    make_inputs(tmp_path / "inputs.npz")
    one = step("torch_ddp", 1, tmp_path / "inputs.npz", tmp_path, torch_python)
    two = step("torch_ddp", 2, tmp_path / "inputs.npz", tmp_path, torch_python,
               {"memory_format": "channels_last"})
    assert one, "the step wrote no weights"
    for name in one:
        np.testing.assert_allclose(two[name], one[name], rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("die", ["raise", "sigkill"])
def test_a_dying_rank_fails_the_run_without_a_hang(tmp_path: Path, torch_python: str,
                                                   die: str) -> None:
    """Rank 1 crashes (an exception, or SIGKILL) while rank 0 waits: torchrun stops rank 0, the
    run is a record that names the rank, how it died and its last lines."""
    spec = RunSpec(
        run_id="rank-crash", sweep_id="t", runner="rank_crash", family="torch",
        module="tests.children.rank_crash", model="probe", num_devices=2, device="cpu",
        virtual_devices=True, scaling="weak", batch_size_per_device=8, global_batch_size=16,
        data="synthetic", precision="fp32", warmup_steps=1, measure_steps=1, repeat=0,
        timeout_s=120, launcher="torchrun", options={"die": die})
    t0 = time.monotonic()
    rec = launch(spec, torch_python, tmp_path, {})
    assert time.monotonic() - t0 < 60
    assert check_record(rec) == []
    log = Path(rec["log_path"]).read_text()
    assert "rank 0 was not stopped" not in log
    if die == "raise":
        assert rec["status"] == "failed" and rec["returncode"] != 0, rec["reason"]
        assert rec["reason"] == "rank 1: RuntimeError: rank 1 crashed on purpose"
        assert "RuntimeError: rank 1 crashed on purpose" in log
        return
    assert rec["status"] == "oom", rec["reason"]
    assert rec["reason"].startswith(
        "rank 1 (local rank 1) was killed by SIGKILL (most likely the kernel's out-of-memory "
        "killer); its last lines: "), rec["reason"]
    # its stdout and stderr lines, in whichever order torchrun's tee read the two files
    said = rec["reason"].split("its last lines: ", 1)[1].split(" | ")
    assert {"rank 1 says hello", "rank 1 is about to die"} <= set(said), rec["reason"]
    # torchrun's copies of each rank's output stay beside the run's log, not in /tmp
    assert list((tmp_path / "runs" / "rank-crash.torchrun").rglob("stderr.log"))


# --- transformers and a user's own torch model (issue 26) ------------------------------------

@pytest.fixture(scope="module")
def transformer_sweep(tmp_path_factory: pytest.TempPathFactory,
                      torch_python: str) -> dict[tuple[str, int], dict]:
    """One sweep through the CLI: torch_ddp with gpt2_tiny and vit_tiny at 2 ranks (1 warm-up
    and 3 timed steps of 4 samples per rank; the 2-rank run checks all a 1-rank run would, and
    torch_ddp's 1-rank path runs in test_runner_at_one_and_two_devices); its records by
    (model, devices)."""
    from bench.records.store import load_records

    out = tmp_path_factory.mktemp("transformers")
    proc = run_cli("--config", "configs/cpu-smoke.yaml", "--out", str(out),
                   "--set", "runners=[torch_ddp]", "--set", "models=[gpt2_tiny,vit_tiny]",
                   "--set", "devices=[2]", "--set", "warmup_steps=1",
                   "--set", "measure_steps=3", "--set", "batch_size_per_device=4")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return {(r["model"], r["num_devices"]): r for r in load_records(out)}


@pytest.mark.parametrize("model", ["gpt2_tiny", "vit_tiny"])
def test_torch_ddp_trains_the_transformers(transformer_sweep: dict, model: str) -> None:
    n = 2
    assert sorted(transformer_sweep) == [(m, n) for m in ("gpt2_tiny", "vit_tiny")]
    rec, s = transformer_sweep[(model, n)], get_spec(model)
    assert rec["status"] == "ok", f"{rec['reason']}\n{Path(rec['log_path']).read_text()[-3000:]}"
    assert check_record(rec) == []
    result = rec["result"]
    assert rec["samples"] == 3 * 4 * n and result["steps_per_rank"] == [3] * n
    assert rec["placement"] == {f"rank{i}:cpu": 3 * 4 for i in range(n)}
    assert result["params"] == s.params
    assert result["flops_per_sample"] == s.flops_per_sample  # the spec's standard count
    assert result["flops_source"] == s.flops_source
    assert result["workload"] == "transformer"
    assert rec["tokens_per_sample"] == (64 if model == "gpt2_tiny" else None)
    # a fresh model's loss is about ln(outputs): next-token cross-entropy over the vocabulary
    assert abs(rec["first_loss"] - np.log(s.num_classes)) < 1.0
    # the CPU defaults, each recorded with what torch reports back
    assert result["compile"] is False and result["layout"] == "channels_first"
    assert result["optimizer"] == {"impl": "foreach", "class": "torch.optim.SGD",
                                   "foreach": True, "fused": None}
    assert result["gradient_as_bucket_view"] is True
    assert result["cudnn_benchmark"]["in_effect"] is False
    # cross_entropy at its default: float32, read back from the first step's autograd graph
    assert result["cross_entropy"]["applied"] == "float32"
    assert result["cross_entropy"]["computed_in"] == ["torch.float32"]


def custom_entry(folder: Path, build: str, args: dict[str, Any], inp: dict[str, Any]
                 ) -> dict[str, Any]:
    return {"name": "mynet", "framework": "torch", "build": f"mynets:{build}",
            "path": str(folder), "args": args, "input": inp}


def custom_run(tmp_path: Path, torch_python: str, entry: dict[str, Any], n: int,
               **options: Any) -> dict[str, Any]:
    """A torch_ddp run of a user's model, launched as the sweep launches it (the plan's side of
    a `models:` entry is the config's: this spec carries the entry as the plan would)."""
    spec = RunSpec(
        run_id=f"torch_ddp__mynet__n{n}", sweep_id="t", runner="torch_ddp", family="torch",
        module="runners.torch.ddp", model=entry["name"], num_devices=n, device="cpu",
        virtual_devices=True, scaling="weak", batch_size_per_device=4, global_batch_size=4 * n,
        data="synthetic", precision="fp32", warmup_steps=1, measure_steps=3, repeat=0,
        timeout_s=120, launcher="torchrun", options=options, custom_model=entry)
    return launch(spec, torch_python, tmp_path / "results", {})


@pytest.fixture(scope="module")
def mynets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's models in a folder of their own, outside the repository."""
    folder = tmp_path_factory.mktemp("mynets")
    shutil.copy(REPO / "tests/children/torch_user_models.py", folder / "mynets.py")
    return folder


def test_torch_ddp_trains_a_users_token_model(tmp_path: Path, torch_python: str,
                                              mynets: Path) -> None:
    entry = custom_entry(mynets, "make_lm", {"vocab": 50, "width": 8},
                         {"kind": "tokens", "seq_len": 12, "vocab": 50})
    rec = custom_run(tmp_path, torch_python, entry, 1)
    assert rec["status"] == "ok", f"{rec['reason']}\n{Path(rec['log_path']).read_text()[-3000:]}"
    result = rec["result"]
    assert result["params"] == 50 * 8 + 8 * 50 + 50
    assert result["flops_per_sample"] == 2 * 8 * 50 * 12  # the Linear over 12 positions
    assert rec["tokens_per_sample"] == 12 and result["workload"] == "custom"
    assert abs(rec["first_loss"] - np.log(50)) < 1.0


def test_a_users_model_that_is_not_a_module_is_invalid(tmp_path: Path, torch_python: str,
                                                       mynets: Path) -> None:
    entry = custom_entry(mynets, "make_nothing", {},
                         {"kind": "image", "shape": [3, 16, 16], "classes": 10})
    rec = custom_run(tmp_path, torch_python, entry, 1)
    assert rec["status"] == "invalid"
    assert rec["reason"] == ("models: mynet: mynets:make_nothing returned builtins.str, not a "
                             "torch.nn.Module")


def test_a_users_model_from_a_folder_outside_the_repo_runs_from_one_yaml_entry(
        tmp_path: Path, torch_python: str, mynets: Path) -> None:
    """Issue 26's done-when: one models: entry, torch_ddp at 1 and 2 devices, through the CLI
    as a user runs it (channels_last, so the layout reaches a user's module too)."""
    from bench.records.store import load_records

    config = tmp_path / "mine.yaml"
    config.write_text(textwrap.dedent(f"""\
        name: mine
        runners: [torch_ddp]
        runner_options: {{torch_ddp: {{memory_format: channels_last}}}}
        models:
          - name: mynet
            framework: torch
            build: "mynets:make_model"
            path: {mynets}
            args: {{width: 8}}
            input: {{kind: image, shape: [3, 16, 16], classes: 10}}
        devices: [1, 2]
        batch_size_per_device: 4
        device: cpu
        warmup_steps: 1
        measure_steps: 3
        """))
    proc = run_cli("--config", str(config), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = {r["num_devices"]: r for r in load_records(tmp_path / "out")}
    assert sorted(recs) == [1, 2]
    for n, rec in recs.items():
        assert rec["status"] == "ok", rec["reason"]
        assert rec["custom_model"]["path"] == str(mynets)
        result = rec["result"]
        # counted by torch: conv 3x3x3x8 + 8, BatchNorm 8 + 8 (and its running mean and
        # variance, 16, as count_params_torch counts them), fc 8x10 + 10; FLOPs: 2 x the
        # conv's and the fc's multiply-adds (FlopCounterMode over a batch of 1)
        assert result["params"] == 224 + 16 + 16 + 90
        assert result["flops_per_sample"] == 2 * 3 * 9 * 8 * 16 * 16 + 2 * 8 * 10
        assert result["flops_source"] == ("torch.utils.flop_counter.FlopCounterMode (forward, "
                                          "batch 1)")
        assert result["workload"] == "custom" and rec["tokens_per_sample"] is None
        assert result["layout"] == "channels_last"
        assert rec["samples"] == 3 * 4 * n
        # each rank's peak resident memory over the timed window
        memory = rec["memory_per_device"]
        assert sorted(memory) == [f"rank{r}:cpu" for r in range(n)], memory
        assert all(10e6 < b < 20e9 for b in memory.values()) and "VmHWM" in \
            sentence(rec["memory_source"])
        # float32 parameters and running statistics, and BatchNorm's int64 batch counter
        assert rec["model_state"]["params_bytes"] == 4 * (224 + 16 + 90) + 4 * 16 + 8
        assert sorted(rec["placement"]) == [f"rank{r}:cpu" for r in range(n)]
        assert rec["mfu"]["mfu"] is not None and rec["mfu"]["mfu"] > 0
