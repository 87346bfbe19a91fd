"""The report's strategy table (issue 27, bench/report/strategies.py): for a sweep that ran two
or more strategies on one model, each strategy's throughput, memory per device, model state per
device (its split from the framework's shards), MFU and precision policy, with the published
strategy rows of that model beside; and the summary's state_per_device_bytes and
precision_policy_summary columns. Synthetic records in the record format (fast)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from bench.cli import main
from bench.records import columns
from bench.records.store import REQUIRED, record_path, write_json_atomic
from bench.report import strategies as st
from bench.report.summary import build_report
from contract.precision_policy import resolve

ENV = {"host": "h", "os": "Linux", "cpu_model": "cpu", "cpu_cores": 2, "memory_bytes": 2**33,
       "python": "3.11", "harness_commit": "abc", "gpus": [], "framework": {"torch": "2"}}
MB = 2**20


def state(n: int, params: int, grads: int, opt: int) -> dict[str, dict[str, int]]:
    return {f"rank{r}:cpu": {"params": params, "grads": grads, "optimizer": opt}
            for r in range(n)}


def record(runner: str, n: int, tokens: float, options: dict[str, Any] | None = None,
           per_device: dict[str, dict[str, int]] | None = None,
           policy: dict[str, Any] | None = None, status: str = "ok", repeat: int = 0,
           model: str = "gpt2_tiny") -> dict[str, Any]:
    rec: dict[str, Any] = {k: None for k in REQUIRED}
    tag = "_".join(f"{k}{v}" for k, v in (options or {}).items())
    rec.update(
        schema_version=1, sweep_id="s", runner=runner, family="torch", model=model,
        num_nodes=1, num_devices=n, virtual_devices=True, device="cpu", scaling="weak",
        batch_size_per_device=4, global_batch_size=4 * n, data="synthetic",
        data_label="synthetic", mode="benchmark", dataset=None, precision="bf16",
        repeat=repeat, status=status, reason=None if status == "ok" else "it broke",
        images_per_sec=tokens / 64 if status == "ok" else None,
        tokens_per_sec=tokens if status == "ok" else None,
        step_times_s=[0.1] * 5 if status == "ok" else [], environment=ENV,
        options=options or {}, variant=options or {},  # the options as an option axis
        memory_per_device={f"rank{r}:cpu": 300 * MB for r in range(n)},
        mfu={"mfu": 0.05, "peak_flops": 1e11} if status == "ok" else None,
        state_bytes_per_device=per_device, precision_policy=policy,
        run_id=f"{runner}__{model}__n{n}{'__' + tag if tag else ''}__r{repeat}")
    return rec


FOLLOWS = resolve("bf16", how="torch.autocast(cpu, bfloat16)", compute="bfloat16",
                  params="float32", reduce="float32")
DIFFERS = resolve("bf16", how="DeepSpeed config {'bf16': {'enabled': True}}",
                  compute="bfloat16", params="bfloat16", master="float32", reduce="bfloat16")


def sweep(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    recs = [
        record("torch_ddp", 2, 1000.0, per_device=state(2, 4 * MB, 4 * MB, 4 * MB),
               policy=FOLLOWS),
        record("torch_ddp", 2, 1200.0, per_device=state(2, 4 * MB, 4 * MB, 4 * MB),
               policy=FOLLOWS, repeat=1),
        record("deepspeed", 2, 800.0, {"stage": 3}, per_device=state(2, 2 * MB, 2 * MB, 2 * MB),
               policy=DIFFERS),
        record("deepspeed", 2, 0.0, {"stage": 1}, status="unavailable"),
        record("horovod", 2, 900.0),  # an older runner: no state, no policy
        record("torch_ddp", 1, 700.0, per_device=state(1, 4 * MB, 4 * MB, 4 * MB)),  # alone
    ]
    out = tmp_path / "sweep"
    for rec in recs:
        write_json_atomic(record_path(out, rec["run_id"]), rec)
    return out, recs


def test_state_per_device_is_the_largest_devices_parts_and_blank_without() -> None:
    rec = record("x", 2, 1.0, per_device={"rank0:cpu": {"params": 5, "grads": 1,
                                                        "optimizer": 2},
                                          "rank1:cpu": {"params": 1, "grads": 1,
                                                        "optimizer": 1}})
    assert columns.state_split(rec) == {"params": 5, "grads": 1, "optimizer": 2, "total": 8,
                                        "device": "rank0:cpu"}
    assert columns.run_value(columns.column("state_per_device_bytes"), rec) == 8
    assert columns.run_value(columns.column("state_per_device_bytes"), record("x", 2, 1.0)) \
        is None
    policy = columns.column("precision_policy_summary")
    assert columns.run_value(policy, {**rec, "precision_policy": DIFFERS}).endswith("(differs)")
    assert columns.run_value(policy, rec) is None


def test_a_table_per_model_and_devices_with_every_strategy(tmp_path: Path) -> None:
    _, recs = sweep(tmp_path)
    rows = st.strategy_rows(recs)
    assert [r["strategy"] for r in rows] == ["deepspeed stage=1", "deepspeed stage=3",
                                             "horovod", "torch_ddp"]  # 1 device: one strategy
    by = {r["strategy"]: r for r in rows}
    assert by["torch_ddp"]["throughput"] == 1100.0 and by["torch_ddp"]["runs_ok"] == 2
    assert by["torch_ddp"]["state_per_device_bytes"] == 12 * MB
    assert by["deepspeed stage=3"]["state_params_bytes"] == 2 * MB
    assert by["deepspeed stage=3"]["precision_policy"].endswith("(differs)")
    assert by["deepspeed stage=3"]["policy_follows"] is False
    assert by["deepspeed stage=1"]["status"] == "unavailable"
    assert by["deepspeed stage=1"]["reason"] == "it broke"
    assert by["horovod"]["state_per_device_bytes"] is None  # blank, not an error
    text = st.format_strategies(rows)
    assert "gpt2_tiny, 2 cpu devices, bf16, synthetic, weak scaling, batch 4" in text
    assert "2.0 MiB / 2.0 MiB / 2.0 MiB" in text and "1,100.0 tokens/s" in text
    assert st.format_strategies([]) is None


def test_the_report_has_the_strategy_table_csv_and_published_rows(tmp_path: Path,
                                                                  capsys) -> None:
    out, _ = sweep(tmp_path)
    build_report(out)
    html_text = (out / "report.html").read_text()
    assert "<h2>Strategies</h2>" in html_text and "deepspeed stage=3" in html_text
    assert "No published strategy figure for gpt2_tiny" in html_text
    rows = list(csv.DictReader((out / st.CSV_NAME).open()))
    assert [r["strategy"] for r in rows][:2] == ["deepspeed stage=1", "deepspeed stage=3"]
    summary = list(csv.DictReader((out / "summary.csv").open()))
    assert {"state_per_device_bytes", "precision_policy_summary"} <= set(summary[0])
    assert main(["report", str(out)]) == 0
    assert "Strategies compared" in capsys.readouterr().out


def test_gpt2_comparisons_have_the_published_strategy_rows_beside(tmp_path: Path) -> None:
    recs = [record("torch_ddp", 8, 1e5, model="gpt2"),
            record("torch_fsdp2", 8, 9e4, {"reshard_after_forward": True}, model="gpt2")]
    html_text = st.html_section(recs)
    assert "torch_fsdp2[reshard_after_forward=true]" in html_text
    assert "llm-foundry MPT" in html_text and "44.5%" in html_text
    assert "published beside" in st.format_strategies(st.strategy_rows(recs))
