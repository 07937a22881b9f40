"""The PromQL expressions of our alert rules and Grafana dashboard, and the metric
names they use (a small regex-based extractor, enough for the expressions we write).
Plain module, no pytest."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
ALERTS = CONFIGS / "prometheus" / "alerts.yml"
ALERTS_TEST = CONFIGS / "prometheus" / "alerts_test.yml"
DASHBOARD = CONFIGS / "grafana" / "radix-router.json"

# Identifiers that are PromQL operators or literals, not metric names.
_KEYWORDS = frozenset({
    "and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
    "group_left", "group_right", "inf", "nan",
})
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_LABEL_LISTS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_IDENTIFIER = re.compile(r"(?<![\w.:$])([A-Za-z_:][\w:]*)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """Metric names in ``expr``: identifiers outside strings, label matchers,
    ranges, grouping label lists and Grafana variables that are not called (functions,
    aggregations) and are not operators or literals."""
    expr = _STRING.sub('""', expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = _LABEL_LISTS.sub(" ", expr)
    expr = re.sub(r"\$\{?\w+\}?", " ", expr)
    return {m[1] for m in _IDENTIFIER.finditer(expr)
            if m[2] is None and m[1].lower() not in _KEYWORDS}


def alert_rules() -> list[dict]:
    """Every rule of alerts.yml (``alert``, ``expr``, ...)."""
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def dashboard() -> dict:
    """The Grafana dashboard's JSON model."""
    return json.loads(DASHBOARD.read_text())


def dashboard_panels() -> list[dict]:
    """Every panel, those inside collapsed rows too (rows themselves excluded)."""
    panels = []
    for panel in dashboard()["panels"]:
        panels.extend(panel.get("panels", []))
        if panel["type"] != "row":
            panels.append(panel)
    return panels


def dashboard_exprs() -> list[str]:
    """The PromQL of every panel target."""
    return [target["expr"] for panel in dashboard_panels() for target in panel["targets"]]


def used_metric_names() -> set[str]:
    """Every metric name the alert rules and the dashboard use."""
    exprs = [rule["expr"] for rule in alert_rules()] + dashboard_exprs()
    return set().union(*(metric_names(expr) for expr in exprs))
