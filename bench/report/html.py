"""report.html: one page a person can open from a results folder, on its own (every chart
inline as a data: URI, the style inline, nothing fetched). It opens with the Findings
(bench/analysis/findings.py), then the summary: a core table that fits 1,280 px, its legend,
and the other columns in a collapsed details table (bench/records/columns.py core_and_details,
legend); then when the sweep ran, the machine, every framework's version, the settings, the
runs that need a second look and why, memory per device and the placement evidence per run,
the charts, the published figures beside, and every run's telemetry chart and log: the log's
last lines inline with the whole log's absolute path, since a relative link breaks when the
page is mailed. The facts at its head (sweep_span, machine, sweep_settings) are results.md's
too (bench/report/markdown.py)."""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from bench.analysis.compare import frameworks
from bench.analysis.converge import converge_rows
from bench.analysis.explain import html_section as where_the_time_went
from bench.analysis.findings import findings
from bench.analysis.gate import read_gate
from bench.analysis.published import published_section
from bench.analysis.stats import interval_notes
from bench.records import columns
from bench.records.grouping import data_label, mode_of, runner_label
from bench.records.placement_check import check_work
from bench.records.store import folder_damage, read_environment, write_text_atomic
from bench.records.trust import doubts
from bench.report.allreduce import html_section as allreduce_section
from bench.report.capacity import html_section as capacity_section
from bench.report.converge import CHART_NAME as CONVERGE_CHART
from bench.report.converge import html_section as converge_section
from bench.report.strategies import html_section as strategies_section
from bench.run.verdict import read_tail
from contract.reasons import sentence

VIRTUAL_CAVEAT = ("multi-device rows ran on one host's cores (virtual CPU devices); they show "
                  "the harness and the strategies work, not GPU scaling.")
# What the summary's figures are, under its heading (after the intervals).
SUMMARY_TERMS = (
    "Speedup and efficiency are against the same configuration on 1 device; a ? marks a "
    "figure that cannot be (a speedup above the device count, an MFU over 100%) and "
    "(baseline contended) one whose 1-device run was contended or unstable: the Flagged list "
    "says why. MFU is training FLOPs (3 x the model's forward FLOPs per image) x img/s over "
    "the device's measured matmul peak at the run's precision. mem/dev is the most memory "
    "one device held in the timed window, as its framework's allocator reports it (on CPU the "
    "rank's process's peak resident memory, shared by its virtual devices; the csv's "
    "memory_source says what was read), state the model state one device holds (parameters, "
    "gradients, optimizer); tok/s is a token model's samples/sec x its sequence length.")
CONFIG_MAX_BYTES = 2**20  # a sweep's config.yaml is a few KB
# report.html carries each run's log tail (it stands alone) and names the whole log's path
LOG_TAIL_LINES, LOG_TAIL_BYTES = 30, 8192
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # all but tab, newline
MIME = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg"}
# the core table wraps its cells (it fits 1,280 px); a wider table scrolls in its own box
STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1400px}"
         "table{border-collapse:collapse;font-size:13px}"
         "td,th{border:1px solid #ccc;padding:3px 6px;text-align:left}"
         "th{background:#eee}img{max-width:100%}"
         "table.core td{overflow-wrap:break-word}"
         ".wide{overflow-x:auto;max-width:100%}dt{font-weight:bold}dd{margin:0 0 .4em 1.5em}"
         ".findings li{margin:.2em 0}pre{white-space:pre-wrap;overflow-wrap:anywhere}")
# every image the sections write refers to a file under charts/; the page inlines them all
_CHART_SRC = re.compile(r'src="(charts/[^"]+)"')

# The per-run columns the Runs table shows beside the run's id, status and files.
RUN_CELLS = ("images_per_sec", "tokens_per_sec", "memory_peak_bytes", "gpu_util_pct",
             "run_cpu_cores", "joules_per_image", "mfu")


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _num(value: Any, fmt: str) -> str:
    return format(value, fmt) if isinstance(value, (int, float)) else "-"


def _table(head: list[str], rows: list[list[str]], css: str = "") -> str:
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    attr = f' class="{css}"' if css else ""
    return f"<table{attr}><tr>{th}</tr>{body}</table>"


