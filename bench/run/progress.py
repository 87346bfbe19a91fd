"""Progress a person can read: environment builds and sweeps.

On a terminal (stdout and stderr both TTYs) a live display drawn with `rich`: for a build the
step (venv, resolve, download, install, build), the package in hand, how many packages and
bytes have come down, and the elapsed time; for a sweep the runs done out of the total, the
run in progress and for how long, the sweep's elapsed time and an estimate of what is left
from the runs so far. Anywhere else (CI logs, pytest's capture, a pipe) one plain line per
event, exactly the lines the harness printed before this module existed.
`MGBENCH_PROGRESS=plain` (or `live`) overrides the choice.

The installers' own output is parsed here (`InstallState.feed`), never their progress bars:
pip with `--progress-bar off` and uv without a terminal print one line per event.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

# pip's (and uv's) lines that the plain mode shows during an install, as before: the rest of
# pip's chatter (mirror warnings, "Requirement already satisfied") stays in the log file.
PLAIN_PREFIXES = ("Collecting", "Downloading", "Building", "Installing", "Successfully", "ERROR",
                  "Resolved", "Prepared", "Installed", "Downloaded", "error:")
TAIL_LINES = 20  # the log lines shown when a build fails on a terminal


def live_wanted() -> bool:
    """Whether to draw a live display: MGBENCH_PROGRESS=live|plain decides, else a terminal on
    both stdout and stderr (not TERM=dumb) with rich importable."""
    mode = os.environ.get("MGBENCH_PROGRESS", "auto").lower()
    if mode == "plain":
        return False
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    if mode == "live":
        return True
    ttys = all(getattr(s, "isatty", lambda: False)() for s in (sys.stdout, sys.stderr))
    return ttys and os.environ.get("TERM", "") != "dumb"


def clock_text(seconds: float) -> str:
    """0:07, 12:34 or 1:02:05."""
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}" if minutes >= 60 else \
        f"{minutes}:{secs:02d}"


def size_text(nbytes: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if nbytes < 1000 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1000
    raise AssertionError("unreachable")


_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30}


def parse_size(text: str) -> int | None:
    """Bytes of "49.1 MB" (pip, decimal) or "46.8MiB" (uv, binary); None if it is not one."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([kKMG]?i?B)\s*", text)
    if not m:
        return None
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


# ---------------------------------------------------------------------------------------------
# Environment builds

PIP_COLLECTING = re.compile(r"^Collecting (\S+)")
PIP_DOWNLOADING = re.compile(r"^\s*Downloading (\S+)(?: \(([^)]*)\))?")
PIP_PROCESSING = re.compile(r"^Processing (\S+)")
PIP_INSTALLING = re.compile(r"^Installing collected packages: (.*)")
PIP_INSTALLED = re.compile(r"^Successfully installed (.*)")
PIP_BUILDING = re.compile(r"^\s*Building wheel for (\S+)")
UV_RESOLVED = re.compile(r"^Resolved (\d+) packages?")
UV_DOWNLOADING = re.compile(r"^Downloading (\S+) \(([^)]*)\)")
UV_DOWNLOADED = re.compile(r"^\s*Downloaded (\S+)")
UV_PREPARED = re.compile(r"^Prepared (\d+) packages?")
UV_INSTALLED = re.compile(r"^Installed (\d+) packages?")
UV_PLUS = re.compile(r"^ \+ (\S+)")
UV_BUILDING = re.compile(r"^\s*Building ([\w.-]+)(?:==| @ )")


