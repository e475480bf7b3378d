"""Read-only views of the daemon's state: show, list, explain, the metrics' gauges.

Daemon side, a collaborator of ``numad.daemon.root.Daemon``: reads the shared
``Holdings`` under its lock and changes nothing but Prometheus gauges and counters.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

from numad.cpuset import CPUSet, NodeSet
from numad.daemon.answers import explained_json, groups_json
from numad.daemon.config import Config
from numad.daemon.holdings import Holdings
from numad.daemon.metrics import Metrics
from numad.errors import NumadError, WorkloadError
from numad.host.irqs import IrqAffinity
from numad.host.isolation import Isolation
from numad.host.migration import Migrations
from numad.host.unmovable import unmovable
from numad.placement.admission import Outcome, placements
from numad.placement.nrt import nrt_object
from numad.workload.shape import WorkloadSpec


class Views:
    def __init__(  # noqa: PLR0917 - what the views read
        self,
        held: Holdings,
        config: Config,
        metrics: Metrics,
        isolation: Isolation,
        irqs: IrqAffinity,
        migrations: Migrations,
    ) -> None:
        self.held = held
        self.config = config
        self.metrics = metrics
        self.isolation = isolation
        self.irqs = irqs
        self.migrations = migrations
        self.clock: Callable[[], float] = time.monotonic  # the daemon's, set by it
        # Each exclusive grant's partition ([host] partitions), set by the daemon.
        self.partitions: Callable[[], list[dict[str, str]]] = list
        # How the others are kept off exclusive CPUs: "partitions" or "one by one: why".
        self.isolating: Callable[[], str] = lambda: "one by one"

    def holding(self, name: str) -> Outcome:
        """What an admitted workload holds (and why, where this numad decided it)."""
        held = self.held
        with held.lock:
            before = held.outcomes.get(name)
            return Outcome(
                True,
                () if before is None else before.decisions,
                placements(held.books, name, held.engine.cpu_policy.topo),
                asks=() if before is None else before.asks,
                held=True,
                wiring=() if before is None else before.wiring,
            )

    def list_all(self) -> list[dict[str, Any]]:
        held = self.held
        with held.lock:  # one consistent snapshot of the holdings
            shown = [self._shown(n) for n in sorted(held.specs)]
        return [self._with_memory(*each) for each in shown]  # the memory, after the lock

    def explain(self, name: str) -> dict[str, Any]:
        held = self.held
        with held.lock:
            if name not in held.specs:
                raise WorkloadError(name, "no such workload")
            if name in held.unplaced:
                return {"explanation": f"unplaced: {held.unplaced[name]}", "conflict": []}
            outcome = held.outcomes.get(name)
            if outcome is None or not outcome.decisions:  # nothing decided: no explanation
                return {
                    "explanation": "restored from the checkpoint; placed before this start",
                    "conflict": [],
                    "explained": [],
                }
            return explained_json(outcome)

    def nrt(self) -> dict[str, Any]:
        """This host as a NodeResourceTopology object, with what is held now."""
        held = self.held
        with held.lock:
            return nrt_object(
                socket.gethostname(),
                held.topology,
                held.books,
                self.config.policy,
                self.config.scope,
            )

    def host(self) -> dict[str, Any]:
        """Host isolation as it stands: each isolated cgroup, how numad writes it and
        its CPUs now; what numad cannot move off the exclusive CPUs."""
        held = self.held
        with held.lock:  # the books and names only: each cgroup is read after
            exclusive = CPUSet.from_bits(held.books.cpu.exclusive)
            shared = CPUSet.from_bits(held.books.cpu.shared_pool)
            reserved = CPUSet.from_bits(held.books.cpu.reserved)
            others = sorted(held.others)
        isolated = []
        for path in others:
            try:
                now = str(self.isolation.read(path)[0])
            except NumadError as err:
                now = f"unreadable: {err}"
            isolated.append({"cgroup": path, "via": self.isolation.via(path), "cpus": now})
        return {
            "isolate": self.config.isolate,
            "isolating": self.isolating() if self.config.isolate else "off",
            "exclusive": str(exclusive),
            "shared": str(shared),
            "reserved": str(reserved),
            "isolated": isolated,
            "partitions": self.partitions(),
            "unmovable": unmovable(self.isolation.root, exclusive),
            "irqs": {"enabled": self.config.irq_affinity, **self.irqs.view()},
        }

    def show(self, name: str) -> dict[str, Any]:
        """The workload as numad holds it (read under the daemon's lock), and where its
        memory is (read after it: ``memory.numa_stat`` per cgroup, a read whose time is
        the kernel's; a list beside 10,000 strays held the lock 170 ms in the 6.12 guest
        while it read them under it)."""
        with self.held.lock:
            shown, paths, nodes = self._shown(name)
        return self._with_memory(shown, paths, nodes)

    def _shown(self, name: str) -> tuple[dict[str, Any], list[str], NodeSet]:
        """``show``'s part read from the holdings (the caller holds the lock), with the
        cgroups and nodes whose memory ``_with_memory`` reads."""
        held = self.held
        if name not in held.specs:
            raise WorkloadError(name, "no such workload")
        spec = held.specs[name]
        placed = placements(held.books, name, held.engine.cpu_policy.topo)
        pool = CPUSet.from_bits(held.books.cpu.shared_pool)
        containers = {}
        for c in spec.containers:
            p = placed.get(c.name)
            containers[c.name] = {
                "cgroup": spec.container_cgroup(c),
                "cpus": (p.cpus if p is not None and p.cpus else pool).format_list(),
                "exclusive": bool(p is not None and p.cpus),
                "mems": p.mems.format_list() if p is not None else "",
                "devices": {k: list(v) for k, v in p.devices.items()} if p is not None else {},
                **groups_json(p),
            }
        shown: dict[str, Any] = {
            "name": name,
            "cgroup": spec.cgroup,
            "movable": spec.movable,
            "containers": containers,
        }
        if spec.unit is not None:
            shown["unit"] = spec.unit
            shown["via"] = self.isolation.via(spec.cgroup)
        if name in held.unplaced:
            shown["unplaced"] = held.unplaced[name]
        shown["memory"] = None  # read after the lock (``_with_memory``)
        shown["state"] = self.cgroup_state(name)  # else the memory's, once read
        if name in held.outside:
            shown["state"] = "outside"
            shown["outside"] = (
                "its cgroup is outside [paths] managed-roots: numad keeps its CPUs and"
                f" writes its cgroups no more; release it (numad release {name}) or add"
                " its root back and restart numad"
            )
        return (shown, *self._memory_nodes(name))

    def _with_memory(
        self, shown: dict[str, Any], paths: list[str], nodes: NodeSet
    ) -> dict[str, Any]:
        shown["memory"] = self._memory(paths, nodes)
        shown["state"] = shown["state"] or shown["memory"]["state"]
        return shown

    def cgroup_state(self, name: str) -> str:
        """ "waiting for its cgroup" (never seen yet), "cgroup gone, released in N s"
        (or empty, for a transient one), else "" (a unit's cgroup is systemd's to make)."""
        held = self.held
        spec = held.specs[name]
        if spec.unit is not None or name in held.outside:
            return ""
        since = held.gone_since.get(name)
        if since is not None:
            left = max(0.0, self.config.release_grace_seconds - (self.clock() - since))
            paths = held.cgroups_of(spec)
            how = "empty" if any(map(self.isolation.exists, paths)) else "gone"
            return f"cgroup {how}, released in {left:.0f} s"
        return "" if name in held.seen else "waiting for its cgroup"

    def _memory_nodes(self, name: str) -> tuple[list[str], NodeSet]:
        """The cgroups of the workload's exclusive containers, and its own nodes: their
        mems where numad pins them, else their CPUs' nodes."""
        held = self.held
        spec, placed = held.specs[name], placements(held.books, name)
        paths, nodes = [], NodeSet()
        for c in spec.containers:
            p = placed.get(c.name)
            if p is not None and p.cpus:
                paths.append(spec.container_cgroup(c))
                nodes |= p.mems if p.mems else held.topology.nodes_of_cpus(p.cpus)
        return paths, nodes

    def memory_of(self, name: str) -> dict[str, Any]:
        """Where the workload's memory is: its state (``migrating`` while the mover has
        work for it), its nodes, its locality and the last moves."""
        with self.held.lock:
            paths, nodes = self._memory_nodes(name)
        return self._memory(paths, nodes)  # read after the lock (``show``)

    def _memory(self, paths: list[str], nodes: NodeSet) -> dict[str, Any]:
        share, size = self.migrations.locality(paths, nodes) if paths else (None, 0)
        return {
            "state": self.migrations.status(paths) or ("placed" if paths else "shared"),
            "nodes": str(nodes),
            "locality": None if share is None else round(share, 4),
            "anon_bytes": size,
            "moves": self.migrations.last(paths),
        }

    def check_cgroups_free(self, spec: WorkloadSpec) -> None:
        """Two workloads never write the same cgroup, nor one inside the other's."""
        held = self.held
        mine = {spec.container_cgroup(c) for c in spec.containers} | {spec.cgroup}
        for other in held.specs.values():
            theirs = {other.container_cgroup(c) for c in other.containers} | {other.cgroup}
            for a in mine:
                for b in theirs:
                    if a == b or a.startswith(b + "/") or b.startswith(a + "/"):
                        raise WorkloadError(
                            spec.name,
                            f"cgroup {a} is already admitted: it overlaps {b} of {other.name}",
                            "give each workload its own cgroup",
                        )

    def count(self, spec: WorkloadSpec, outcome: Outcome, seconds: float) -> None:
        held = self.held
        m = self.metrics
        m.admission_requests.inc()
        m.admission_duration.observe(seconds)
        scope = str(held.engine.scope)
        numa_boundary = (spec.policy or held.engine.policy) == "single-numa-node"
        if any(c.exclusive_cpus for c in spec.containers):
            m.cpu_pinning_requests.inc()
        if outcome.admitted:
            if numa_boundary:
                m.aligned.labels(scope, "numa_node").inc(
                    len(spec.containers) if scope == "container" else 1
                )
            return
        m.admission_errors.inc()
        m.rejections.labels(str(outcome.reason)).inc()
        if numa_boundary and outcome.reason is not None and "Topology" in outcome.reason:
            m.aligned_failures.labels(scope, "numa_node").inc()
        if "cpu" in outcome.detail:
            m.cpu_pinning_errors.inc()

    def update_gauges(self) -> None:
        held = self.held
        m, cpu, memory = self.metrics, held.books.cpu, held.books.memory
        m.shared_pool.set(cpu.available.bit_count() * 1000)
        m.exclusive.set(cpu.exclusive.bit_count())
        m.unplaced.set(len(held.unplaced))
        for node in held.topology.nodes:
            mask = node.cpus.bits & cpu.online
            allocatable = (mask & ~cpu.reserved).bit_count()
            m.node_cpus_allocatable.labels(str(node.id)).set(allocatable)
            m.node_cpus_allocated.labels(str(node.id)).set((mask & cpu.exclusive).bit_count())
            for (n, resource), cap in memory.table.capacity.items():
                if n == node.id:
                    m.node_memory_allocatable.labels(str(n), resource).set(cap.allocatable)
                    m.node_memory_allocated.labels(str(n), resource).set(memory.used(n, resource))
