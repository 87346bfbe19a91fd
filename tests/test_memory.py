"""Memory per device, the model state, tokens/sec and FLOPs per token (issue 26): what the
child measures over its timed window (runners/memory.py), how the parent merges the ranks'
memory (bench/run/verdict.py), derives the token figures and MFU's FLOPs (bench/run/launch.py)
and shows them (columns, summary, charts, report.html); one real 2-rank torch run."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.analysis.stats import summarise
from bench.records import columns
from bench.records.store import check_record, record_path, write_json_atomic
from bench.report.charts import MEMORY_CHART, TOKENS_CHART
from bench.report.summary import build_report, format_table
from bench.run.launch import derive_throughput, run_mfu
from bench.run.verdict import merge_memory
from contract import launch_env
from contract.reasons import sentence
from models import get_spec
from runners import memory
from tests.helpers.records import run_record

MB = 2**20


def rss() -> int:
    """This process's resident memory now (VmRSS), bytes."""
    text = Path("/proc/self/status").read_text()
    return int(next(ln.split()[1] for ln in text.splitlines() if ln.startswith("VmRSS:"))) * 1024


def spec(**fields: object) -> SimpleNamespace:
    base = {"model": "minigooglenet", "mode": "benchmark", "num_devices": 2, "num_nodes": 1,
            "launcher": "python", "custom_model": None, "virtual_devices": True}
    return SimpleNamespace(**{**base, **fields})


# -- the child: runners/memory.py ----------------------------------------------------------

def test_window_reads_the_process_peak_over_the_window_only() -> None:
    """On CPU (no framework imported here) the window's figure is the process's peak resident
    memory since the window started: a larger peak before it is not counted, one inside is."""
    before = bytearray(192 * MB)  # a peak before the window...
    before[::4096] = b"x" * len(before[::4096])
    del before
    memory.expect(None)
    memory.window_start()
    start = rss()
    inside = bytearray(64 * MB)  # ... and a smaller one inside it
    inside[::4096] = b"y" * len(inside[::4096])
    del inside
    got = memory.window_end()
    assert got is not None and got["devices"] == {}
    assert "VmHWM" in sentence(got["source"]) and "clear_refs" in sentence(got["source"])
    assert got["cpu"] >= start + 60 * MB  # the peak inside the window
    assert got["cpu"] < start + 150 * MB  # not the 192 MB before it


def test_without_clear_refs_it_says_peak_since_start(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path) -> None:
    monkeypatch.setattr(memory, "CLEAR_REFS", tmp_path / "no" / "clear_refs")
    memory.window_start()
    got = memory.window_end()
    assert got is not None and got["cpu"] > 0
    source = sentence(got["source"])
    assert "since the process started" in source and "ru_maxrss" in source


def test_result_keys_a_rank_s_device_or_a_process_s_virtual_devices(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "last", {"devices": {}, "cpu": 300 * MB, "source": "VmHWM"})
    monkeypatch.setattr(memory, "_baseline", None)  # no baseline read: no device peak
    ranks = memory.for_result(spec(launcher="torchrun"), 1)
    assert ranks == {"memory_per_device": {"rank1:cpu": 300 * MB}, "memory_source": "VmHWM",
                     "device_peak_bytes": None, "memory_baseline": None}
    shared = memory.for_result(spec(num_devices=4), 0)
    assert shared["memory_per_device"] == {"process0:cpu (4 virtual devices)": 300 * MB}
    assert "4 virtual CPU devices share this one process" in sentence(shared["memory_source"])
    assert memory.for_result(spec(num_devices=1), 0)["memory_per_device"] == {
        "process0:cpu": 300 * MB}
    gpus = {"devices": {"cuda:0": 5 * 2**30}, "cpu": None, "source": "torch.cuda"}
    monkeypatch.setattr(memory, "last", gpus)
    assert memory.for_result(spec(launcher="torchrun"), 3)["memory_per_device"] == {
        "rank3:cuda:0": 5 * 2**30}
    monkeypatch.setattr(memory, "last", None)  # no timed window: nothing, never a 0
    nothing = memory.for_result(spec(), 0)
    assert nothing["memory_per_device"] is None
    assert "no timed window" in sentence(nothing["memory_source"])