@dataclass
class InstallState:
    """What an install is doing, read off pip's or uv's output one line at a time."""

    step: str = "start"  # venv | resolve | download | install | build | done
    package: str = ""  # the package (or file) in hand
    packages: int | None = None  # how many the install holds (the lock's count, uv's resolve)
    downloads: int = 0  # downloads finished
    downloaded: int = 0  # their bytes (the sizes pip and uv print; small files have none)
    installed: int = 0
    last: str = ""  # the last line of output
    in_flight: dict[str, int | None] = field(default_factory=dict)  # downloads under way

    def set_step(self, step: str, package: str = "") -> None:
        self._land()
        self.step, self.package = step, package

    def _land(self) -> None:
        """pip prints a download's line when it starts; the next event means it has landed."""
        for size in self.in_flight.values():
            self.downloads += 1
            self.downloaded += size or 0
        self.in_flight.clear()

    def feed(self, line: str) -> None:
        text = line.rstrip()
        if not text.strip():
            return
        self.last = text.strip()
        # uv first: its lines are the more specific ones
        if m := UV_RESOLVED.match(text):
            self.packages = int(m.group(1))
            self.step, self.package = "download", ""
        elif m := UV_DOWNLOADING.match(text):
            self.step, self.package = "download", m.group(1)
            self.in_flight[m.group(1)] = parse_size(m.group(2))
        elif m := UV_DOWNLOADED.match(text):
            size = self.in_flight.pop(m.group(1), None)
            self.downloads += 1
            self.downloaded += size or 0
            if self.package == m.group(1):
                self.package = next(iter(self.in_flight), "")
        elif m := UV_PREPARED.match(text):
            self.set_step("install")
        elif m := UV_INSTALLED.match(text):
            self.installed = int(m.group(1))
            self.set_step("done")
        elif m := UV_PLUS.match(text):
            self.package = m.group(1)
        elif m := PIP_COLLECTING.match(text):
            self._land()
            self.step, self.package = "resolve", m.group(1)
        elif m := PIP_DOWNLOADING.match(text):
            self._land()
            name = m.group(1).rsplit("/", 1)[-1]
            self.step, self.package = "download", name
            self.in_flight[name] = parse_size(m.group(2) or "")
        elif m := PIP_PROCESSING.match(text):
            self._land()
            self.step, self.package = "download", Path(m.group(1)).name
        elif m := PIP_INSTALLING.match(text):
            names = [n.strip() for n in m.group(1).split(",")]
            self.set_step("install", ", ".join(names[:3]) + (" ..." if len(names) > 3 else ""))
        elif m := PIP_INSTALLED.match(text):
            self.installed = len(m.group(1).split())
            self.set_step("done")
        elif (m := PIP_BUILDING.match(text)) or (m := UV_BUILDING.match(text)):
            self._land()
            self.step, self.package = "build", m.group(1)

    def summary(self) -> str:
        """What has come down and gone in so far: "7 downloaded, 41.1 MB; 23 installed"."""
        parts = []
        if self.downloads:
            parts.append(f"{self.downloads} downloaded, {size_text(self.downloaded)}")
        if self.installed:
            parts.append(f"{self.installed} installed")
        return "; ".join(parts)


def start_live(renderable: Any, console: Any, refresh_per_second: int, redirect: bool
               ) -> tuple[Any, Any]:
    """A started transient rich Live display of `renderable` (on `console`, or a new one) and
    that console; `redirect`: print() output lands above the display."""
    from rich.console import Console
    from rich.live import Live

    console = console or Console()
    live = Live(renderable, console=console, refresh_per_second=refresh_per_second,
                transient=True, redirect_stdout=redirect, redirect_stderr=redirect)
    live.start()
    return console, live


