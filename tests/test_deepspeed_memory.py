"""DeepSpeed's memory beyond its state (runners/torch/deepspeed_memory.py, issue 41): the page
table reading that says how much of a large buffer is resident, the /dev/shm workspace reading,
the arithmetic of a rank's peak split into state, buffers and the unexplained rest; the
capacity-cpu searches of DeepSpeed as a real run recorded them (2026-11-28, docs/STRATEGIES.md),
rendered. The real runs' breakdowns: tests/test_deepspeed.py."""

from __future__ import annotations

import ctypes
import json
import mmap
import resource
from pathlib import Path

import pytest

from bench.report.capacity import capacity_rows, format_capacity_table
from contract.result import FIELDS
from runners.torch import deepspeed_memory as dm

PAGE = resource.getpagesize()
RECORDED = Path(__file__).parent / "data" / "capacity_cpu_deepspeed"  # its capacity/ records


def entry(allocated: int, resident: int | None, in_state: int = 0) -> dict[str, int | None]:
    return {"allocated_bytes": allocated, "resident_bytes": resident,
            "counted_in_state_bytes": in_state}


@pytest.mark.skipif(not dm.PAGEMAP.exists(), reason="no /proc/self/pagemap (not Linux)")
def test_resident_bytes_counts_the_pages_written_not_the_allocation() -> None:
    """A 64 MiB anonymous mapping (what a large torch.empty is) of which 5 pages were written:
    5 pages resident, where its nbytes would say 64 MiB (a ZeRO-3 bucket of 5e8 elements is
    2 GB allocated and a few MB written)."""
    size = 64 << 20
    buf = mmap.mmap(-1, size)
    try:
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            buf.madvise(mmap.MADV_NOHUGEPAGE)  # one touch, one page
        address = ctypes.addressof(ctypes.c_char.from_buffer(buf))
        assert dm.resident_bytes(address, size) == 0
        for i in (0, 1, 100, 1000, size // PAGE - 1):
            buf[i * PAGE] = 1
        assert dm.resident_bytes(address, size) == 5 * PAGE
        assert dm.resident_bytes(address + 100 * PAGE, PAGE) == PAGE  # one page, itself
        assert dm.resident_bytes(address + 2 * PAGE, 98 * PAGE) == 0  # between the written
        # a range that ends inside page 1 and one that starts inside page 100: their bytes only
        assert dm.resident_bytes(address + 100, PAGE + 20) == PAGE + 20
        assert dm.resident_bytes(address + 100 * PAGE + 96, 200 * PAGE) == PAGE - 96
    finally:
        buf.close()


def test_resident_bytes_without_a_page_table(tmp_path: Path) -> None:
    assert dm.resident_bytes(0, PAGE, tmp_path / "absent") is None


def test_shm_resident_sums_the_dev_shm_mappings_only(tmp_path: Path) -> None:
    smaps = tmp_path / "smaps"
    smaps.write_text(
        "7f0000000000-7f0004000000 rw-s 00000000 00:1a 12 /dev/shm/deepspeed_shm_0\n"
        "Size:              65536 kB\nRss:                4096 kB\nVmFlags: rd wr sh\n"
        "7f0004000000-7f0008000000 rw-p 00000000 00:00 0 \n"
        "Size:              65536 kB\nRss:               65536 kB\n"
        "7f0008000000-7f0008001000 rw-s 00000000 00:1a 13 /dev/shm/other\n"
        "Rss:                   4 kB\n")
    assert dm.shm_resident(smaps) == (4096 + 4) * 1024
    assert dm.shm_resident(tmp_path / "absent") is None


def test_breakdown_splits_the_peak_into_state_buffers_and_the_rest() -> None:
    """Buffers count at their resident bytes where the page table gave them, else allocated,
    less what the state already counts in them (stage 1/2's gradients in a bucket), never
    below 0; the rest is the peak less state and buffers, and None without a peak."""
    state = {"params": 400, "grads": 300, "optimizer": 800}
    buffers = {"ipg_buckets": entry(2_000_000, 250, in_state=100),  # 150 beside the state
               "flat_padding": entry(16, None),  # allocated, page table not read
               "over_counted": entry(50, 10, in_state=40)}  # 0, not -30
    got = dm.breakdown(3_000, state, buffers, held_after=2_200)
    assert got == {"peak_bytes": 3_000, "state_bytes": 1_500, "buffers": buffers,
                   "buffers_bytes": 150 + 16, "unexplained_bytes": 3_000 - 1_500 - 166,
                   "held_after_step_bytes": 2_200, "transient_bytes": 800}
    assert dm.breakdown(None, state, buffers, 2_200)["unexplained_bytes"] is None
    assert dm.breakdown(None, state, buffers, 2_200)["transient_bytes"] is None
    assert dm.breakdown(3_000, state, buffers)["transient_bytes"] is None
    assert dm.breakdown(1_000, state, {})["unexplained_bytes"] == -500  # said, not hidden


def test_vmrss_reads_the_status_file(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tpython\nVmHWM:\t  900 kB\nVmRSS:\t  512 kB\n")
    assert dm.vmrss(status) == 512 * 1024
    assert dm.vmrss(tmp_path / "absent") is None
    status.write_text("Name:\tpython\n")
    assert dm.vmrss(status) is None


def test_the_record_declares_the_breakdown() -> None:
    assert "deepspeed_memory" in FIELDS


def test_capacity_cpu_deepspeed_as_recorded_says_why_nothing_fits() -> None:
    """configs/capacity-cpu.yaml's DeepSpeed searches as a real run recorded them: every probe
    from 16 down to 1 over the 272 MiB budget, each search ending in the one line that names
    its smallest probe's peak against the budget (terminal table, capacity.csv's reason)."""
    rows = capacity_rows(RECORDED)
    assert [r["variant"] for r in rows] == ["stage=2", "stage=3"]
    table = format_capacity_table(rows)
    for row, rec in zip(rows, sorted((RECORDED / "capacity").glob("*.json")), strict=True):
        probes = json.loads(rec.read_text())["probes"]
        assert [p["value"] for p in probes] == [16, 8, 4, 2, 1]
        assert all(p["oom_by"] == "budget" and p["peak_bytes"] > row["device_memory"]
                   for p in probes)
        assert (row["end"], row["largest_fit"], row["first_misfit"]) == ("none_fits", None, 1)
        line = (f"the smallest probe (batch per device 1) peaks at "
                f"{probes[-1]['peak_bytes'] / 2**20:.1f} MiB per device, over a budget of "
                "272.0 MiB")
        assert row["reason"] == line
        assert f"deepspeed {row['variant']} wide_lm n=2: {line}" in table
