"""junit.xml follows the JUnit schema CI systems read (Jenkins xUnit's junit-10.xsd, the one
pytest checks its own reports against): runs of every status, a regression, reasons with XML's
special characters and non-ASCII text, an empty sweep; and the check fails a document that
breaks the schema."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from bench.records.store import STATUSES
from bench.report.junit import junit_xml
from tests.helpers.junit import assert_valid_junit
from tests.helpers.records import run_record

REGRESSED = "tf_mirrored minigooglenet synthetic fp32 b32/dev 2 vcpu"


def records_of_every_status() -> list[dict]:
    recs = [run_record(1, 0, 100.0), run_record(2, 0, 150.0)]  # ok; the second regressed
    for i, status in enumerate(s for s in STATUSES if s != "ok"):
        recs.append({**run_record(1, i + 1, 100.0), "status": status, "run_id": f"{status}-run",
                     "reason": f"{status}: <rank 1> & \"ränk 0\" said 'ΔT' \x1b[31m",
                     "wall_time_s": 1234.56789})
    return recs


def test_every_status_and_a_regression_follow_the_schema() -> None:
    doc = junit_xml("sweep", records_of_every_status(), {"regressed": [REGRESSED]})
    assert_valid_junit(doc)
    root = ET.fromstring(doc)
    failed = next(c for c in root.iter("testcase") if c.get("name") == "failed-run")
    # a character XML cannot hold (ESC) is written out, the rest kept as it was
    assert failed.find("failure").get("message") == ("failed: failed: <rank 1> & \"ränk 0\" "
                                                     "said 'ΔT' \\x1b[31m")
    assert int(root.get("tests")) == len(STATUSES) + 1 == len(list(root.iter("testcase")))


def test_an_empty_sweep_follows_the_schema() -> None:
    assert_valid_junit(junit_xml("empty", [], None))


@pytest.mark.parametrize("break_it", [
    lambda d: re.sub(r'(<testcase [^>]*?) name="[^"]*"', r"\1", d, count=1),  # a nameless case
    lambda d: d.replace(' errors="0" skipped', " skipped", 1),  # a suite without its errors
    lambda d: d.replace("<properties>", "<properties><note />", 1),  # an element it lacks
    lambda d: re.sub(r'(<testsuite [^>]*?time=")[^"]*"', r'\g<1>1.5 s"', d, count=1),
], ids=["nameless-case", "suite-without-errors", "foreign-element", "time-with-a-unit"])
def test_the_check_fails_a_document_that_breaks_the_schema(break_it) -> None:  # noqa: ANN001
    doc = junit_xml("sweep", [run_record(1, 0, 100.0)], None)
    broken = break_it(doc)
    assert broken != doc
    with pytest.raises(AssertionError, match="does not follow junit-10.xsd"):
        assert_valid_junit(broken)
