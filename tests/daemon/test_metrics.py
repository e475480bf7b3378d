"""Metrics after real admissions and rejections: from the registry and from the live endpoint."""

from __future__ import annotations

import urllib.error
import urllib.request

import pytest
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from numad.cli.client import APIError
from numad.daemon.metrics import Metrics
from tests.daemon.test_daemon_e2e import Numad, _spec, numad

__all__ = ["numad"]


def _scrape(d: Numad) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    address = d.call("GET", "/v1/health")["metrics"]
    host, _port = address.rsplit(":", 1)
    assert host == "127.0.0.1"  # loopback by default
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_live_endpoint_after_admissions_and_a_rejection(numad: Numad) -> None:
    numad.call("POST", "/v1/workloads", _spec("db", 4))
    numad.call("POST", "/v1/workloads", _spec("web", "500m"))
    with pytest.raises(APIError):  # refused: more CPUs than one node holds
        numad.call("POST", "/v1/workloads", _spec("big", 20))
    got = _scrape(numad)
    assert got[("numad_topology_manager_admission_requests_total", ())] == 3
    assert got[("numad_topology_manager_admission_errors_total", ())] == 1
    assert got[("numad_admission_rejections_total", (("reason", "TopologyAffinityError"),))] == 1
    numa = (("boundary", "numa_node"), ("scope", "container"))
    assert got[("numad_container_aligned_compute_resources_total", numa)] == 2
    assert got[("numad_container_aligned_compute_resources_failure_total", numa)] == 1
    pod = (("boundary", "numa_node"), ("scope", "pod"))
    assert got[("numad_container_aligned_compute_resources_total", pod)] == 0  # pre-created
    assert got[("numad_cpu_manager_pinning_requests_total", ())] == 2
    assert got[("numad_cpu_manager_exclusive_cpus", ())] == 4
    assert got[("numad_cpu_manager_shared_pool_size_millicores", ())] == (32 - 2 - 4) * 1000
    allocated = {
        dict(labels)["numa_node"]: v
        for (name, labels), v in got.items()
        if name == "numad_node_cpus_allocated"
    }
    assert sum(allocated.values()) == 4
    assert got[("numad_topology_manager_admission_duration_seconds_count", ())] == 3
    assert got[("numad_build_info", (("version", "0.1.0"),))] == 1
    numad.call("DELETE", "/v1/workloads/db")
    assert _scrape(numad)[("numad_cpu_manager_exclusive_cpus", ())] == 0


def test_buckets_resolve_sub_millisecond_admissions() -> None:
    m = Metrics()
    m.admission_duration.observe(0.0003)
    assert (
        m.registry.get_sample_value(
            "numad_topology_manager_admission_duration_seconds_bucket", {"le": "0.0004"}
        )
        == 1
    )
    assert (
        m.registry.get_sample_value(
            "numad_topology_manager_admission_duration_seconds_bucket", {"le": "0.0002"}
        )
        == 0
    )


def test_supervision_and_listener_counters_start_at_zero() -> None:
    """Pre-created, so that a rate() over them is 0 rather than no data."""
    m = Metrics()
    for loop in ("reconcile", "hotplug", "watchdog"):
        assert m.registry.get_sample_value("numad_loop_errors_total", {"loop": loop}) == 0
    for listener in ("api", "metrics"):
        assert (
            m.registry.get_sample_value("numad_connections_refused_total", {"listener": listener})
            == 0
        )
    assert m.registry.get_sample_value("numad_unplaced_workloads") == 0


def test_the_endpoint_answers_in_the_exposition_format() -> None:
    m = Metrics()
    server, accept = m.serve("127.0.0.1", 0)
    try:
        port = server.server_port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            assert answer.headers["Content-Type"] == CONTENT_TYPE_LATEST
            assert answer.read() == generate_latest(m.registry)
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/nosuch", timeout=10)
        assert caught.value.code == 404
    finally:
        server.shutdown()
        accept.join(5)
    assert not accept.is_alive()
