"""JUnit XML for CI test reports: ``kvspec fuzz --junit-xml`` (one testcase per family) and
``kvspec replay --junit-xml`` (one testcase per trace).

A finding is a ``<failure>`` whose ``message`` is the finding's one-line summary and whose text
names the report folder (and how to replay it); a family the target models none of, or one the
time budget did not reach, is ``<skipped>``.  The file is written atomically (a temporary file in
the same folder, then renamed), so a CI step never uploads half a report.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from kvspec.harness.run.paths import write_file_atomically

# XML 1.0 forbids most control characters, even escaped.
_BAD_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


@dataclass(frozen=True)
class Case:
    """One ``<testcase>``: passed when ``failure`` and ``skipped`` are both None."""

    classname: str
    name: str
    time: float = 0.0
    failure: str | None = None  # the one-line message
    failure_type: str = "finding"
    details: str = ""  # the failure's text (report path, replay command, ...)
    skipped: str | None = None


def _clean(text: str) -> str:
    return _BAD_XML.sub("?", text)


def render_junit(suite: str, cases: list[Case], time: float) -> bytes:
    """The JUnit XML document: ``<testsuites>`` holding one ``<testsuite>``."""
    failures = sum(c.failure is not None for c in cases)
    skipped = sum(c.skipped is not None and c.failure is None for c in cases)
    attrs = {
        "name": suite,
        "tests": str(len(cases)),
        "failures": str(failures),
        "errors": "0",
        "skipped": str(skipped),
        "time": f"{time:.3f}",
    }
    root = ET.Element("testsuites", attrs)
    ts = ET.SubElement(root, "testsuite", attrs)
    for c in cases:
        tc = ET.SubElement(
            ts, "testcase", {"classname": _clean(c.classname), "name": _clean(c.name), "time": f"{c.time:.3f}"}
        )
        if c.failure is not None:
            el = ET.SubElement(tc, "failure", {"message": _clean(c.failure), "type": _clean(c.failure_type)})
            el.text = _clean(c.details or c.failure)
        elif c.skipped is not None:
            ET.SubElement(tc, "skipped", {"message": _clean(c.skipped)})
    ET.indent(root)
    data: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
    return data + b"\n"


def write_junit(path: str | Path, suite: str, cases: list[Case], time: float) -> Path:
    """Write the document atomically; return the path."""
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_file_atomically(dest, render_junit(suite, cases, time))
    return dest
