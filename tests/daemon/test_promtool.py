"""Prometheus' own linter on a live daemon's /metrics: ``promtool check metrics`` (Debian's
``prometheus`` package, installed by ``python -m tests.promtool --prepare`` from
scripts/check) reports no problem after admissions and a rejection. Without promtool the
test skips, except in CI (``CI`` set), where a skip would hide a gap."""

from __future__ import annotations

import subprocess
import urllib.request

import pytest

from numad.cli.client import APIError
from tests import debian, promtool
from tests.daemon.test_daemon_e2e import Numad, _spec, numad

__all__ = ["numad"]


@pytest.fixture
def checker() -> str:
    found = promtool.promtool()
    if found is None:
        debian.missing(
            "promtool is missing (Debian's prometheus; scripts/check installs it as root)",
            "the promtool test",
        )
    return found


def _scrape(d: Numad) -> str:
    address = d.call("GET", "/v1/health")["metrics"]
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
        return str(answer.read().decode())


def lint(checker: str, exposition: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [checker, "check", "metrics"],
        input=exposition,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_live_scrape_passes_promtool(checker: str, numad: Numad) -> None:
    numad.call("POST", "/v1/workloads", _spec("db", 4))
    numad.call("POST", "/v1/workloads", _spec("web", "500m"))
    with pytest.raises(APIError):  # more CPUs than one node holds: a rejection counted
        numad.call("POST", "/v1/workloads", _spec("big", 20))
    text = _scrape(numad)
    assert "numad_cpu_manager_exclusive_cpus 4.0" in text
    assert 'numad_admission_rejections_total{reason="TopologyAffinityError"} 1.0' in text
    assert "_created" not in text  # disabled in numad.daemon.metrics: see the reason there
    checked = lint(checker, text)
    assert (checked.returncode, checked.stdout + checked.stderr) == (0, "")


def test_promtool_catches_what_it_should(checker: str) -> None:
    """The linter is really consulted: the old name, a gauge ending in _count, fails."""
    old = (
        "# HELP numad_cpu_manager_exclusive_cpu_allocation_count CPUs exclusively assigned.\n"
        "# TYPE numad_cpu_manager_exclusive_cpu_allocation_count gauge\n"
        "numad_cpu_manager_exclusive_cpu_allocation_count 4.0\n"
    )
    checked = lint(checker, old)
    assert checked.returncode != 0
    assert "_count" in checked.stdout + checked.stderr
