"""The alerting rules beside the dashboard (dashboards/numad-alerts.yml): Prometheus' own
``promtool check rules`` accepts them and ``promtool test rules`` runs their unit tests
(dashboards/numad-alerts.test.yml: each alert fires on a lasting fault and not on a
blip). Each rule says how grave it is and what to do, and queries only what numad
exports. Without promtool the tests skip, except in CI (see tests/daemon/test_promtool.py).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import Machines, recorded_daemon
from tests.daemon.test_dashboard import METRIC_NAME, exported
from tests.daemon.test_promtool import checker

__all__ = ["checker", "exported"]

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
RULES = DASHBOARDS / "numad-alerts.yml"
RULE_TESTS = DASHBOARDS / "numad-alerts.test.yml"
SEVERITIES = {"critical", "warning", "info"}


def alert_rules() -> list[dict[str, Any]]:
    """Every rule of the alerts file, as written."""
    loaded = yaml.safe_load(RULES.read_text())
    return [rule for group in loaded["groups"] for rule in group["rules"]]


def _promtool(binary: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=DASHBOARDS,
    )


def test_promtool_checks_the_rules(checker: str) -> None:
    checked = _promtool(checker, "check", "rules", RULES.name)
    output = checked.stdout + checked.stderr
    assert checked.returncode == 0, output
    assert f"SUCCESS: {len(alert_rules())} rules found" in output


def test_promtool_runs_the_rules_unit_tests(checker: str) -> None:
    tested = _promtool(checker, "test", "rules", RULE_TESTS.name)
    output = tested.stdout + tested.stderr
    print(output)  # the report quotes it
    assert tested.returncode == 0, output
    assert "SUCCESS" in output


def test_promtool_test_rules_fails_on_a_wrong_expectation(checker: str, tmp_path: Path) -> None:
    """The unit tests are really consulted: a blip expected to fire fails them."""
    wrong = yaml.safe_load(RULE_TESTS.read_text())
    wrong["rule_files"] = [str(RULES)]
    first = wrong["tests"][0]["alert_rule_test"][0]  # NumadDown at 3 m: nothing fires yet
    first["exp_alerts"] = [{"exp_labels": {"severity": "critical", "instance": "b:9477"}}]
    path = tmp_path / "wrong.test.yml"
    path.write_text(yaml.safe_dump(wrong))
    tested = _promtool(checker, "test", "rules", str(path))
    assert tested.returncode != 0
    assert "FAILED" in tested.stdout + tested.stderr


def test_every_alert_says_how_grave_and_what_to_do() -> None:
    for rule in alert_rules():
        name = rule["alert"]
        assert re.fullmatch(r"Numad[A-Za-z]+", name), name
        assert re.fullmatch(r"\d+m", rule["for"]), f"{name}: a `for:` in minutes, not to flap"
        assert rule["labels"]["severity"] in SEVERITIES, name
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description"}, name
        assert "{{ $labels.instance }}" in annotations["summary"], name
        assert "`" in annotations["description"], f"{name}: names a command to run"


def test_every_alert_is_unit_tested() -> None:
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    assert tested == {rule["alert"] for rule in alert_rules()}


def test_rules_query_only_exported_metrics(exported: dict[str, str]) -> None:
    for rule in alert_rules():
        names = METRIC_NAME.findall(rule["expr"])
        unknown = [name for name in names if name not in exported]
        assert not unknown, f"{rule['alert']}: {rule['expr']} queries {unknown}"
        assert names or rule["expr"].startswith("up{"), rule["alert"]


@pytest.mark.parametrize("alert", [rule["alert"] for rule in alert_rules()])
def test_every_alert_keeps_job_and_instance(alert: str) -> None:
    """An aggregation that dropped ``instance`` would page without naming the host."""
    (rule,) = [r for r in alert_rules() if r["alert"] == alert]
    for by in re.findall(r"\bby \(([^)]*)\)", rule["expr"]):
        assert {"job", "instance"} <= {label.strip() for label in by.split(",")}, rule["expr"]


def test_numad_ready_is_what_health_answers(machines: Machines, tmp_path: Path) -> None:
    """NumadNotReady's metric: 1 while GET /v1/health would answer 200, 0 for 503."""
    daemon = recorded_daemon(machines, tmp_path)
    try:
        ready = daemon.metrics.registry.get_sample_value
        assert daemon.ready
        assert ready("numad_ready") == 1
        daemon.health.set("checkpoint", "checkpoint: No space left on device")
        assert not daemon.ready
        assert ready("numad_ready") == 0
        daemon.health.clear("checkpoint")
        assert ready("numad_ready") == 1
    finally:
        daemon.stop()
