"""The operations kit's files are valid: promtool checks the alert rules, runs their
unit tests (configs/prometheus/alerts_test.yml) and parses every dashboard query;
every rule's runbook is a section of docs/operations.md; the dashboard is a Grafana
model with a Prometheus datasource variable."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.promql import ALERTS, ALERTS_TEST, alert_rules, dashboard, dashboard_panels

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is missing (`make test` installs the prometheus package)")
# Grafana's interval variables, replaced by a fixed range for promtool.
GRAFANA_RANGES = ("$__rate_interval", "$__interval", "$__range")
OPERATIONS = ALERTS.parents[2] / "docs" / "operations.md"


def promtool(*args: str | Path) -> str:
    """Run promtool; fail with its output unless it exits 0."""
    assert PROMTOOL is not None
    done = subprocess.run([PROMTOOL, *map(str, args)], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, f"promtool {' '.join(map(str, args))}:\n{done.stdout}{done.stderr}"
    return done.stdout


@pytest.mark.slow
@needs_promtool
def test_promtool_checks_the_alert_rules() -> None:
    assert f"SUCCESS: {len(alert_rules())} rules found" in promtool("check", "rules", ALERTS)


@pytest.mark.slow
@needs_promtool
def test_promtool_unit_tests_fire_every_alert() -> None:
    tested = {case["alertname"] for test in yaml.safe_load(ALERTS_TEST.read_text())["tests"]
              for case in test["alert_rule_test"] if case.get("exp_alerts")}
    assert tested == {rule["alert"] for rule in alert_rules()}
    promtool("test", "rules", ALERTS_TEST)


@pytest.mark.slow
@needs_promtool
def test_promtool_parses_every_dashboard_query(tmp_path: Path) -> None:
    rules = []
    for i, panel in enumerate(dashboard_panels()):
        for target in panel["targets"]:
            expr = target["expr"]
            for variable in GRAFANA_RANGES:
                expr = expr.replace(variable, "5m")
            rules.append({"record": f"dashboard:panel{i}:{target['refId']}", "expr": expr})
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    promtool("check", "rules", path)


def test_every_runbook_is_a_section_of_the_operations_guide() -> None:
    runbooks = {rule["alert"]: rule["annotations"]["runbook_url"] for rule in alert_rules()
                if "runbook_url" in rule["annotations"]}
    assert runbooks, "no rule names a runbook"
    text = re.sub(r"^```.*?^```", "", OPERATIONS.read_text(encoding="utf-8"),
                  flags=re.MULTILINE | re.DOTALL)  # a code block's comments are no headings
    headings = re.findall(r"^#+ (.+)$", text, re.MULTILINE)
    anchors = {f"docs/operations.md#{github_anchor(heading)}" for heading in headings}
    missing = {alert: url for alert, url in runbooks.items() if url not in anchors}
    assert not missing, f"runbook_url names no heading of docs/operations.md: {missing}"


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation dropped,
    spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_dashboard_is_a_grafana_model_on_a_datasource_variable() -> None:
    model = dashboard()
    assert model["uid"] and model["title"] and model["schemaVersion"] >= 36
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = dashboard_panels()
    assert len({p["id"] for p in model["panels"]}) == len(model["panels"])
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys()
