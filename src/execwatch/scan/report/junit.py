"""`--format junit`: a test suite per image platform, a test case per check id.

A check passes when it has no finding on that platform above a note; its failure lists
every finding, so CI dashboards show which kind of breakage appeared, not thousands of
rows. Notes alone (`run-started`: the entrypoint started) pass, their lines kept in the
case's system-out.

Well-formed for any file name: strings from the input are escaped (text.safe_name,
safe_prose), which leaves none of the characters XML 1.0 forbids (C0 controls,
surrogates, U+FFFE/U+FFFF), and the document is UTF-8, as its declaration says, whatever
the locale.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from execwatch.scan.model import Finding, ScanReport, Severity
from execwatch.scan.vocabulary import Check
from execwatch.text import safe_name, safe_prose

DECLARATION = '<?xml version="1.0" encoding="UTF-8"?>\n'


def _line(f: Finding) -> str:
    where = " (entrypoint)" if f.entrypoint else ""
    return f"{f.severity.label}: {safe_name(f.path)}{where}: {safe_prose(f.message)}"


def render_junit(report: ScanReport) -> str:
    suites = ET.Element("testsuites", name="execwatch scan")
    total_failures = total_tests = 0
    for result in report.results:
        platform = safe_name(result.platform)
        suite = ET.SubElement(suites, "testsuite", name=f"{safe_name(result.source)} [{platform}]")
        failures = 0
        for check in Check:
            case = ET.SubElement(
                suite, "testcase", classname=f"execwatch.scan.{platform}", name=str(check)
            )
            hits = [f for f in result.findings if f.check == check]
            if hits and all(f.severity is Severity.NOTE for f in hits):
                ET.SubElement(case, "system-out").text = "\n".join(_line(f) for f in hits)
            elif hits:
                failures += 1
                failure = ET.SubElement(
                    case, "failure", message=f"{len(hits)} finding(s)", type=hits[0].severity.label
                )
                failure.text = "\n".join(_line(f) for f in hits)
        suite.set("tests", str(len(Check)))
        suite.set("failures", str(failures))
        suite.set("time", f"{result.stats.seconds:.3f}")
        total_failures += failures
        total_tests += len(Check)
    suites.set("tests", str(total_tests))
    suites.set("failures", str(total_failures))
    ET.indent(suites)
    return DECLARATION + ET.tostring(suites, encoding="unicode") + "\n"