def _flags(row: dict[str, Any]) -> list[str]:
    """The keys of the flag columns (bench/records/columns.py) that are on in a summary row."""
    return [c.key for c in columns.flags_on(row)]


def _summary(rows: list[dict[str, Any]]) -> str:
    """The core table (columns.CORE: it fits 1,280 px) with its legend, then the html view's
    other cells in a collapsed details table, each row named by runner, model and devices, with
    theirs (bench/records/columns.py)."""
    core, rest = columns.core_and_details(rows)
    table = _table([c.header for c in core], [[_cell(c, r) for c in core] for r in rows],
                   "core")
    notes = [f"<li>* {_e(runner_label(r))} n={r['num_devices']}: {_e(r['placement_collapsed'])}"
             "</li>" for r in rows if r.get("placement_collapsed")]
    named = tuple(c for c in core if c.key in ("runner", "model", "num_devices"))
    details = _table([c.header for c in (*named, *rest)],
                     [[_cell(c, r) for c in (*named, *rest)] for r in rows], "details")
    return (table + (f"<ul>{''.join(notes)}</ul>" if notes else "")
            + _legend("What each column means", core)
            + f"<details><summary>Details per row: {len(rest)} more columns</summary>"
            f"<div class='wide'>{details}</div>" + _legend("Their meaning", rest)
            + "</details>")


def _legend(title: str, cols: tuple[columns.Column, ...]) -> str:
    """A collapsed definition list of the columns (columns.legend)."""
    items = "".join(f"<dt>{_e(h)}</dt><dd>{_e(m)}</dd>" for h, m in columns.legend(cols))
    return f"<details class='legend'><summary>{_e(title)}</summary><dl>{items}</dl></details>"


def _cell(col: columns.Column, row: dict[str, Any]) -> str:
    """A summary cell; the flags joined by ", " so the cell can wrap."""
    text = _e(columns.cell(col, row, "html"))
    return f"<b>{text.replace(',', ', ')}</b>" if col.format == "flags" else text


def _flagged(rows: list[dict[str, Any]]) -> str:
    """Each flagged row: its flagged figures with why, numbers included (not results: ? in
    the table), then what each of its flags means."""
    items = [f"<li><b>{_e(runner_label(r))} {_e(r['model'])} n={r['num_devices']} "
             f"{_e(r['data_label'])} {_e(r['precision'])}</b>: "
             + "".join(f"<b>not a result</b>: {_e(why)}; " for why in doubts(r).values())
             + "; ".join(f"<i>{c.key}</i>: {_e(c.meaning)}" for c in columns.flags_on(r))
             + "</li>"
             for r in rows if _flags(r)]
    return f"<ul>{''.join(items)}</ul>" if items else "<p>No row is flagged.</p>"


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str | None:
    """The last lines of a run's log (read from its last LOG_TAIL_BYTES, undecodable bytes
    replaced, control characters but tab and newline dropped); None where it cannot be
    read."""
    data = read_tail(path, LOG_TAIL_BYTES)
    if data is None:
        return None
    return "\n".join(_CONTROL.sub("", data).splitlines()[-lines:])


def _log(results_dir: Path, rec: Mapping[str, Any]) -> str:
    """A run's log in the page, which must stand alone when mailed: its tail inline, and
    where the whole log is, as an absolute path (runs/<name> of this folder, else the
    path the record gives)."""
    recorded = rec.get("log_path")
    if not recorded:
        return ""
    here = (Path(results_dir) / "runs" / Path(str(recorded)).name).absolute()
    tail = log_tail(here)
    if tail is None:
        return f" log: not in this folder (recorded at {_e(recorded)})"
    return (f"<details><summary>log</summary><pre>{_e(tail)}</pre><p>last "
            f"{LOG_TAIL_LINES} lines at most; the whole log: {_e(here)}</p></details>")