class BuildDisplay:
    """The progress of one environment build. Every line of the installers' output goes to
    the log file; plain mode prints the same lines as before (the [setup] messages, and the
    installer's progress lines indented), live mode a display that keeps to a few lines, and
    on failure the log's tail. quiet prints nothing in either mode."""

    def __init__(self, name: str, log_path: Path | None = None, *, quiet: bool = False,
                 live: bool | None = None, packages: int | None = None,
                 console: Any = None) -> None:
        self.name = name
        self.quiet = quiet
        self.live = (not quiet) and (live_wanted() if live is None else live)
        self.state = InstallState(packages=packages)
        self.log_path = log_path
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.t0 = time.monotonic()
        self.step_t0 = self.t0
        self.installer = ""
        self._log: IO[str] | None = None
        self._live: Any = None
        self._console = console

    # -- context --------------------------------------------------------------------------
    def __enter__(self) -> BuildDisplay:
        if self.log_path is not None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.log_path, "w", encoding="utf-8", errors="replace")  # noqa: SIM115
        if self.live:
            self._console, self._live = start_live(self, self._console, 8, redirect=False)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        if self._log is not None:
            self._log.close()
            self._log = None
        if exc is not None and not self.quiet and not isinstance(exc, KeyboardInterrupt):
            self.failed()

    # -- events ---------------------------------------------------------------------------
    def say(self, message: str) -> None:
        """One of the harness's own [setup] lines."""
        self._write_log(message)
        if self.quiet:
            return
        if self._live is not None:
            self._console.print(message, markup=False, highlight=False)
        else:
            print(message, flush=True)

    def step(self, step: str, package: str = "") -> None:
        self.state.set_step(step, package)
        self.step_t0 = time.monotonic()

    def line(self, text: str, all_lines: bool = False) -> None:
        """A line of an installer's (or build script's) output."""
        text = text.rstrip("\n")
        self._write_log(text)
        self.tail.append(text)
        self.state.feed(text)
        if self.quiet or self._live is not None:
            return
        if all_lines or text.startswith(PLAIN_PREFIXES):
            print(f"    {text.rstrip()}", flush=True)

    def failed(self) -> None:
        """After a failure: on a terminal the last lines of the log (the live display showed
        none of it); in both modes where the whole log is."""
        out = sys.stderr
        if self.live and self.tail:
            print(f"[setup] {self.name}: failed; the last {len(self.tail)} lines of its log:",
                  file=out)
            for ln in self.tail:
                print(f"    {ln}", file=out)
        if self.log_path is not None:
            print(f"[setup] {self.name}: full log: {self.log_path}", file=out, flush=True)

    def _write_log(self, text: str) -> None:
        if self._log is not None:
            self._log.write(text.rstrip("\n") + "\n")
            self._log.flush()

    # -- drawing --------------------------------------------------------------------------
    def __rich__(self) -> Any:
        from rich.spinner import Spinner
        from rich.table import Table
        from rich.text import Text

        s = self.state
        now = time.monotonic()
        head = Text.assemble((f"setup {self.name}", "bold"),
                             f"{' with ' + self.installer if self.installer else ''}  ",
                             (clock_text(now - self.t0), "cyan"))
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="dim", no_wrap=True)
        grid.add_column(no_wrap=True, overflow="ellipsis")
        grid.add_row(Spinner("dots"), head)
        step = s.step + (f"  {clock_text(now - self.step_t0)}" if s.step != "done" else "")
        grid.add_row("step", step)
        if s.package:
            size = s.in_flight.get(s.package)
            more = len(s.in_flight) - (s.package in s.in_flight)
            grid.add_row("package", s.package + (f" ({size_text(size)})" if size else "")
                         + (f" and {more} more" if more > 0 else ""))
        if s.packages is not None:
            grid.add_row("lock", f"{s.packages} package{'' if s.packages == 1 else 's'}")
        if s.summary():
            grid.add_row("so far", s.summary())
        if s.last:
            grid.add_row("output", Text(s.last[:200], style="dim"))
        return grid


# ---------------------------------------------------------------------------------------------
# Sweeps

class SweepClock:
    """Elapsed time and an estimate of what is left, from the runs launched so far (runs
    recorded without launching take no time)."""

    def __init__(self, launched: list[bool]) -> None:
        self.t0 = time.monotonic()
        self.launched = launched
        self.took: list[float] = []
        self.done = 0

    def tick(self, seconds: float) -> str:
        if self.launched[self.done]:
            self.took.append(seconds)
        self.done += 1
        left = sum(self.launched[self.done:])
        text = f"{self.done}/{len(self.launched)} done, {clock_text(time.monotonic() - self.t0)}"
        if left and self.took:
            text += f", ~{clock_text(left * sum(self.took) / len(self.took))} left"
        return f"[{text}]"

    def left_s(self, running_s: float = 0.0) -> float | None:
        """Seconds left: the launched runs still to go at the mean so far, less what the run in
        progress has already taken; None before the first launched run has finished."""
        left = sum(self.launched[self.done:])
        if not self.took or not left:
            return None if left else 0.0
        return max(0.0, left * sum(self.took) / len(self.took) - running_s)


