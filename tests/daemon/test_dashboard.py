"""The Grafana dashboard queries only metrics numad exports, and shows every one of them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from numad.daemon.metrics import Metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "numad.json"
METRIC_NAME = re.compile(r"\bnumad_[a-z0-9_]+")

# Sample suffixes a family of each type exposes, for families that have no sample yet
# (a labelled metric has no child until first observed, e.g. rejections by reason).
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded = json.loads(DASHBOARD.read_text())
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def exported() -> dict[str, str]:
    """Every exposed sample name, mapped to the name of its metric family."""
    names: dict[str, str] = {}
    for family in Metrics().registry.collect():
        for sample in family.samples:
            names[sample.name] = family.name
        for suffix in SUFFIXES.get(family.type, ()):
            names[family.name + suffix] = family.name
    return names


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))  # collapsed rows nest their panels
    return found


def expressions(dashboard: dict[str, Any]) -> list[str]:
    return [target["expr"] for panel in panels(dashboard) for target in panel.get("targets", [])]


def test_dashboard_parses(dashboard: dict[str, Any]) -> None:
    assert dashboard["schemaVersion"] == 39
    assert panels(dashboard)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert variables["instance"]["definition"] == "label_values(numad_build_info, instance)"


def test_every_panel_has_queries(dashboard: dict[str, Any]) -> None:
    for panel in panels(dashboard):
        if panel["type"] != "row":
            assert panel.get("targets"), panel["title"]


def test_every_query_filters_by_instance(dashboard: dict[str, Any]) -> None:
    for expr in expressions(dashboard):
        assert 'instance=~"$instance"' in expr, expr


def test_queries_reference_only_exported_metrics(
    dashboard: dict[str, Any], exported: dict[str, str]
) -> None:
    for expr in expressions(dashboard):
        names = METRIC_NAME.findall(expr)
        assert names, expr
        unknown = [name for name in names if name not in exported]
        assert not unknown, f"{expr} references {unknown}"


def test_every_exported_family_is_shown(
    dashboard: dict[str, Any], exported: dict[str, str]
) -> None:
    shown = {
        exported[name]
        for expr in expressions(dashboard)
        for name in METRIC_NAME.findall(expr)
        if name in exported
    }
    assert shown == set(exported.values())
