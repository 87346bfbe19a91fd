"""The JUnit schema CI systems read (tests/golden/junit/junit-10.xsd), loaded once."""

from __future__ import annotations

import functools
from pathlib import Path

import xmlschema

SCHEMA = Path(__file__).resolve().parents[1] / "golden" / "junit" / "junit-10.xsd"


@functools.cache
def junit_schema() -> xmlschema.XMLSchema:
    return xmlschema.XMLSchema(str(SCHEMA))


def assert_valid_junit(document: str | Path) -> None:
    """Fail naming the schema's first complaint about a junit.xml (its text or its path)."""
    source = document.read_text() if isinstance(document, Path) else document
    errors = list(junit_schema().iter_errors(source))
    assert not errors, f"junit.xml does not follow {SCHEMA.name}: {errors[0]}"
