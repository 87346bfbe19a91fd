"""Hand-made records for the tests that read results without running anything: schema-valid
ok records (the columns and the published figures), the rows the summary groups, benchmark
and all-reduce probe records of a GPU results folder, and that folder written out."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.records.store import REQUIRED, check_record
from contract.collectives import MIB, gradient_bytes

ENV = {"host": "h", "os": "Linux", "cpu_model": "cpu", "cpu_cores": 2, "memory_bytes": 2**33,
       "python": "3.11", "harness_commit": "abc", "gpus": [], "framework": {"tensorflow": "2"}}
RESNET = gradient_bytes("resnet50")


def run_record(n: int, repeat: int, ips: float, first_loss: float = 2.5,
               last_loss: float = 2.25) -> dict:
    """A schema-valid ok record of one configuration on n virtual CPU devices."""
    rec = {k: None for k in REQUIRED}
    rec.update(
        schema_version=1, sweep_id="s", runner="tf_mirrored", family="tf",
        model="minigooglenet", num_devices=n, virtual_devices=True, device="cpu",
        scaling="weak", batch_size_per_device=32, global_batch_size=32 * n, data="synthetic",
        data_label="synthetic", mode="benchmark", precision="fp32", repeat=repeat,
        status="ok", images_per_sec=ips, step_times_s=[32 * n / ips] * 10, environment=ENV,
        options={}, first_loss=first_loss, last_loss=last_loss,
        run_id=f"tf_mirrored__minigooglenet__n{n}__b32__synthetic__fp32__r{repeat}")
    assert check_record(rec) == []
    return rec


def model_record(model: str, n: int, ips: float, nodes: int = 1) -> dict:
    """A schema-valid ok record of tf_mirrored on `n` virtual CPU devices."""
    rec = {k: None for k in REQUIRED}
    rec.update(
        schema_version=1, sweep_id="s", runner="tf_mirrored", family="tf", model=model,
        num_nodes=nodes, num_devices=n, virtual_devices=True, device="cpu", scaling="weak",
        batch_size_per_device=32, global_batch_size=32 * n, data="synthetic",
        data_label="synthetic", mode="benchmark", dataset=None, precision="fp32", repeat=0,
        status="ok", reason=None, images_per_sec=ips, step_times_s=[32 * n / ips] * 10,
        environment=ENV, options={},
        run_id=f"tf_mirrored__{model}__n{n}__N{nodes}__b32__synthetic__fp32__r0")
    assert check_record(rec) == [], check_record(rec)
    return rec


def summary_row(n: int, ips: float | None, status: str = "ok", repeat: int = 0,
                **kw: object) -> dict:
    """The fields of a record the summary groups and compares (runner "r", model "m")."""
    base = {"runner": "r", "model": "m", "data": "synthetic", "precision": "fp32",
            "scaling": "weak", "batch_size_per_device": 32, "global_batch_size": 32 * n,
            "device": "cpu", "virtual_devices": True, "num_devices": n, "status": status,
            "images_per_sec": ips, "reason": None if status == "ok" else "boom",
            "repeat": repeat}
    base.update(kw)
    return base


def gpu_record(n: int, ips: float | None, run_id: str | None = None, **kw: Any
               ) -> dict[str, Any]:
    """A benchmark record as the harness writes it, with the fields the summary reads."""
    batch = kw.pop("batch_size_per_device", 64)
    rec = {"run_id": run_id or f"torch_ddp-resnet50-n{n}-{kw.get('data', 'synthetic')}",
           "runner": "torch_ddp", "family": "torch", "model": "resnet50",
           "data": "synthetic", "precision": "fp32", "scaling": "weak",
           "batch_size_per_device": batch, "global_batch_size": batch * n, "device": "gpu",
           "virtual_devices": False, "num_devices": n, "num_nodes": 1,
           "status": "ok" if ips else "failed", "images_per_sec": ips,
           "reason": None if ips else "boom", "repeat": 0, "mode": "benchmark",
           "step_times_s": [batch * n / ips] * 10 if ips else [],
           "telemetry": {"gpu_util_mean_pct": 80.0}}
    rec.update(kw)
    return rec


def probe_record(runner: str, family: str, n: int, busbw: float, device: str = "gpu",
                 run_id: str | None = None, fixed_s: float = 0.0) -> dict[str, Any]:
    """A probe record whose all-reduces take fixed_s + 2(n-1)/n x bytes / busbw; each size's
    busbw figure from its time, as nccl-tests defines it (busbw itself when fixed_s is 0)."""
    factor = 2 * (n - 1) / n
    sizes = []
    for b in (MIB, 16 * MIB, RESNET):
        t = fixed_s + factor * b / (busbw * 1e9)
        sizes.append({"bytes": b, "time_s": t, "busbw_gbps": factor * b / t / 1e9})
    return {"run_id": run_id or f"{runner}-n{n}", "runner": runner, "family": family,
            "model": "resnet50", "mode": "allreduce", "status": "ok", "num_devices": n,
            "num_nodes": 1, "device": device, "virtual_devices": device == "cpu",
            "images_per_sec": None, "reason": None, "repeat": 0,
            "result": {"allreduce": {"busbw_gbps": sizes[-1]["busbw_gbps"],
                                     "gradient_bytes": RESNET,
                                     "sizes": sizes}}}


def write_folder(root: Path, records: list[dict[str, Any]]) -> Path:
    """`records` written as a results folder's runs/<run_id>.json."""
    (root / "runs").mkdir(parents=True, exist_ok=True)
    for rec in records:
        (root / "runs" / f"{rec['run_id']}.json").write_text(json.dumps(rec))
    return root