def _runs(results_dir: Path, records: list[dict[str, Any]], telemetry: set[str]) -> str:
    out = []
    # an optional column (tokens/sec, memory) only where some run has it
    cells = [c for c in map(columns.column, RUN_CELLS) if not c.optional
             or any(columns.run_value(c, r) is not None for r in records)]
    for rec in sorted(records, key=lambda r: r["run_id"]):
        tel = rec.get("telemetry") or {}
        chart = f"charts/telemetry/{rec['run_id']}.png"
        out.append([
            _e(rec["run_id"]), _e(rec["status"]),
            *(_e(columns.cell(c, {c.key: columns.run_value(c, rec)}, "html")) for c in cells),
            _e(rec.get("reason") or tel.get("note") or ""),
            (f'<details><summary>telemetry</summary><img src="{_e(chart)}" '
             f'alt="telemetry {_e(rec["run_id"])}"></details>'
             if rec["run_id"] in telemetry else "")
            + _log(results_dir, rec),
        ])
    return "<div class='wide'>" + _table(["run", "status", *(c.header for c in cells),
                                          "reason / note", "files"], out) + "</div>"


def sweep_config(results_dir: Path) -> dict[str, Any] | None:
    """The sweep's config.yaml as a mapping, read tolerantly: None where it is missing,
    oversized, unparsable, deeply nested or not a mapping (a report never trusts it)."""
    path = Path(results_dir) / "config.yaml"
    try:
        if not path.is_file():  # never open a FIFO or a device
            return None
        with open(path, "rb") as fh:
            data = fh.read(CONFIG_MAX_BYTES + 1)
        if len(data) > CONFIG_MAX_BYTES:
            return None
        cfg = yaml.safe_load(data.decode("utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
        return None
    return cfg if isinstance(cfg, dict) else None


def _when(text: Any) -> datetime | None:
    try:
        when = datetime.fromisoformat(str(text))
    except ValueError:
        return None
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def sweep_span(records: list[dict[str, Any]]) -> str:
    """When the sweep ran: the first run's start to the last run's finish (UTC), and how long
    that is; "no runs" without records."""
    starts = [w for w in (_when(r.get("started_at")) for r in records) if w]
    ends = [w for w in (_when(r.get("finished_at")) for r in records) if w]
    if not starts or not ends:
        return "no runs" if not records else "not recorded"
    first, last = min(starts), max(ends)
    end = last.strftime("%H:%M:%S" if last.date() == first.date() else "%Y-%m-%d %H:%M:%S")
    return (f"{first:%Y-%m-%d %H:%M:%S} to {end} UTC "
            f"({_duration((last - first).total_seconds())})")


def _environment_of(records: list[dict[str, Any]], results_dir: Path) -> dict[str, Any]:
    env = read_environment(Path(results_dir))[0]  # None where missing or damaged
    if env is None:
        env = records[0].get("environment") if records else None
    return env if isinstance(env, dict) else {}


def gpus_line(env: Mapping[str, Any], records: list[dict[str, Any]]) -> str:
    """The GPUs as "2 x NVIDIA H100 (driver 550.54)", or that there is none."""
    if "gpus" not in env:
        return "not recorded"
    gpus = [g for g in env.get("gpus") or [] if isinstance(g, Mapping)]
    if not gpus:
        return ("no GPU: virtual CPU devices" if any(r.get("virtual_devices") for r in records)
                else "none seen by NVML")
    names = {}
    for g in gpus:
        names[str(g.get("name", "?"))] = names.get(str(g.get("name", "?")), 0) + 1
    drivers = sorted({str(g["driver_version"]) for g in gpus if g.get("driver_version")})
    return ", ".join(f"{n} x {name}" for name, n in names.items()) + (
        f" (driver {', '.join(drivers)})" if drivers else "")


def machine(records: list[dict[str, Any]], results_dir: Path) -> list[tuple[str, str]]:
    """The machine in (what, value) pairs: host and OS, CPU, memory, GPUs, Python, harness
    commit; from environment.json, else the first record's environment."""
    env = _environment_of(records, results_dir)
    memory = env.get("memory_bytes")
    return [("host", f"{env.get('host') or '?'} ({env.get('os') or '?'})"),
            ("CPU", f"{env.get('cpu_model') or '?'} x {env.get('cpu_cores') or '?'} cores"
                    + (f" ({env['cpu_isa']})" if env.get("cpu_isa") else "")),
            ("memory", f"{memory / 2**30:.1f} GiB" if isinstance(memory, int) else "?"),
            ("GPUs", gpus_line(env, records)),
            ("Python", str(env.get("python") or "?")),
            ("harness commit", str(env.get("harness_commit") or "?"))]


def _distinct(values: Iterable[Any], sep: str = ", ") -> str:
    """The distinct values shown, numbers in order, joined by sep; - when none."""
    seen = list(dict.fromkeys(v for v in values if v is not None and v != ""))
    seen.sort(key=lambda v: (0, v, "") if isinstance(v, (int, float)) and not isinstance(
        v, bool) else (1, 0, str(v)))
    return sep.join(str(v) for v in seen) or "-"


def _dataset(rec: Mapping[str, Any]) -> str | None:
    ds = rec.get("dataset")
    if rec.get("data") != "real" or not isinstance(ds, Mapping):
        return None
    return ", ".join(f"{k} {ds[k]}" for k in ("path", "augmentation", "workers")
                     if ds.get(k) is not None) or None


def _config(config: Mapping[str, Any] | None, *path: str) -> Any:
    node: Any = config
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    return node


SCALING = {"weak": "weak scaling: the batch per device is fixed, the global batch grows with "
                   "the devices",
           "strong": "strong scaling: the global batch is fixed, split over the devices"}


def sweep_settings(records: list[dict[str, Any]], rows: list[dict[str, Any]],
                   config: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """The sweep's settings in (what, value) pairs, from its records (config.yaml only for
    what no record holds: the timeout, the repeats asked for); none without records."""
    if not records:
        return []

    def of(read: Callable[[Mapping[str, Any]], Any], sep: str = ", ") -> str:
        return _distinct((read(r) for r in records), sep)

    policy = columns.column("precision_policy_summary")
    asked = [f"repeats {_config(config, 'repeats')}"] if _config(config, "repeats") else []
    stable = _config(config, "until_stable")
    if isinstance(stable, Mapping):
        asked.append(f"until_stable: target_cv {stable.get('target_cv')}, up to "
                     f"{stable.get('max_repeats')}")
    repeats = (_distinct(r.get("runs_total") for r in rows) + " per configuration"
               + (f" (config.yaml: {'; '.join(asked)})" if asked else ""))
    timeout = _config(config, "timeout_s")
    return [
        ("mode", of(mode_of)),
        ("warm-up steps", of(lambda r: r.get("warmup_steps"))),
        ("timed steps", of(lambda r: r.get("measure_steps"))),
        ("repeats", repeats),
        ("precision", of(lambda r: r.get("precision"))),
        ("precision policy", of(lambda r: columns.run_value(policy, r), " / ")),
        ("data", of(lambda r: data_label(r) if r.get("data") else None)),
        ("dataset", of(_dataset)),
        ("batch semantics", of(lambda r: SCALING.get(r.get("scaling") or "", r.get("scaling")))),
        ("batch per device", of(lambda r: r.get("batch_size_per_device"))),
        ("global batch", of(lambda r: r.get("global_batch_size"))),
        ("devices", of(lambda r: r.get("num_devices")) + " (" + of(
            lambda r: "virtual CPU devices" if r.get("virtual_devices") else r.get("device"))
         + ")"),
        ("timeout", f"{timeout:g} s per run (config.yaml)"
         if isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
         else "not known (no readable config.yaml)"),
    ]


def _pairs(pairs: list[tuple[str, str]]) -> str:
    """(what, value) pairs as a two-column table, the names as row headers."""
    return "<table>" + "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>"
                               for k, v in pairs) + "</table>"


def _header(records: list[dict[str, Any]], rows: list[dict[str, Any]], results_dir: Path,
            config: Mapping[str, Any] | None) -> str:
    """Date, machine, framework versions, GPU topology and the settings."""
    env = _environment_of(records, results_dir)
    topo = env.get("gpu_topology")
    topo = topo if isinstance(topo, Mapping) else {}
    matrix = topo.get("nvidia_smi_topo_m")
    detail = (f"<pre>{_e(matrix)}</pre>" if matrix else
              f"<p>GPU topology: {_e(topo.get('reason') or 'not captured')}</p>")
    versions = [[_e(fam), _e(pkg), _e(ver)] for fam, pkgs in sorted(frameworks(records).items())
                for pkg, ver in sorted(pkgs.items())]
    return "".join([
        "<h2>Machine</h2>", _pairs([("date", sweep_span(records)),
                                    *machine(records, results_dir)]),
        detail,
        "<h3>Framework versions</h3>",
        _table(["family", "package", "version"], versions) if versions else
        "<p>No run reported its framework's version.</p>",
        "<h2>Settings</h2>", _pairs(sweep_settings(records, rows, config)) if records
        else "<p>No runs.</p>",
    ])


def _memory(records: list[dict[str, Any]]) -> str:
    """Each run's memory per device where it recorded one, with what was read."""
    show = columns.column("memory_peak_bytes")
    body = []
    for rec in sorted(records, key=lambda r: r["run_id"]):
        per = rec.get("memory_per_device")
        if isinstance(per, Mapping) and per:
            body.append([_e(rec["run_id"]), _e(", ".join(
                f"{dev} {columns.cell(show, {show.key: v}, 'html')}" for dev, v in per.items())),
                _e(sentence(rec.get("memory_source")) or "")])
    if body:
        return _table(["run", "memory per device (peak in the timed window)", "source"], body)
    sources = _distinct((sentence(r.get("memory_source")) for r in records), "; ")
    return (f"<p>No run recorded memory per device (memory_source: {_e(sources)}).</p>"
            if records else "<p>No runs.</p>")


def placement_words(rec: Mapping[str, Any]) -> str:
    """A run's placement evidence in a line (its placement_check): the distinct devices the
    framework named against the devices asked, each work count checked and whether it is the
    expected one."""
    check = rec.get("placement_check")
    if not isinstance(check, Mapping) or not check:
        return "none read back from the framework"
    devices = [str(d) for d in check.get("devices") or []]
    words = f"{len(devices)} of {rec.get('num_devices')} devices: {', '.join(devices) or '-'}"
    collapsed = (rec.get("result") or {}).get("placement_collapsed") \
        if isinstance(rec.get("result"), Mapping) else None
    if collapsed:
        words += f" (the framework collapsed them: {collapsed})"
    work = check.get("work")
    if isinstance(work, Mapping) and work:
        result = {"expected_work": {f: v.get("expected") for f, v in work.items()
                                    if isinstance(v, Mapping)},
                  **{f: v.get("measured") for f, v in work.items() if isinstance(v, Mapping)}}
        problems = check_work(result)[1]
        words += "; " + ("; ".join(problems) if problems else
                         f"{', '.join(work)}: each device's count as expected")
    return words


def _placement(records: list[dict[str, Any]]) -> str:
    body = [[_e(r["run_id"]), _e(r["status"]), _e(placement_words(r))]
            for r in sorted(records, key=lambda r: r["run_id"])
            if mode_of(r) not in ("pipeline", "allreduce")]
    return (_table(["run", "status", "devices the framework named (placement_check)"], body)
            if body else "<p>No training runs.</p>")


def inline_images(page: str, results_dir: Path) -> str:
    """The page with every charts/ image inlined as a data: URI (the page stands alone); an
    image whose file is missing or outside charts/ keeps only its alt text."""
    charts = (Path(results_dir) / "charts").resolve()

    def data(match: re.Match[str]) -> str:
        path = (Path(results_dir) / html.unescape(match.group(1))).resolve()
        try:
            if charts not in path.parents or not path.is_file():
                return 'src=""'
            payload = base64.b64encode(path.read_bytes()).decode("ascii")
        except OSError:
            return 'src=""'
        return f'src="data:{MIME.get(path.suffix, "image/png")};base64,{payload}"'
    return _CHART_SRC.sub(data, page)


def _findings(rows: list[dict[str, Any]], records: list[dict[str, Any]]) -> str:
    """The Findings section (bench/analysis/findings.py), first on the page."""
    found = findings(rows, records)
    if not found:
        return ("<h2 id='findings'>Findings</h2><p>No benchmark runs: the sections below "
                "hold what this folder has.</p>")
    items = "".join(f"<li><b>{_e(heading)}</b><ul>"
                    + "".join(f"<li>{_e(line)}</li>" for line in lines) + "</ul></li>"
                    for heading, lines in found)
    return f"<h2 id='findings'>Findings</h2><ul class='findings'>{items}</ul>"


def _damaged(results_dir: Path) -> str:
    """The folder's damaged files (bench/records/store.py's tolerant reader), one line each:
    none of their numbers is in this report."""
    lines = folder_damage(results_dir)
    if not lines:
        return ""
    items = "".join(f"<li>{_e(d.line(results_dir))}</li>" for d in lines)
    return ("<h2>Damaged files</h2><p>These files could not be read as records; nothing of "
            f"them is in this report (`--resume` runs them again).</p><ul>{items}</ul>")


def _baseline(results_dir: Path) -> str:
    """The baseline gate's outcome and comparison (`run --baseline`), where it ran."""
    outcome, comparison = read_gate(results_dir)
    if not outcome:
        return ""
    return (f"<h2>Against the baseline</h2><p><b>{_e(outcome.get('line'))}</b></p>"
            + (f"<pre>{_e(comparison)}</pre>" if comparison else ""))


def write_html(results_dir: Path, rows: list[dict[str, Any]], pipes: list[dict[str, Any]],
               records: list[dict[str, Any]], charts: list[Path],
               telemetry_charts: list[Path]) -> Path:
    """Write results_dir/report.html and return its path."""
    results_dir = Path(results_dir)
    name = results_dir.name
    imgs = "".join(f'<p><img src="charts/{_e(c.name)}" alt="{_e(c.name)}"></p>'
                   for c in charts if c.suffix == ".png" and c.name != CONVERGE_CHART)
    virtual = any(r["virtual_devices"] for r in rows)
    intervals = interval_notes(r.get("interval") for r in rows)
    parts = [
        f"<h1>Benchmark report: {_e(name)}</h1>",
        f"<p><b>Virtual CPU devices:</b> {VIRTUAL_CAVEAT}</p>" if virtual else "",
        _damaged(results_dir),
        _findings(rows, records),
        "<h2>Summary</h2>",
        _summary(rows) if rows else "<p>No benchmark runs.</p>",
        "<p>img/s is the median over repeats with its interval over repeats: "
        + ("; ".join(_e(n) for n in intervals) if intervals else "none (one run each)")
        + f". {SUMMARY_TERMS}</p>",
        _header(records, rows, results_dir, sweep_config(results_dir)),
        _baseline(results_dir),
        strategies_section(records),
        "<h2>Flagged</h2>", _flagged(rows),
        where_the_time_went(rows, records),
        allreduce_section(results_dir, records),
        capacity_section(results_dir),
        converge_section(converge_rows(records),
                         next((c for c in charts if c.name == CONVERGE_CHART), None)),
        "<h2>Charts</h2>", imgs,
        published_section([*rows, *pipes, *records]),
        "<h2>Memory per device</h2>", _memory(records),
        "<h2>Placement</h2>", "<p>Where each run's work ran, as its framework reported it, "
        "checked by the parent (bench/records/placement_check.py).</p>", _placement(records),
        "<h2>Runs</h2>", _runs(results_dir, records, {p.stem for p in telemetry_charts}),
    ]
    if pipes:
        at = parts.index("<h2>Charts</h2>")
        parts[at:at] = ["<h2>Input pipelines alone</h2>", _table(
            ["pipeline", "model", "batch", "workers", "status", "img/s", "img/s per core",
             "x pil_loop"],
            [[_e(p["pipeline"]), _e(p["model"]), _e(p["batch"]), _e(p["loader_workers"]),
              _e(p["status"]), _num(p["images_per_sec"], ".1f"),
              _num(p["images_per_sec_per_core"], ".1f"), _num(p["vs_baseline"], ".2f")]
             for p in pipes])]
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(name)}</title>"
            f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>\n")
    path = results_dir / "report.html"
    write_text_atomic(path, inline_images(page, results_dir))
    return path
