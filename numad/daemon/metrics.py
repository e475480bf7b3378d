"""Prometheus metrics, from a registry numad owns (prometheus-client lives only here).

Edge module. Names follow Prometheus conventions and mirror the kubelet's
where they mean the same (reference/topology-manager.md section 6,
cpu-manager.md section 12), prefixed ``numad_`` instead of ``kubelet_``.
Labels are low-cardinality only: no workload names.
"""

from __future__ import annotations

import socket
import socketserver
import sys
from collections.abc import Callable, Iterable
from threading import Thread
from typing import Any

import structlog
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from numad import __version__
from numad.daemon.listener import BoundedHandler, BoundedServer, Limits

# Sub-millisecond admissions need buckets below 1 ms: 50 us doubling to ~1.6 s.
ADMISSION_BUCKETS = tuple(0.00005 * 2**i for i in range(16))
# A scraper or two: 4 workers, 8 connections queued for them.
METRICS_LIMITS = Limits(workers=4, queue=8)
LOOPS = ("reconcile", "cgroups", "units", "hotplug", "watchdog")

# prometheus-client adds a `_created` gauge (the creation time) to every counter and
# histogram: a quarter of numad's series, each holding about the daemon's start time.
# In the text format Prometheus stores them as plain series nobody queries, and
# rate() and increase() handle a restart's reset without them; the kubelet has none.
disable_created_metrics()  # type: ignore[no-untyped-call]  # unannotated in prometheus-client
# Other pages on the listener: path -> (status, body, content type), or None if unknown.
Page = Callable[[str], tuple[int, bytes, str] | None]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.build_info = Gauge("numad_build_info", "numad's version.", ["version"], registry=r)
        self.build_info.labels(__version__).set(1)
        # What GET /v1/health answers (200 or 503), for alerts: wired to the daemon by
        # numad.daemon.service.build, read at each scrape; 0 where nothing wired it.
        self.ready = Gauge("numad_ready", "1 while numad is ready, else 0.", registry=r)
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
        self.resizes = Counter(
            "numad_resizes", "Resizes in place (PATCH) by outcome.", ["outcome"], registry=r
        )
        for outcome in ("resized", "refused"):  # pre-created at 0
            self.resizes.labels(outcome)
        self.moves = Counter("numad_moves", "Running workloads moved to admit another.", registry=r)
        self.moved_bytes = Counter(
            "numad_moved_bytes",
            "Bytes of memory the moves migrate (resident on the nodes a move leaves).",
            registry=r,
        )
        self.admitted_by_moves = Counter(
            "numad_admissions_by_moves",
            "Admissions made possible by moving running workloads.",
            registry=r,
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
            # The kubelet's cpu_manager_exclusive_cpu_allocation_count: a gauge may not
            # end in _count (promtool check metrics), which names a histogram's series.
            "numad_cpu_manager_exclusive_cpus",
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
        self.cgroup_write_seconds = Histogram(
            "numad_cgroup_write_seconds",
            "How long each cpuset write numad made took, the kernel's part included (kind:"
            " grant, an exclusive set with its partition; shared, any other).",
            ["kind"],
            buckets=ADMISSION_BUCKETS,
            registry=r,
        )
        self.reconcile_duration = Histogram(
            "numad_reconcile_duration_seconds",
            "Time of one reconcile pass.",
            buckets=ADMISSION_BUCKETS,
            registry=r,
        )
        self.lock_held = Histogram(
            "numad_lock_held_seconds",
            "How long the daemon's lock was held, each time it was taken (requests, passes).",
            buckets=ADMISSION_BUCKETS,
            registry=r,
        )
        self.lock_wait = Histogram(
            "numad_lock_wait_seconds",
            "How long each taker of the daemon's lock waited for it, a change's writes included.",
            buckets=ADMISSION_BUCKETS,
            registry=r,
        )
        self.systemd_reply = Histogram(
            "numad_systemd_reply_seconds",
            "How long systemd took to answer each D-Bus call it answered.",
            ["member"],
            buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0),
            registry=r,
        )
        self._add_supervision(r)

    def _add_supervision(self, r: CollectorRegistry) -> None:
        """What the daemon's loops and listeners count about themselves."""
        self.loop_errors = Counter(
            "numad_loop_errors",
            "Exceptions caught in a background loop, which went on.",
            ["loop"],
            registry=r,
        )
        for loop in LOOPS:
            self.loop_errors.labels(loop)
        self.memory_moved = Counter(
            "numad_memory_moved_bytes",
            "Anonymous bytes moved onto workloads' nodes by the background mover.",
            registry=r,
        )
        self.memory_move_seconds = Counter(
            "numad_memory_move_seconds",
            "Time the background mover spent moving workloads' memory.",
            registry=r,
        )
        self.memory_moves = Counter(
            "numad_memory_moves",
            "Memory moves finished, by outcome (moved, nothing, skipped, failed).",
            ["outcome"],
            registry=r,
        )
        self.locality = Gauge(
            "numad_workload_memory_locality_ratio",
            "Share of a workload's anonymous memory on its own NUMA nodes (memory.numa_stat).",
            ["workload"],
            registry=r,
        )
        self.unplaced = Gauge(
            "numad_unplaced_workloads",
            "Workloads admitted but not placed (their cgroups follow the shared pool),"
            " e.g. after a CPU went offline while numad was stopped.",
            registry=r,
        )
        self.connections_refused = Counter(
            "numad_connections_refused",
            "Connections closed at once because every worker was busy and the queue was"
            " full, or because a new connection needed the place of the longest idle one.",
            ["listener"],
            registry=r,
        )
        for listener in ("api", "metrics"):
            self.connections_refused.labels(listener)

    def serve(
        self,
        address: str,
        port: int,
        limits: Limits = METRICS_LIMITS,
        page: Page | None = None,
    ) -> tuple[MetricsServer, Thread]:
        """The metrics endpoint on a TCP listener (loopback unless configured otherwise),
        served by a thread until ``shutdown()``; ``page`` answers the other paths it
        knows (the live page, numad.daemon.livepage)."""
        server = self.listen(address, port, limits, page)
        return server, start_serving(server)

    def listen(
        self,
        address: str,
        port: int,
        limits: Limits = METRICS_LIMITS,
        page: Page | None = None,
    ) -> MetricsServer:
        """The metrics listener, bound but not answering yet (``start_serving``):
        numad binds every listener before it touches the host."""
        return MetricsServer((address, port), self, limits, page)

    def set_nodes(self, cpus: Iterable[tuple[int, int, int]]) -> None:
        """(node, allocatable CPUs, exclusively allocated CPUs) per NUMA node."""
        for node, allocatable, allocated in cpus:
            self.node_cpus_allocatable.labels(str(node)).set(allocatable)
            self.node_cpus_allocated.labels(str(node)).set(allocated)


