"""junit.xml: every run of a results folder as a JUnit test case, for a CI system's test view.

A run is a <testsuite> holding its one <testcase> (classname mgbench.<runner>, name its run
id), so that its figures (images/sec, MFU, memory per device, status) travel as the suite's
<properties>, where the JUnit schema CI systems read allows them. failed, timeout, oom and
invalid runs are failures with the run's reason; unavailable runs are skipped; a run of a
configuration the baseline gate found slower (baseline.json) is a failure saying so.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from bench.analysis.compare import label_of
from bench.atomic import write_text_atomic

NAME = "junit.xml"
# characters XML 1.0 cannot hold at all (a reason may carry a terminal's colour codes):
# written as \\xNN so the file stays well-formed and the text readable
NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
PROPERTIES = (("status", ("status",)), ("images_per_sec", ("images_per_sec",)),
              ("mfu", ("mfu", "mfu")), ("memory_per_device_max", ("memory_per_device",)),
              ("time_to_target_s", ("time_to_target_s",)))


def _value(rec: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = rec
    for key in path:
        node = node.get(key) if isinstance(node, Mapping) else None
    if isinstance(node, Mapping):  # memory per device: the largest device's
        numbers = [v for v in node.values() if isinstance(v, (int, float))]
        return max(numbers) if numbers else None
    return node


def _text(value: Any) -> str:
    return NOT_XML.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


def _label(rec: Mapping[str, Any]) -> str | None:
    try:
        return label_of(dict(rec))
    except (KeyError, TypeError):
        return None


def _case(suites: ET.Element, rec: Mapping[str, Any], regressed: set[str]) -> tuple[int, int]:
    """One run's suite and case; (failures, skipped) it adds."""
    run_id = _text(rec.get("run_id") or "?")
    wall = rec.get("wall_time_s")
    time = f"{wall:.3f}" if isinstance(wall, (int, float)) else "0"
    suite = ET.SubElement(suites, "testsuite", name=run_id, tests="1", time=time)
    props = ET.SubElement(suite, "properties")
    for name, path in PROPERTIES:
        value = _value(rec, path)
        if value is not None:
            ET.SubElement(props, "property", name=name, value=_text(value))
    case = ET.SubElement(suite, "testcase", classname=f"mgbench.{rec.get('runner')}",
                         name=run_id, time=time)
    status, reason = rec.get("status"), _text(rec.get("reason") or "no reason recorded")
    failures = skipped = 0
    if status == "unavailable":
        ET.SubElement(case, "skipped", message=f"unavailable: {reason}")
        skipped = 1
    elif status != "ok":  # failed, timeout, oom, invalid
        ET.SubElement(case, "failure", type=str(status), message=f"{status}: {reason}")
        failures = 1
    elif _label(rec) in regressed:
        ET.SubElement(case, "failure", type="regression",
                      message=f"slower than the baseline: {_label(rec)}")
        failures = 1
    suite.set("failures", str(failures))
    suite.set("errors", "0")
    suite.set("skipped", str(skipped))
    return failures, skipped


def junit_xml(name: str, records: list[dict[str, Any]], gate: Mapping[str, Any] | None) -> str:
    """The document: a <testsuites> of one suite per run, in run id order."""
    regressed = set((gate or {}).get("regressed") or [])
    suites = ET.Element("testsuites", name=name)
    failures = 0
    for rec in sorted(records, key=lambda r: str(r.get("run_id"))):
        failures += _case(suites, rec, regressed)[0]
    suites.set("tests", str(len(records)))
    suites.set("failures", str(failures))
    suites.set("errors", "0")
    ET.indent(suites)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suites, "unicode") + "\n"


def write_junit(results_dir: Path, records: list[dict[str, Any]],
                gate: Mapping[str, Any] | None) -> Path:
    """Write results_dir/junit.xml (atomically) and return its path."""
    path = Path(results_dir) / NAME
    write_text_atomic(path, junit_xml(Path(results_dir).resolve().name, records, gate))
    return path
