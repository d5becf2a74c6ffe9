"""``junit.xml`` for runs made outside pytest (``deltacheck run``), so CI systems show each result.

One testcase per result (classname ``deltacheck.<backend>.<op>``, name ``<case>::<check>``); fail and
error results carry their reason, metrics and the repro command; skips carry their reason. A required
backend × op pair that failed becomes a failing testcase of its own, so the XML fails whenever the run did.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from typing import Any

from .load import Run
from .summary import fmt_err, fmt_headroom, result_repro

# Characters XML 1.0 cannot hold at all (ElementTree would write them and make the file unreadable).
_XML_ILLEGAL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _text(value: Any) -> str:
    return _XML_ILLEGAL.sub("?", str(value))


def _failure_text(result: dict[str, Any]) -> str:
    m = result["metrics"]
    lines = [result["reason"], ""]
    for key in ("rel_rms", "limit", "threshold", "max_abs", "baseline", "cosine"):
        if m.get(key) is not None:
            lines.append(f"{key}: {fmt_err(m[key])}")
    if m.get("headroom") is not None:
        lines.append(f"headroom: {fmt_headroom(m['headroom'])}")
    for key in ("nan", "inf", "first_bad_token", "worst_head", "worst_seq"):
        if m.get(key) is not None:
            lines.append(f"{key}: {m[key]}")
    lines += ["", f"repro: {result_repro(result)}"]
    return "\n".join(lines)


def render_junit(run: Run, required_failure_lines: list[str]) -> str:
    suites_el = ET.Element("testsuites", name=f"deltacheck {run.label}")
    by_pair: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in run.results:
        by_pair[(r["backend"], r["op"])].append(r)

    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if required_failure_lines:
        suite = ET.SubElement(suites_el, "testsuite", name="deltacheck.required")
        for line in required_failure_lines:
            case_el = ET.SubElement(suite, "testcase", classname="deltacheck.required", name=_text(line)[:200], time="0")
            ET.SubElement(case_el, "failure", message=_text(line), type="required").text = _text(line)
        n = len(required_failure_lines)
        suite.set("tests", str(n)), suite.set("failures", str(n)), suite.set("errors", "0"), suite.set("skipped", "0")
        totals["tests"] += n
        totals["failures"] += n

    for (backend, op), results in sorted(by_pair.items()):
        suite = ET.SubElement(suites_el, "testsuite", name=_text(f"deltacheck.{backend}.{op}"))
        if run.env:
            props = ET.SubElement(suite, "properties")
            for name, value in sorted((run.versions or {}).items()):
                ET.SubElement(props, "property", name=_text(name), value=_text(value))
            if run.env.get("device_name"):
                ET.SubElement(props, "property", name="device", value=_text(run.env["device_name"]))
        counts = {"failures": 0, "errors": 0, "skipped": 0}
        for r in results:
            case_el = ET.SubElement(suite, "testcase", classname=_text(f"deltacheck.{backend}.{op}"),
                                    name=_text(f"{r['case']}::{r['check']}"), time=f"{r['seconds']:.3f}")
            if r["status"] == "fail":
                counts["failures"] += 1
                el = ET.SubElement(case_el, "failure", message=_text(r["reason"]), type="numerical")
                el.text = _text(_failure_text(r))
            elif r["status"] == "error":
                counts["errors"] += 1
                el = ET.SubElement(case_el, "error", message=_text(r["reason"]), type="error")
                el.text = _text(_failure_text(r))
            elif r["status"] == "skip":
                counts["skipped"] += 1
                ET.SubElement(case_el, "skipped", message=_text(r["reason"]))
            elif r["status"] == "known":  # an expected failure (a known-issues entry), as pytest writes xfail
                counts["skipped"] += 1
                ET.SubElement(case_el, "skipped", type="pytest.xfail", message=_text(r["reason"]))
        suite.set("tests", str(len(results)))
        for key, n in counts.items():
            suite.set(key, str(n))
            totals[key] += n
        suite.set("time", f"{sum(r['seconds'] for r in results):.3f}")
        totals["tests"] += len(results)

    for key, n in totals.items():
        suites_el.set(key, str(n))
    ET.indent(suites_el)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suites_el, encoding="unicode") + "\n"