class _MetricsHandler(BoundedHandler):
    server: MetricsServer

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        if self.headers.get("Content-Length") or self.headers.get("Transfer-Encoding"):
            self.close_connection = True  # a body is not read: it must not pass for a request
        path = self.path.split("?")[0]
        page = self.server.page(path) if self.server.page is not None else None
        if page is not None:
            self._answer(*page)
            return
        if path != "/metrics":
            self._answer(404, b"metrics: no such path; scrape /metrics\n", "text/plain")
            return
        try:
            data = generate_latest(self.server.metrics.registry)
        except Exception as err:  # noqa: BLE001 - one failed scrape is answered, not fatal
            self._answer(500, f"metrics: {type(err).__name__}: {err}\n".encode(), "text/plain")
            return
        self._answer(200, data, CONTENT_TYPE_LATEST)

    do_HEAD = do_GET  # noqa: N815 - the stdlib's name; _answer sends no body for a HEAD

    def _answer(self, status: int, data: bytes, kind: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


class MetricsServer(BoundedServer, socketserver.TCPServer):
    """The metrics listener; ``shutdown()`` stops and closes it."""

    allow_reuse_address = True
    request_queue_size = 128  # the kernel's accept queue: socketserver's 5 makes connects wait

    def __init__(
        self, address: tuple[str, int], metrics: Metrics, limits: Limits, page: Page | None = None
    ) -> None:
        self.metrics = metrics
        self.page = page
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _MetricsHandler)
        self.start_pool(limits, metrics.connections_refused.labels("metrics").inc)

    @property
    def server_port(self) -> int:
        port = self.server_address[1]
        assert isinstance(port, int)
        return port

    def shutdown(self) -> None:
        super().shutdown()
        self.server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A scraper gone mid-answer is nothing; anything else is one event, never a
        traceback on stderr."""
        err = sys.exc_info()[1]
        if not isinstance(err, (ConnectionError, TimeoutError)):
            structlog.get_logger("numad").error("metrics_request_failed", problem=repr(err))


def start_serving(server: MetricsServer) -> Thread:
    """Answer on a bound metrics listener, from a thread, until ``shutdown()``."""
    thread = Thread(target=server.serve_forever, name="MetricsServer-accept", daemon=True)
    thread.start()
    return thread
