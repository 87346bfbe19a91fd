"""What JAX itself reports of a timed window: the compilations it ran (jax.monitoring's
backend-compile duration events, each naming its function) and the transfers between host and
devices (jax's transfer guard at log_explicit: one log line per transfer and destination device,
counted). Shared by the JAX runners; keras_fit.py opens it with its clock. An explicit loop
reads it with `evidence = WindowEvidence().listen()` before its first step, `on_start=
evidence.open` and, after the loop, `evidence.close()` and `join(..., evidence.record(steps))`.
Cost inside the window: one log line per transfer (microseconds). Imports jax only in listen()."""

from __future__ import annotations

import os
import re
import sys
import tempfile
from typing import Any

from contract.reasons import code

GUARD_LINE = re.compile(r"(host-to-device|device-to-host|device-to-device) transfer: "
                        r"aval=ShapedArray\(([^)]*)\)")
CANARY = (1, 7)  # the shape of the int8 array open() sends to read the guard's log back
DIRECTIONS = ("host-to-device", "device-to-host", "device-to-device")


def compile_event() -> str:
    """jax's event name for an XLA backend compile, read from the installed jax."""
    import jax
    from jax._src import dispatch

    name = getattr(dispatch, "BACKEND_COMPILE_EVENT", None)
    if name is None:
        raise RuntimeError(f"jax {jax.__version__} names no dispatch.BACKEND_COMPILE_EVENT; "
                           "update runners/jax/window_evidence.py")
    return name


class TransferLog:
    """fd 2 sent to a file while jax's transfer guard logs every transfer (log_explicit); the
    guard's lines counted, everything else written back to stderr."""

    def __init__(self) -> None:
        self._saved_fd: int | None = None
        self._file: Any = None
        self._guard: str | None = None

    def start(self) -> None:
        import jax
        import numpy as np

        sys.stderr.flush()
        self._file = tempfile.TemporaryFile()  # noqa: SIM115 (closed in stop())
        self._saved_fd = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        self._guard = jax.config.jax_transfer_guard
        jax.config.update("jax_transfer_guard", "log_explicit")
        jax.device_put(np.zeros(CANARY, np.int8), jax.local_devices()[0]).block_until_ready()

    def stop(self) -> dict[str, Any] | None:
        """{direction: transfers, "arrays": the shapes moved host-to-device, each with its
        count}; None when the guard's log did not come back (the canary unseen)."""
        import jax

        jax.config.update("jax_transfer_guard", self._guard)
        sys.stderr.flush()
        os.dup2(self._saved_fd, 2)
        os.close(self._saved_fd)
        self._file.seek(0)
        text = self._file.read().decode(errors="replace")
        self._file.close()
        counts, arrays, canary, rest = dict.fromkeys(DIRECTIONS, 0), {}, 0, []
        canary_aval = f"int8[{','.join(map(str, CANARY))}]"
        for line in text.splitlines():
            m = GUARD_LINE.search(line)
            if m is None:
                rest.append(line)
            elif m[2] == canary_aval:
                canary += 1
            else:
                counts[m[1]] += 1
                if m[1] == "host-to-device":
                    arrays[m[2]] = arrays.get(m[2], 0) + 1
        if rest:
            sys.stderr.write("\n".join(rest) + "\n")
        if not canary:
            return None
        return {**{d.replace("-", "_"): n for d, n in counts.items()},
                "arrays_to_device": [f"{aval} x {n}" for aval, n in sorted(arrays.items())]}


def listed(compiles: list[tuple[str, float]]) -> list[dict[str, Any]]:
    return [{"function": name, "seconds": round(seconds, 4)} for name, seconds in compiles]


class WindowEvidence:
    """The compiles JAX ran from listen() on (`compiled`: (function, seconds)), those of the
    window between open() and close(), and the window's transfers."""

    def __init__(self) -> None:
        self.compiled: list[tuple[str, float]] = []
        self.window: tuple[int, int] | None = None  # compiled[i:j] fell in the window
        self.transfers: dict[str, Any] | None = None
        self._log: TransferLog | None = None
        self._event = ""

    def _heard(self, event: str, seconds: float, **kwargs: Any) -> None:
        if event == self._event:
            self.compiled.append((str(kwargs.get("fun_name")), float(seconds)))

    def listen(self) -> WindowEvidence:
        """Hear JAX's compiles from now on (once)."""
        if not self._event:
            from jax import monitoring

            self._event = compile_event()
            monitoring.register_event_duration_secs_listener(self._heard)
        return self

    def open(self) -> None:
        self.window = (len(self.compiled), len(self.compiled))
        self._log = TransferLog()
        self._log.start()

    def close(self) -> None:
        """Ends the window and stops listening (a later call does nothing)."""
        if self._log is not None and self.window is not None:
            self.transfers, self._log = self._log.stop(), None
            self.window = (self.window[0], len(self.compiled))
        if self._event:
            from jax import monitoring

            monitoring.unregister_event_duration_listener(self._heard)
            self._event = ""

    def in_window(self) -> list[tuple[str, float]]:
        return self.compiled[slice(*self.window)] if self.window else []

    def record(self, steps: int) -> dict[str, Any]:
        """`window_evidence` (the window's compiles and transfers over its `steps` steps) and
        `window_recompiled` (a sentence when JAX compiled in the window, else None)."""
        inside = self.in_window()
        before = self.compiled[:self.window[0]] if self.window else self.compiled
        note = None
        if inside:
            names = sorted({name for name, _ in inside})
            note = (f"{len(inside)} compile(s) in the timed window, {' and '.join(names)}, "
                    f"{sum(s for _, s in inside):.2f} s; {code('jax.compiled_in_window')}")
        return {"window_recompiled": note, "window_evidence": {
            "steps": steps,
            "compiles": len(inside),
            "compiled": listed(inside),
            "compiled_before_window": listed(before),
            "transfers": self.transfers,
            "source": code("jax.window_evidence_source")}}
