"""Smoke checks for people and for CI: the report as text, and as JUnit XML (one test case per check)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

from launcher.job.smoke import EXIT_CODES, SmokeReport


def text(report: SmokeReport) -> str:
    kept = f" ({report.layers} layer{'s' if report.layers > 1 else ''} kept)" if report.layers else ""
    lines = [f"smoke test of {report.model}{kept}"]
    if report.strategy:
        lines.append(f"strategy: {report.strategy}")
    width = max(len(c.name) for c in report.checks) if report.checks else 8
    for check in report.checks:
        lines.append(f"  {check.status:<5} {check.name:<{width}}  {check.message}")
    if report.full_model:
        full = report.full_model
        lines.append(f"full model ({full['layers']} layers) on this host: {full['summary']}")
    failed = report.failed
    lines.append("smoke test passed" if failed is None else f"smoke test FAILED: {failed.name}: {failed.message}")
    return "\n".join(lines)


def write_junit(report: SmokeReport, path: Path) -> None:
    """One <testcase> per check (JUnit XML, which CI systems display)."""
    suite = ET.Element(
        "testsuite",
        name="offload-launch smoke",
        tests=str(len(report.checks)),
        failures=str(sum(c.passed is False for c in report.checks)),
        skipped=str(sum(c.passed is None for c in report.checks)),
        time=f"{sum(c.seconds for c in report.checks):.3f}",
    )
    for check in report.checks:
        case = ET.SubElement(
            suite,
            "testcase",
            classname=f"offload-launch.smoke.{report.model}",
            name=check.name,
            time=f"{check.seconds:.3f}",
        )
        if check.passed is False:
            failure = ET.SubElement(case, "failure", message=check.message, type=f"exit {EXIT_CODES[check.name]}")
            failure.text = json.dumps(check.details, indent=2) if check.details else check.message
        elif check.passed is None:
            ET.SubElement(case, "skipped", message=check.message)
        else:
            ET.SubElement(case, "system-out").text = check.message
    root = ET.Element("testsuites")
    root.append(suite)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
