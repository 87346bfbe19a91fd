"""report.html in a real browser (issue 42): headless Chromium (Debian's `chromium`, installed
here with apt-get where absent and the host allows it, else skipped with why) opens at 1,280 px
the report of a recorded sweep (tests/golden/impossible-speedup: no framework runs) and of
crafted rows as wide as the harness writes. The page renders with Findings first, the core
table has no horizontal scroll and lies inside the window, the page does not scroll sideways,
and every chart image loads (naturalWidth > 0). The page has no script of its own; a copy gets
one that writes these measures into the DOM, which --dump-dom returns. A screenshot at 1,280 px
is taken too and checked to be a PNG of that size. About 10 s of CPU once installed."""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from bench.analysis.stats import summarise
from bench.records.store import load_records
from bench.report.summary import build_report
from tests.helpers.cli import REPO
from tests.helpers.records import gpu_record, write_folder

pytestmark = pytest.mark.slow  # it may install Chromium (minutes); under 20 s once installed

WIDTH = 1280
# a recorded sweep (issue 40's, flagged), and a crafted worst case for the core table's width:
# a long runner label, every flag on, marked speedups, MFU over peak, 2 nodes, GiB per device
SWEEPS = ("impossible-speedup", "widest")
APT_TIMEOUT_S = 900
BROWSER_TIMEOUT_S = 60
# measured after every image has loaded (the load event), written into <pre id="measure">
PROBE = """<script>window.addEventListener('load', () => {
  const core = document.querySelector('table.core');
  const images = [...document.images];
  const box = core ? core.getBoundingClientRect() : null;
  const out = {innerWidth: window.innerWidth,
    pageScroll: document.documentElement.scrollWidth,
    pageClient: document.documentElement.clientWidth,
    coreScroll: core ? core.scrollWidth : null, coreClient: core ? core.clientWidth : null,
    coreRight: box ? box.right : null, coreRows: core ? core.rows.length : 0,
    images: images.length,
    broken: images.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt),
    headings: [...document.querySelectorAll('h2')].map(h => h.textContent)};
  const pre = document.createElement('pre');
  pre.id = 'measure';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});</script>"""


def _install() -> str | None:
    """Why Chromium cannot be had here, after trying apt-get where it is absent; None when
    it is on PATH."""
    if shutil.which("chromium"):
        return None
    if not shutil.which("apt-get"):
        return "no chromium on PATH and no apt-get to install it"
    if os.geteuid() != 0:
        return "no chromium on PATH and not root, so apt-get cannot install it"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        # a fresh machine's image often ships without package lists: read them first
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True,
                       timeout=APT_TIMEOUT_S, check=False)
        done = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends",
                               "chromium"], env=env, capture_output=True, text=True,
                              timeout=APT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"apt-get update/install chromium took over {APT_TIMEOUT_S} s"
    if done.returncode or not shutil.which("chromium"):
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"apt-get install chromium failed (exit {done.returncode}): {tail[0]}"
    return None


@pytest.fixture(scope="module")
def chromium() -> str:
    why = _install()
    if why:
        pytest.skip(why)
    return str(shutil.which("chromium"))


def _browse(chromium: str, page: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--user-data-dir={page.parent / 'chromium-profile'}",
         f"--window-size={WIDTH},1000", *args, page.as_uri()],
        capture_output=True, text=True, timeout=BROWSER_TIMEOUT_S, check=False)


def _widest(folder: Path) -> None:
    """Records whose summary rows have the widest core cells the harness writes."""
    variant = {"reshard_after_forward": "true", "mixed_precision": "bf16"}
    write_folder(folder, [gpu_record(
        n, ips * n * (2 if n > 1 else 1), run_id=f"widest-n{n}-r{i}", runner="torch_fsdp2",
        variant=variant, options=variant, repeat=i, contended=True, num_nodes=2 if n == 8 else 1,
        memory_per_device={"cuda:0": 70 * 2**30}, mfu={"mfu": 1.234, "over_peak": True},
        telemetry={"gpu_util_mean_pct": 5.0, "starved": True, "host_bound": True})
        for n in (1, 2, 8) for i, ips in enumerate([1000.0, 1300.0, 1700.0])])


@pytest.fixture(scope="module", params=SWEEPS)
def report(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sweep's folder (a recorded one copied, or the widest crafted) reported again
    (report.html and its charts)."""
    folder = tmp_path_factory.mktemp("browser") / request.param
    if request.param == "widest":
        _widest(folder)
    else:
        shutil.copytree(REPO / "tests" / "golden" / request.param, folder)
    build_report(folder)
    return folder / "report.html"


def test_the_page_renders_fits_1280_px_and_loads_every_chart(chromium: str,
                                                             report: Path) -> None:
    probed = report.with_name("probed.html")
    page = report.read_text()
    assert "<script" not in page  # the report's own page stays script-free
    probed.write_text(page.replace("</body>", PROBE + "</body>"))
    done = _browse(chromium, probed, "--virtual-time-budget=5000", "--dump-dom")
    found = re.search(r'<pre id="measure">(.*?)</pre>', done.stdout)
    assert found, f"no measure in the DOM (exit {done.returncode}): {done.stderr[-2000:]}"
    seen = json.loads(found.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert seen["innerWidth"] == WIDTH
    assert seen["headings"][0] == "Findings" and "Summary" in seen["headings"]
    assert seen["coreRows"] == 1 + len(summarise(load_records(report.parent)))
    assert seen["coreScroll"] <= seen["coreClient"], "the core table scrolls sideways"
    assert seen["coreRight"] <= WIDTH, "the core table ends outside the window"
    assert seen["pageScroll"] <= seen["pageClient"], "the page scrolls sideways"
    charts = len(re.findall(r"<img ", page))
    assert seen["images"] == charts >= 2 and seen["broken"] == []


def test_a_screenshot_at_1280_px(chromium: str, report: Path) -> None:
    shot = report.with_name("report-1280.png")
    done = _browse(chromium, report, f"--screenshot={shot}")
    assert shot.is_file(), f"no screenshot (exit {done.returncode}): {done.stderr[-2000:]}"
    head = shot.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", head[16:24]) == (WIDTH, 1000)
