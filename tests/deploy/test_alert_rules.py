"""Alert rules: valid for Prometheus, unit-tested with promtool, runbooks that exist."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from execwatch.handler.pod_events import event_reason
from execwatch.record import NOT_ALERTED, PLATFORM_REASONS, Reason, UndiagnosedCause
from tests.support.deploy.chart import REPO, find, render

RULES = REPO / "deploy" / "prometheus" / "execwatch-rules.yaml"
RULE_TESTS = Path(__file__).with_name("rules_test.yaml")
RUNBOOKS = REPO / "docs" / "runbooks"
BASE_URL = "https://github.com/execwatch/execwatch/blob/main/docs/runbooks/"
REASONS_ALERTED = [str(r) for r in Reason if r not in NOT_ALERTED]


def promtool() -> str:
    path = shutil.which("promtool")
    assert path, "promtool missing: apt-get install prometheus (dev/setup.sh --test)"
    return path


def alerts(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for g in groups for r in g["rules"] if "alert" in r]


def plain_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES.read_text())["groups"]
    return groups


def test_promtool_accepts_the_rules_file() -> None:
    out = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(alerts(plain_groups()))} rules found" in out.stdout


def test_promtool_unit_tests_pass() -> None:
    out = subprocess.run(
        [promtool(), "test", "rules", str(RULE_TESTS)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=RULE_TESTS.parent,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_alert_is_unit_tested_both_firing_and_silent() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    cases = [c for t in tests for c in t.get("alert_rule_test", [])]
    for rule in alerts(plain_groups()):
        mine = [c for c in cases if c["alertname"] == rule["alert"]]
        assert any(c["exp_alerts"] for c in mine), f"{rule['alert']} never shown firing"
        assert any(not c["exp_alerts"] for c in mine), f"{rule['alert']} never shown silent"


def test_every_alert_has_severity_summary_description_and_runbook() -> None:
    for rule in alerts(plain_groups()):
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule["alert"]
        assert {"summary", "description", "runbook_url"} <= rule["annotations"].keys()


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in markdown.splitlines():
        if m := re.match(r"#{1,6}\s+(.*)", line):
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower())
            out.add(text.replace(" ", "-"))
    return out


def test_every_runbook_url_resolves_to_a_runbook_file_and_anchor() -> None:
    for rule in alerts(plain_groups()):
        url = rule["annotations"]["runbook_url"]
        assert url.startswith(BASE_URL), url
        name, _, anchor = url.removeprefix(BASE_URL).partition("#")
        page = RUNBOOKS / name
        assert page.is_file(), f"{rule['alert']}: {page} does not exist"
        assert page.read_text().startswith(f"# {rule['alert']}\n")
        if anchor == "{{ $labels.reason | toLower }}":
            wanted = {r.lower() for r in REASONS_ALERTED}
        elif anchor == "exit-code-{{ $value }}":
            wanted = {f"exit-code-{c}" for c in (126, 127, 139)}
        elif anchor == "{{ $labels.cause }}":
            wanted = {str(c) for c in UndiagnosedCause}
        else:
            assert not anchor, f"{rule['alert']}: unexpected anchor {anchor}"
            continue
        assert wanted <= anchors(page.read_text()), (
            f"{page.name} lacks {wanted - anchors(page.read_text())}"
        )


def test_the_crd_enum_is_the_reason_enum() -> None:
    crd = yaml.safe_load((REPO / "deploy" / "base" / "crd.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["reason"]["enum"] == [str(r) for r in Reason]


def test_every_reason_selector_leaves_out_exactly_the_reasons_not_alerted() -> None:
    """Alerts, the Argo analysis and their tests filter with reason!~"A|B": the same set,
    Reason's NOT_ALERTED, everywhere."""
    files = [RULES, REPO / "deploy" / "argo" / "execwatch-exec-failures.yaml"]
    selectors = {m for f in files for m in re.findall(r'reason!~"([^"]*)"', f.read_text())}
    assert selectors, "no reason selector found"
    for selector in selectors:
        assert set(selector.split("|")) == {str(r) for r in NOT_ALERTED}, selector


def test_a_runtime_giving_up_on_a_file_without_shebang_alerts_and_is_never_platform() -> None:
    """MissingShebang fails on every architecture: alerted, never placement's business; the
    shell's retry of such a file (NoShebang) is neither."""
    assert Reason.MISSING_SHEBANG not in NOT_ALERTED
    assert Reason.MISSING_SHEBANG not in PLATFORM_REASONS
    assert Reason.NO_SHEBANG in NOT_ALERTED
    assert event_reason(Reason.MISSING_SHEBANG) == "MissingShebang"


def test_every_reason_has_its_own_event_reason() -> None:
    names = [event_reason(r) for r in Reason]
    assert len(set(names)) == len(names), names
    assert event_reason(Reason.MISSING_LIBRARY) == "MissingLibrary"


def test_runbooks_link_only_to_files_that_exist() -> None:
    for page in RUNBOOKS.glob("*.md"):
        for target in re.findall(r"\]\(([^)#]+\.md)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target:
                assert (page.parent / target).resolve().is_file(), f"{page.name} -> {target}"


def test_prometheus_rule_in_the_chart_is_the_rules_file() -> None:
    rule = find(render("prometheusRule.enabled=true"), "PrometheusRule")
    assert rule["spec"]["groups"] == plain_groups()


def test_chart_rewrites_runbook_links_and_can_leave_companions_out() -> None:
    rule = find(
        render(
            "prometheusRule.enabled=true",
            "prometheusRule.companions=false",
            "prometheusRule.runbookBaseURL=https://wiki.example/rb/",
        ),
        "PrometheusRule",
    )
    assert [g["name"] for g in rule["spec"]["groups"]] == ["execwatch"]
    urls = [r["annotations"]["runbook_url"] for r in alerts(rule["spec"]["groups"])]
    assert urls and all(u.startswith("https://wiki.example/rb/Execwatch") for u in urls)


def test_the_chart_prometheus_rule_passes_promtool(tmp_path: Path) -> None:
    rule = find(render("prometheusRule.enabled=true"), "PrometheusRule")
    f = tmp_path / "rules.yaml"
    f.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    out = subprocess.run(
        [promtool(), "check", "rules", str(f)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