class SweepProgress:
    """A sweep's progress. Plain: `<run> ... ` when a run starts and `<status> (<s>) <detail>
    [i/n done, elapsed, ~left]` when it ends, one line per run as before. Live: the same
    finished lines scroll above a footer with a bar of runs done out of the total, the run in
    progress and for how long, the elapsed time and the estimate of what is left."""

    def __init__(self, launched: list[bool], *, live: bool | None = None,
                 console: Any = None) -> None:
        self.clock = SweepClock(launched)
        self.live = live_wanted() if live is None else live
        self.current: str | None = None
        self.current_t0 = 0.0
        self._console = console
        self._live: Any = None

    def __enter__(self) -> SweepProgress:
        if self.live:
            # print() from anywhere (the peak probe, a setup) lands above the footer
            self._console, self._live = start_live(self, self._console, 4, redirect=True)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def started(self, label: str) -> None:
        self.current, self.current_t0 = label, time.monotonic()
        if self._live is None:
            print(f"{label} ...", end=" ", flush=True)

    def finished(self, label: str, result: str, took: float, counted: bool = True) -> None:
        """A run ended with result ("ok (12.3s) 456.7 img/s"); counted: one of the sweep's
        planned runs (an until_stable repeat is not)."""
        tick = self.clock.tick(took) if counted else ""
        self.current = None
        line = result + (f"  {tick}" if tick else "")
        if self._live is None:
            print(line, flush=True)
        else:
            self._console.print(f"{label} ... {line}", markup=False, highlight=False)

    def __rich__(self) -> Any:
        from rich.progress_bar import ProgressBar
        from rich.spinner import Spinner
        from rich.table import Table
        from rich.text import Text

        c = self.clock
        now = time.monotonic()
        running = now - self.current_t0 if self.current else 0.0
        left = c.left_s(running)
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True)
        grid.add_column(no_wrap=True)
        grid.add_column(no_wrap=True, overflow="ellipsis")
        total = max(len(c.launched), 1)
        stats = Text.assemble((f"{c.done}/{len(c.launched)} runs done", "bold"),
                              f"  elapsed {clock_text(now - c.t0)}",
                              f"  ~{clock_text(left)} left" if left else "")
        grid.add_row(Spinner("dots"), ProgressBar(total=total, completed=c.done, width=30),
                     stats)
        if self.current:
            grid.add_row("", Text(f"running {clock_text(running)}", style="cyan",
                                  justify="right"), self.current)
        return grid


def outcome_detail(rec: dict[str, Any]) -> str:
    """A finished run's record in a few words, for its progress line: the reason it did not
    succeed, an all-reduce probe's bus bandwidth at the gradient size, or its images/sec."""
    if rec["status"] != "ok":
        return str(rec["reason"])
    if rec.get("mode") != "allreduce":
        tokens = rec.get("tokens_per_sec")
        return (f"{rec['images_per_sec']:.1f} samples/s, {tokens:.1f} tok/s" if tokens
                else f"{rec['images_per_sec']:.1f} img/s")
    probe = (rec.get("result") or {}).get("allreduce") or {}
    busbw, algbw, size = probe.get("busbw_gbps"), probe.get("algbw_gbps"), \
        probe.get("gradient_bytes")
    if not isinstance(busbw, (int, float)) or not isinstance(algbw, (int, float)) or not size:
        return "no figure at the gradient size"
    return (f"busbw {busbw:.2f} GB/s, algbw {algbw:.2f} GB/s at {size / 2**20:.1f} MiB "
            f"(the gradient size)")