def test_cpu_device_peak_is_over_the_baseline(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CPU the device peak capacity mode checks is the window's peak less the resident
    memory before the model was built; a process's N virtual devices each get 1/N; on a GPU
    it is the allocator's peak."""
    monkeypatch.setattr(memory, "last", {"devices": {}, "cpu": 300 * MB, "source": "VmHWM"})
    monkeypatch.setattr(memory, "_baseline", 100 * MB)
    rank = memory.for_result(spec(launcher="torchrun"), 1)
    assert rank["device_peak_bytes"] == {"rank1:cpu": 200 * MB}
    assert rank["memory_baseline"] == {"rank1:cpu": 100 * MB}
    assert "less the process's resident memory before the model" in sentence(rank["memory_source"])
    shared = memory.for_result(spec(num_devices=4), 0)
    assert shared["device_peak_bytes"] == {"process0:cpu (4 virtual devices)": 50 * MB}
    assert "divided by the 4 virtual devices" in sentence(shared["memory_source"])
    gpus = {"devices": {"cuda:0": 5 * 2**30}, "cpu": None, "source": "torch.cuda"}
    monkeypatch.setattr(memory, "last", gpus)
    gpu = memory.for_result(spec(launcher="torchrun", device="gpu"), 0)
    assert gpu["device_peak_bytes"] == gpu["memory_per_device"] == {"rank0:cuda:0": 5 * 2**30}
    assert gpu["memory_baseline"] is None


def test_baseline_reads_this_process() -> None:
    memory.baseline()
    assert memory._baseline is not None and memory._baseline > 1 * MB


def test_model_state_of_keras_variables() -> None:
    """Bytes from each variable's shape and dtype: weights (trainable and not), gradients as
    the trainable weights, the optimizer's variables."""
    var = lambda shape, dtype: SimpleNamespace(shape=shape, dtype=dtype)  # noqa: E731
    kernel, bias, moving = var((3, 4), "float32"), var((4,), "float32"), var((4,), "bfloat16")
    model = SimpleNamespace(weights=[kernel, bias, moving], trainable_weights=[kernel, bias],
                            optimizer=SimpleNamespace(variables=[var((), "int64"),
                                                                 var((3, 4), "float32")]))
    state = memory.model_state_keras(model)["model_state"]
    assert (state["params_bytes"], state["grads_bytes"], state["optimizer_bytes"]) == (
        48 + 16 + 8, 48 + 16, 8 + 48)
    assert state["total_bytes"] == 72 + 64 + 56 and "keras" in sentence(state["source"])


# -- the parent: merging the ranks, deriving the figures -------------------------------------

def test_ranks_memory_files_are_merged_and_a_missing_one_is_said(tmp_path: Path) -> None:
    result = tmp_path / "run.abcd.result.json"
    rec = {"memory_per_device": {"rank0:cpu": 400 * MB}, "memory_source": "VmHWM"}
    write_json_atomic(launch_env.side_file(result, 1),
                      {"rank": 1, "memory_per_device": {"rank1:cpu": 410 * MB},
                       "memory_source": "VmHWM"})
    merge_memory(rec, result, spec(launcher="torchrun", num_devices=3))
    assert rec["memory_per_device"] == {"rank0:cpu": 400 * MB, "rank1:cpu": 410 * MB}
    assert rec["memory_source"].startswith("VmHWM; no memory from rank 2 (no ")
    assert "of 3: its devices are not in memory_per_device" in sentence(rec["memory_source"])
    assert not list(tmp_path.glob("*.memory.rank*"))  # read into the record, removed
    one = {"memory_per_device": {"process0:cpu": 1}, "memory_source": "x"}
    merge_memory(one, result, spec())  # one process: nothing to merge
    assert one == {"memory_per_device": {"process0:cpu": 1}, "memory_source": "x"}


def test_tokens_per_sec_and_flops_per_token_of_a_token_model() -> None:
    gpt = get_spec("gpt2_tiny")
    tokens = gpt.tokens_per_sample
    assert tokens and tokens > 1
    rec = {"images_per_sec": 10.0, "tokens_per_sample": None, "result": {}}
    derive_throughput(rec, spec(model="gpt2_tiny", num_devices=2), "ok")
    assert rec["samples_per_sec"] == 10.0 and rec["tokens_per_sample"] == tokens
    assert rec["tokens_per_sec"] == 10.0 * tokens
    assert rec["tokens_per_sec_per_device"] == 5.0 * tokens
    assert rec["flops_per_token"] == 3 * gpt.flops_per_sample / tokens
    cnn = {"images_per_sec": 10.0, "tokens_per_sample": None, "result": {}}
    derive_throughput(cnn, spec(), "ok")  # images: no tokens
    assert cnn["samples_per_sec"] == 10.0
    assert cnn["tokens_per_sec"] is None and cnn["flops_per_token"] is None
    failed = {"images_per_sec": None, "tokens_per_sample": tokens, "result": {}}
    derive_throughput(failed, spec(model="gpt2_tiny"), "failed")
    assert failed["tokens_per_sec"] is None and failed["samples_per_sec"] is None


def test_mfu_of_a_user_s_model_uses_the_run_s_own_count() -> None:
    peak = {"status": "ok", "peak_flops": 1e12}
    custom = spec(model="mine", custom_model={"name": "mine"}, num_devices=1,
                  virtual_devices=False)
    rec = {"result": {"flops_per_sample": 1e9, "flops_source": "torch FlopCounterMode"}}
    out = run_mfu(custom, 100.0, peak, rec)
    assert out["mfu"] == pytest.approx(3 * 1e9 * 100.0 / 1e12)
    assert out["flops_source"] == "counted in the run: torch FlopCounterMode"
    uncounted = run_mfu(custom, 100.0, peak, {"result": {}})
    assert uncounted["mfu"] is None and "no forward FLOPs" in uncounted["flops_source"]
    builtin = run_mfu(spec(num_devices=1), 100.0, peak, rec)  # the spec's standard count
    assert builtin["training_flops_per_sample"] == 3 * get_spec("minigooglenet").flops_per_sample
    assert builtin["flops_source"].startswith("models/minigooglenet/spec.py")


# -- what a person reads ---------------------------------------------------------------------

def token_record(n: int, ips: float, mem: dict | None) -> dict:
    rec = run_record(n, 0, ips)
    tokens = get_spec("gpt2_tiny").tokens_per_sample
    rec.update(model="gpt2_tiny", run_id=rec["run_id"].replace("minigooglenet", "gpt2_tiny"),
               tokens_per_sample=tokens, samples_per_sec=ips, tokens_per_sec=ips * tokens,
               tokens_per_sec_per_device=ips * tokens / n, memory_per_device=mem,
               memory_source="VmHWM" if mem else None,
               model_state={"total_bytes": 30 * MB} if mem else None)
    return rec


def test_a_record_without_memory_shows_none_not_zero(tmp_path: Path) -> None:
    """Memory (the most any device held) and tokens/sec in the summary, csv, tables, charts
    and report; a record that measured none shows - (None in the row), never 0, and a CNN
    sweep's table gains no token or memory column."""
    recs = [token_record(1, 4.0, {"process0:cpu": 300 * MB}),
            token_record(2, 6.0, {"process0:cpu (2 virtual devices)": 2 * 2**30}),
            {**run_record(1, 0, 100.0), "memory_per_device": None},
            {**run_record(2, 0, 150.0), "memory_per_device": {}}]
    assert all(check_record(r) == [] for r in recs)
    out = tmp_path / "sweep"
    for rec in recs:
        write_json_atomic(record_path(out, rec["run_id"]), rec)
    rows, _, charts = build_report(out)
    by = {(r["model"], r["num_devices"]): r for r in rows}
    assert by["gpt2_tiny", 1]["memory_peak_bytes"] == 300 * MB
    assert by["gpt2_tiny", 2]["memory_peak_bytes"] == 2 * 2**30
    assert by["gpt2_tiny", 2]["tokens_per_sec"] == 6.0 * get_spec("gpt2_tiny").tokens_per_sample
    assert by["gpt2_tiny", 1]["model_state_bytes"] == 30 * MB
    assert by["minigooglenet", 1]["memory_peak_bytes"] is None
    assert by["minigooglenet", 2]["memory_peak_bytes"] is None
    table = format_table(rows)
    head = table.splitlines()[0]
    assert "mem/dev" in head and "tok/s" in head
    assert "300.0 MiB" in table and "2.00 GiB" in table
    cnn_line = next(ln for ln in table.splitlines() if "minigooglenet  2" in ln)
    assert " 0.0 MiB" not in cnn_line
    cnn_only = format_table(summarise([run_record(1, 0, 100.0)])).splitlines()[0]
    assert "mem/dev" not in cnn_only and "tok/s" not in cnn_only
    csv_text = (out / "summary.csv").read_text()
    assert "memory_peak_bytes" in csv_text.splitlines()[0]
    names = {c.name for c in charts}
    assert {MEMORY_CHART, TOKENS_CHART} <= names
    page = (out / "report.html").read_text()
    assert "<th>mem/dev</th>" in page and "<th>tok/s</th>" in page
    assert "<td>2.00 GiB</td>" in page
    assert columns.cell(columns.column("memory_peak_bytes"), {}, "table") == "-"


@pytest.mark.slow
@pytest.mark.framework("torch")
def test_two_torch_ranks_each_measure_their_own(tmp_path: Path, torch_python: str) -> None:
    """A real 2-rank torch_ddp run: each rank's process measured (rank 1's through its side
    file), the model state read from the module and the optimizer."""
    from tests.helpers.sweeps import smoke_sweep

    rec = smoke_sweep(tmp_path / "torch", "runners=[torch_ddp]", "devices=[2]")[2]
    assert rec["status"] == "ok", rec["reason"]
    mem = rec["memory_per_device"]
    assert sorted(mem) == ["rank0:cpu", "rank1:cpu"], mem
    assert all(10 * MB < v < 20 * 2**30 for v in mem.values()), mem
    source = sentence(rec["memory_source"])
    assert "VmHWM" in source and "no memory from rank" not in source
    state = rec["model_state"]
    assert state["params_bytes"] >= 4 * 1_656_250 - 4 * 20_000  # float32 (buffers too)
    assert state["optimizer_bytes"] > 0 and state["grads_bytes"] > 0
    assert not list((tmp_path / "torch" / "runs").glob("*.memory.rank*"))
    assert json.dumps(rec)  # plain JSON
