"""`--format junit`: a test suite per image platform, a test case per check id.

A check passes when it has no finding on that platform; its failure lists every finding,
so CI dashboards show which kind of breakage appeared, not thousands of rows.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from execwatch.scan.model import Check, ScanReport


def render_junit(report: ScanReport) -> str:
    suites = ET.Element("testsuites", name="execwatch scan")
    total_failures = total_tests = 0
    for result in report.results:
        suite = ET.SubElement(suites, "testsuite", name=f"{result.source} [{result.platform}]")
        failures = 0
        for check in Check:
            case = ET.SubElement(
                suite, "testcase", classname=f"execwatch.scan.{result.platform}", name=str(check)
            )
            hits = [f for f in result.findings if f.check == check]
            if hits:
                failures += 1
                failure = ET.SubElement(
                    case, "failure", message=f"{len(hits)} finding(s)", type=hits[0].severity.label
                )
                failure.text = "\n".join(
                    f"{f.severity.label}: {f.path}{' (entrypoint)' if f.entrypoint else ''}:"
                    f" {f.message}"
                    for f in hits
                )
        suite.set("tests", str(len(Check)))
        suite.set("failures", str(failures))
        suite.set("time", f"{result.stats.seconds:.3f}")
        total_failures += failures
        total_tests += len(Check)
    suites.set("tests", str(total_tests))
    suites.set("failures", str(total_failures))
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"
