"""Prometheus metrics, from a registry numad owns (prometheus-client lives only here).

Edge module. Names follow Prometheus conventions and mirror the kubelet's
where they mean the same (reference/topology-manager.md section 6,
cpu-manager.md section 12), prefixed ``numad_`` instead of ``kubelet_``.
Labels are low-cardinality only: no workload names.
"""

from __future__ import annotations

from collections.abc import Iterable
from threading import Thread
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from numad import __version__

# Sub-millisecond admissions need buckets below 1 ms: 50 us doubling to ~1.6 s.
ADMISSION_BUCKETS = tuple(0.00005 * 2**i for i in range(16))


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.build_info = Gauge("numad_build_info", "numad's version.", ["version"], registry=r)
        self.build_info.labels(__version__).set(1)
        self.admission_requests = Counter(
            "numad_topology_manager_admission_requests", "Admissions handled.", registry=r
        )
        self.admission_errors = Counter(
            "numad_topology_manager_admission_errors",
            "Admissions refused by the merge or failed in an allocation.",
            registry=r,
        )
        self.admission_duration = Histogram(
            "numad_topology_manager_admission_duration_seconds",
            "Time of one admission decision and its allocations.",
            buckets=ADMISSION_BUCKETS,
            registry=r,
        )
        self.aligned = Counter(
            "numad_container_aligned_compute_resources",
            "Containers whose resources were aligned to the boundary.",
            ["scope", "boundary"],
            registry=r,
        )
        self.aligned_failures = Counter(
            "numad_container_aligned_compute_resources_failure",
            "Containers refused because no alignment to the boundary was possible.",
            ["scope", "boundary"],
            registry=r,
        )
        for scope in ("container", "pod"):  # pre-created at 0, as the kubelet does
            self.aligned.labels(scope, "numa_node")
            self.aligned_failures.labels(scope, "numa_node")
        self.rejections = Counter(
            "numad_admission_rejections", "Refused admissions by reason.", ["reason"], registry=r
        )
        self.cpu_pinning_requests = Counter(
            "numad_cpu_manager_pinning_requests",
            "Allocations that needed exclusive CPUs.",
            registry=r,
        )
        self.cpu_pinning_errors = Counter(
            "numad_cpu_manager_pinning_errors", "Failed exclusive CPU allocations.", registry=r
        )
        self.shared_pool = Gauge(
            "numad_cpu_manager_shared_pool_size_millicores",
            "The shared pool minus reserved CPUs, in millicores.",
            registry=r,
        )
        self.exclusive = Gauge(
            "numad_cpu_manager_exclusive_cpu_allocation_count",
            "CPUs exclusively assigned.",
            registry=r,
        )
        self.node_cpus_allocatable = Gauge(
            "numad_node_cpus_allocatable",
            "Allocatable CPUs per NUMA node.",
            ["numa_node"],
            registry=r,
        )
        self.node_cpus_allocated = Gauge(
            "numad_node_cpus_allocated", "Exclusive CPUs per NUMA node.", ["numa_node"], registry=r
        )
        self.node_memory_allocatable = Gauge(
            "numad_node_memory_allocatable_bytes",
            "Allocatable memory per NUMA node and resource.",
            ["numa_node", "resource"],
            registry=r,
        )
        self.node_memory_allocated = Gauge(
            "numad_node_memory_allocated_bytes",
            "Allocated memory per NUMA node and resource.",
            ["numa_node", "resource"],
            registry=r,
        )
        self.cgroup_write_errors = Counter(
            "numad_cgroup_write_errors", "Failed cgroup writes.", registry=r
        )
        self.cgroup_not_effective = Counter(
            "numad_cgroup_not_effective",
            "cpuset writes after which the kernel applied another cpuset than the one"
            " written (e.g. mems without memory, CPUs outside the parent's cpuset).",
            registry=r,
        )
        self.drift_repairs = Counter(
            "numad_drift_repairs",
            "cpusets rewritten after another writer changed them.",
            registry=r,
        )
        self.reconcile_duration = Histogram(
            "numad_reconcile_duration_seconds",
            "Time of one reconcile pass.",
            buckets=ADMISSION_BUCKETS,
            registry=r,
        )

    def serve(self, address: str, port: int) -> tuple[WSGIServer, Thread]:
        """The metrics endpoint on a TCP listener (loopback unless configured otherwise)."""
        return start_http_server(port, addr=address, registry=self.registry)

    def set_nodes(self, cpus: Iterable[tuple[int, int, int]]) -> None:
        """(node, allocatable CPUs, exclusively allocated CPUs) per NUMA node."""
        for node, allocatable, allocated in cpus:
            self.node_cpus_allocatable.labels(str(node)).set(allocatable)
            self.node_cpus_allocated.labels(str(node)).set(allocated)
