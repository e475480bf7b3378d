"""The composition root: builds every part, owns the state, orders the writes.

The only module that calls more than one stage. Every change follows the
same sequence under one lock: decide (pure) -> checkpoint (atomic) ->
cgroups, ordered so that no CPU is ever in two exclusive sets (DESIGN
invariant 4): shared-pool cgroups shrink before exclusive CPUs are granted,
and on release exclusive CPUs are taken back before the pool grows.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from numad import state
from numad.admission import Books, Engine, Outcome, admit, placements, release
from numad.config import Config
from numad.cpuset import CPUSet, NodeSet
from numad.errors import AllocationError, NumadError, WorkloadError
from numad.hostfs import HostFS
from numad.managers.cpu.state import CPUState
from numad.managers.cpu.static import StaticOptions, StaticPolicy
from numad.managers.cpu.topology import CPUTopology
from numad.managers.device import DeviceInventory, DeviceState
from numad.managers.memory import MemoryState, MemoryTable
from numad.metrics import Metrics
from numad.policy import Machine, check_machine, parse_options
from numad.spec import WorkloadSpec, load_spec, parse_spec
from numad.topology.discover import discover
from numad.topology.model import Topology


class Cgroups(Protocol):
    def exists(self, path: str) -> bool: ...
    def ensure(self, path: str) -> None: ...
    def write(self, path: str, cpus: CPUSet | None, mems: NodeSet | None) -> None: ...
    def read(self, path: str) -> tuple[CPUSet, NodeSet]: ...
    def read_effective(self, path: str) -> tuple[CPUSet, NodeSet]: ...
    def restore_cpus(self, cpus: CPUSet) -> None: ...


class Log(Protocol):
    def info(self, event: str, **kw: Any) -> Any: ...
    def warning(self, event: str, **kw: Any) -> Any: ...
    def error(self, event: str, **kw: Any) -> Any: ...


class Daemon:
    def __init__(  # noqa: PLR0917 - the composition root takes every part
        self,
        config: Config,
        fs: HostFS,
        cgroups: Cgroups,
        state_dir: Path,
        log: Log,
        metrics: Metrics | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics or Metrics()
        self.metrics_address = ""  # host:port of the metrics endpoint, once serving
        self.fs = fs
        self.cgroups = cgroups
        self.state_dir = state_dir
        self.log = log
        self.lock = threading.RLock()
        self.ready = False
        self.specs: dict[str, WorkloadSpec] = {}
        self.outcomes: dict[str, Outcome] = {}
        self.problems: list[str] = []
        self.orphans: set[str] = set()
        self.seen: set[str] = set()  # workloads whose cgroup has existed
        self.written: dict[str, tuple[int, NodeSet | None]] = {}  # last value per cgroup
        self.ensured: set[str] = set()  # cgroups whose ancestors have cpuset enabled
        self.drift: dict[str, tuple[int, int]] = {}  # cgroup -> (drifts in a row, next pass)
        self.passes = 0
        self.repairs = 0
        # A failpoint for the crash tests: die at the named step, as SIGKILL would.
        self._crash_at = os.environ.get("NUMAD_TEST_CRASH_AT", "")

    # -- start-up ------------------------------------------------------------------------

    def start(self) -> None:
        self.topology = discover(self.fs)
        view = CPUTopology.from_topology(self.topology)
        options = parse_options(self.config.policy, self.config.topology_options)
        machine = Machine(self.topology.node_ids, self._distances(self.topology))
        check_machine(self.config.policy, options, machine)
        cpu_options = StaticOptions.parse(self.config.cpu_options)
        cpu_options.check(view, str(self.config.policy))
        self.cpu_policy = StaticPolicy(view, cpu_options)
        explicit = self.config.reserved_cpus
        count = len(CPUSet.parse_list(explicit)) if explicit else self.config.reserved_count
        reserved = self.cpu_policy.reserve(
            count, None if explicit is None else CPUSet.parse_list(explicit).bits
        )
        self.engine = Engine(
            machine,
            self.cpu_policy,
            self.config.policy,
            options,
            self.config.scope,
            self.config.memory_static,
        )
        self.empty = Books(
            CPUState(view.all, reserved, cpu_options.strict_reservation),
            MemoryState(MemoryTable.build(self.topology, self.config.memory_reserved)),
            DeviceState(DeviceInventory.build(self.topology, self.config.device_classes)),
        )
        self.books = self._restore()
        self._checkpoint()
        self.reconcile()
        self._declared()
        self.update_gauges()
        self.ready = True
        self.log.info(
            "daemon_started", workloads=len(self.specs), reserved=str(CPUSet.from_bits(reserved))
        )

    @staticmethod
    def _distances(topo: Topology) -> Mapping[int, Mapping[int, int]] | None:
        if any(n.distances is None for n in topo.nodes):
            return None
        return {n.id: dict(n.distances or {}) for n in topo.nodes}

    def rediscover(self) -> list[str]:
        """Read the machine again after hotplug and keep every decision that still
        holds. Documented outcomes: a CPU that went offline under an exclusive
        assignment is replaced by a free CPU of the same NUMA nodes (reassigned),
        or, if none is free, the container keeps the rest and is flagged; CPUs
        and nodes that appear join the shared pool and the merge's nodes; a held
        device that left is dropped from its container and flagged."""
        with self.lock:
            topo = discover(HostFS(self.fs.root))
            view = CPUTopology.from_topology(topo)
            old, changes, old_topology = self.books, [], self.topology
            gone = old.cpu.online & ~view.all
            try:  # v1 took CPUs that went offline out of its cpusets, even if back already
                self.cgroups.restore_cpus(CPUSet.from_bits(view.all))
            except NumadError as err:
                self.log.error("cgroup_restore_failed", problem=str(err))
            self.topology = topo
            self.cpu_policy = StaticPolicy(view, self.cpu_policy.options)
            machine = Machine(topo.node_ids, self._distances(topo))
            self.engine = replace(self.engine, machine=machine, cpu_policy=self.cpu_policy)
            cpu = CPUState(
                view.all,
                old.cpu.reserved & view.all,
                old.cpu.strict,
                {k: v & view.all for k, v in old.cpu.assignments.items()},
            )
            inventory = DeviceInventory.build(topo, self.config.device_classes)
            present = {d.address for devices in inventory.classes.values() for d in devices}
            held = {}
            for key, per_class in old.devices.held.items():
                kept = {
                    c: tuple(a for a in addrs if a in present) for c, addrs in per_class.items()
                }
                for c, addrs in per_class.items():
                    for a in set(addrs) - set(kept[c]):
                        changes.append(f"{key[0]}/{key[1]}: device {a} ({c}) left; flagged")
                held[key] = kept
            table = MemoryTable.build(topo, self.config.memory_reserved)
            books = Books(cpu, replace(old.memory, table=table), DeviceState(inventory, held))
            for key, before in sorted(old.cpu.assignments.items()):
                lost = before & gone
                if lost:
                    nodes = NodeSet(n.id for n in old_topology.nodes if n.cpus.bits & before)
                    books, change = self._reassign(books, key, before, lost, nodes)
                    changes.append(change)
            changes += [f"memory: {c}" for c in books.memory.conflicts()]
            self.books = books
            self._checkpoint()
            self.written.clear()
            self.problems += [c for c in changes if "flagged" in c or c.startswith("memory")]
        self.reconcile()
        self.update_gauges()
        self.log.info("topology_rediscovered", changes=changes, cpus=len(self.topology.online_cpus))
        return changes

    def _reassign(
        self, books: Books, key: tuple[str, str], before: int, lost: int, nodes: NodeSet
    ) -> tuple[Books, str]:
        """Replace the ``lost`` CPUs of an exclusive set by free CPUs of the NUMA nodes
        the set was on, never elsewhere: moving a container off its node silently
        would break its alignment. With none free there, the container is flagged."""
        where = f"{key[0]}/{key[1]}"
        lost_text = CPUSet.from_bits(lost).format_list()
        local = books.cpu.available & self.cpu_policy.topo.numa_mask(nodes)
        try:
            extra = self.cpu_policy.allocate(
                local, lost.bit_count(), nodes, reserved=books.cpu.reserved
            )
        except NumadError:
            return (
                books,
                f"{where}: cpus {lost_text} went offline; none free to replace them; flagged",
            )
        assignments = dict(books.cpu.assignments)
        assignments[key] = (before & ~lost) | extra
        cpu = replace(books.cpu, assignments=assignments)
        replaced = CPUSet.from_bits(extra).format_list()
        return replace(
            books, cpu=cpu
        ), f"{where}: cpus {lost_text} went offline; reassigned {replaced}"

    def reload_workloads(self) -> None:
        """SIGHUP: admit what the workloads directory declares anew."""
        with self.lock:
            self._declared()
            self.update_gauges()
        self.log.info("workloads_reloaded", workloads=len(self.specs))

    def _declared(self) -> None:
        """Admit the specs of the workloads directory that are not admitted yet."""
        directory = Path(self.config.paths.workloads_dir)
        if not directory.is_dir():
            return
        for path in sorted(directory.iterdir()):
            if path.suffix.lower() not in (".toml", ".json", ".yaml", ".yml"):
                continue
            try:
                spec = load_spec(path, **self._spec_args())
                if spec.name in self.specs:
                    continue
                outcome = self.admit(spec)
            except NumadError as err:
                self.problems.append(str(err))
                self.log.error("declared_workload_failed", file=str(path), problem=str(err))
                continue
            if not outcome.admitted:
                why = outcome.explanation
                self.problems.append(
                    f"{path}: not admitted: {why.text() if why else outcome.detail}"
                )

    def _crash_point(self, name: str) -> None:
        if self._crash_at == name:
            os._exit(137)

    def _restore(self) -> Books:
        checkpoint, problem = state.read(self.state_dir)
        if problem:
            self.problems.append(problem)
            self.log.error("checkpoint_unreadable", problem=problem)
        books = self.empty
        if checkpoint is None:
            return books
        self.orphans = set(checkpoint.orphans)
        for name, record in sorted(checkpoint.workloads.items()):
            try:
                spec = parse_spec(json.dumps(record.spec), "json", **self._spec_args())
                books = self._place(books, name, record)
            except NumadError as err:
                self.problems.append(f"{name}: dropped on restart: {err}")
                self.log.error("workload_dropped", workload=name, problem=str(err))
                continue
            self.specs[name] = spec
        return books

    def _place(self, books: Books, name: str, record: state.Record) -> Books:
        """Put a recorded workload back exactly where it was, if that is still valid."""
        cpu = books.cpu
        taken = cpu.exclusive
        assignments = dict(cpu.assignments)
        for container, listed in record.cpus.items():
            cpus = CPUSet.parse_list(listed).bits
            if cpus & ~cpu.online or cpus & cpu.reserved or cpus & taken:
                raise AllocationError(
                    f"{name}/{container}", f"recorded cpus {listed} are no longer free and online"
                )
            assignments[(name, container)] = cpus
        blocks = dict(books.memory.blocks)
        for container, raw in record.memory.items():
            blocks[(name, container)] = state.restore_blocks(raw)
        held = dict(books.devices.held)
        for container, per_class in record.devices.items():
            for cls, addresses in per_class.items():
                known = {d.address for d in books.devices.inventory.classes.get(cls, ())}
                if not set(addresses) <= known - books.devices.in_use(cls):
                    raise AllocationError(
                        f"{name}/{container}", f"recorded {cls} devices are gone or taken"
                    )
            held[(name, container)] = {k: tuple(v) for k, v in per_class.items()}
        restored = Books(
            CPUState(cpu.online, cpu.reserved, cpu.strict, assignments),
            replace(books.memory, blocks=blocks),
            DeviceState(books.devices.inventory, held),
        )
        if restored.memory.conflicts():
            raise AllocationError(name, "; ".join(restored.memory.conflicts()))
        return restored

    def _spec_args(self) -> dict[str, Any]:
        return {
            "managed_roots": self.config.paths.managed_roots,
            "device_classes": [c.name for c in self.config.device_classes],
        }

    def _checkpoint(
        self, books: Books | None = None, specs: Mapping[str, WorkloadSpec] | None = None
    ) -> None:
        books = books or self.books
        specs = self.specs if specs is None else specs
        records = {
            name: state.record_of(books, name, spec.to_dict()) for name, spec in specs.items()
        }
        reserved = CPUSet.from_bits(books.cpu.reserved).format_list()
        orphans = tuple(sorted(self.orphans))
        state.write(self.state_dir, state.Checkpoint(reserved, records, orphans))

    # -- requests ------------------------------------------------------------------------

    def parse(self, text: str, fmt: str) -> WorkloadSpec:
        return parse_spec(text, fmt, **self._spec_args())  # type: ignore[arg-type]

    def plan(self, spec: WorkloadSpec) -> Outcome:
        with self.lock:
            _, outcome = admit(self.engine, self.books, spec.to_request())
            return outcome

    def admit(self, spec: WorkloadSpec) -> Outcome:
        with self.lock:
            if spec.name in self.specs:
                raise WorkloadError(spec.name, "is already admitted", "release it first")
            self._check_cgroups_free(spec)
            started = time.perf_counter()
            books, outcome = admit(self.engine, self.books, spec.to_request())
            self._count(spec, outcome, time.perf_counter() - started)
            if not outcome.admitted:
                self.log.info("admission_rejected", workload=spec.name, reason=str(outcome.reason))
                return outcome
            specs = {**self.specs, spec.name: spec}
            self._checkpoint(books, specs)  # invariant 3: before any cgroup change
            self._crash_point("admit:after-checkpoint")
            old_pool = self.books.cpu.shared_pool
            self.books, self.specs = books, specs
            self.outcomes[spec.name] = outcome
            self._apply_shared(old_pool & books.cpu.shared_pool)  # shrink the pool first
            self._crash_point("admit:after-shared")
            self._apply_workload(spec.name)
            self._crash_point("admit:after-exclusive")
            self.update_gauges()
            self.log.info("admission_accepted", workload=spec.name)
            return outcome

    def release(self, name: str) -> None:
        with self.lock:
            if name not in self.specs:
                raise WorkloadError(name, "no such workload")
            spec = self.specs[name]
            books = release(self.books, name)
            specs = {k: v for k, v in self.specs.items() if k != name}
            released = {spec.container_cgroup(c) for c in spec.containers}
            self.orphans |= released
            self._checkpoint(books, specs)
            self._crash_point("release:after-checkpoint")
            old_pool = self.books.cpu.shared_pool
            self.books, self.specs = books, specs
            self.seen.discard(name)
            # Take the exclusive CPUs back (the released cgroups get the old pool),
            # then grow every shared cgroup to the new pool.
            for path in sorted(released):
                self._write(path, old_pool, None)
            self._crash_point("release:after-exclusive")
            self._apply_shared(books.cpu.shared_pool)
            self._settle_orphans()
            self.update_gauges()
            self.log.info("workload_released", workload=name)

    def _count(self, spec: WorkloadSpec, outcome: Outcome, seconds: float) -> None:
        m = self.metrics
        m.admission_requests.inc()
        m.admission_duration.observe(seconds)
        scope = str(self.engine.scope)
        numa_boundary = (spec.policy or self.engine.policy) == "single-numa-node"
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
        m, cpu = self.metrics, self.books.cpu
        m.shared_pool.set((cpu.available).bit_count() * 1000)
        m.exclusive.set(cpu.exclusive.bit_count())
        for node in self.topology.nodes:
            mask = node.cpus.bits & cpu.online
            allocatable = (mask & ~cpu.reserved).bit_count()
            m.node_cpus_allocatable.labels(str(node.id)).set(allocatable)
            m.node_cpus_allocated.labels(str(node.id)).set((mask & cpu.exclusive).bit_count())
            table = self.books.memory.table
            for (n, resource), cap in table.capacity.items():
                if n == node.id:
                    m.node_memory_allocatable.labels(str(n), resource).set(cap.allocatable)
                    m.node_memory_allocated.labels(str(n), resource).set(
                        self.books.memory.used(n, resource)
                    )

    def _check_cgroups_free(self, spec: WorkloadSpec) -> None:
        """Two workloads never write the same cgroup, nor one inside the other's."""
        mine = {spec.container_cgroup(c) for c in spec.containers} | {spec.cgroup}
        for other in self.specs.values():
            theirs = {other.container_cgroup(c) for c in other.containers} | {other.cgroup}
            for a in mine:
                for b in theirs:
                    if a == b or a.startswith(b + "/") or b.startswith(a + "/"):
                        raise WorkloadError(
                            spec.name,
                            f"cgroup {a} is already admitted: it overlaps {b} of {other.name}",
                            "give each workload its own cgroup",
                        )

    def list_all(self) -> list[dict[str, Any]]:
        with self.lock:  # one consistent snapshot
            return [self.show(n) for n in sorted(self.specs)]

    def explain(self, name: str) -> dict[str, Any]:
        with self.lock:
            if name not in self.specs:
                raise WorkloadError(name, "no such workload")
            outcome = self.outcomes.get(name)
            why = None if outcome is None else outcome.explanation
            if why is None:
                return {
                    "explanation": "restored from the checkpoint; placed before this start",
                    "conflict": [],
                }
            return {"explanation": why.text(), "conflict": list(why.conflict)}

    def show(self, name: str) -> dict[str, Any]:
        with self.lock:
            if name not in self.specs:
                raise WorkloadError(name, "no such workload")
            spec = self.specs[name]
            held = placements(self.books, name)
            return {
                "name": name,
                "cgroup": spec.cgroup,
                "containers": {
                    c.name: {
                        "cgroup": spec.container_cgroup(c),
                        "cpus": (
                            held[c.name].cpus
                            if c.name in held and held[c.name].cpus
                            else CPUSet.from_bits(self.books.cpu.shared_pool)
                        ).format_list(),
                        "exclusive": bool(c.name in held and held[c.name].cpus),
                        "mems": held[c.name].mems.format_list() if c.name in held else "",
                        "devices": {k: list(v) for k, v in held[c.name].devices.items()}
                        if c.name in held
                        else {},
                    }
                    for c in spec.containers
                },
            }

    # -- enforcement ---------------------------------------------------------------------------

    def reconcile(self) -> None:
        """Write every managed cgroup that exists (a new one is applied when it appears);
        release a workload whose cgroups have all gone; settle released cgroups."""
        started = time.perf_counter()
        repairs = self.repairs
        with self.lock, self.metrics.reconcile_duration.time():
            self.passes += 1
            self._find_drift()
            for name, spec in list(self.specs.items()):
                present = [self.cgroups.exists(spec.container_cgroup(c)) for c in spec.containers]
                if any(present):
                    self.seen.add(name)
                elif name in self.seen:
                    self.log.info("workload_cgroup_removed", workload=name)
                    self.release(name)
            self._apply_shared(self.books.cpu.shared_pool)
            for name in self.specs:
                self._apply_workload(name)
            self._settle_orphans()
        self.log.info(  # the one line per reconcile pass
            "reconcile_completed",
            workloads=len(self.specs),
            drift_repaired=self.repairs - repairs,
            duration_ms=round((time.perf_counter() - started) * 1000, 3),
        )

    def _find_drift(self) -> None:
        """Read back every cpuset numad wrote; one another writer changed is written
        again below, and counted. A cgroup that keeps drifting is repaired less and
        less often (up to every 64th pass) instead of fighting the other writer."""
        for path, (cpus, mems) in list(self.written.items()):
            try:
                now_cpus, now_mems = self.cgroups.read(path)
            except NumadError:
                self.written.pop(path, None)  # gone or unreadable: rewrite if it is back
                continue
            if now_cpus.bits == cpus and (mems is None or now_mems == mems):
                self.drift.pop(path, None)
                continue
            count, due = self.drift.get(path, (0, 0))
            if self.passes < due:
                continue  # backing off
            count += 1
            wait = 0 if count < 3 else min(64, 2 ** (count - 2))
            self.drift[path] = (count, self.passes + wait)
            self.written.pop(path)
            self.metrics.drift_repairs.inc()
            self.repairs += 1
            self.log.warning(
                "cpuset_drift_repaired",
                cgroup=path,
                found=now_cpus.format_list(),
                wanted=CPUSet.from_bits(cpus).format_list(),
                in_a_row=count,
                next_repair_in_passes=wait,
            )

    def _settle_orphans(self) -> None:
        """Forget released cgroups that are gone (or belong to a workload again)."""
        owned = {spec.container_cgroup(c) for spec in self.specs.values() for c in spec.containers}
        settled = {p for p in self.orphans if p in owned or not self.cgroups.exists(p)}
        if settled:
            self.orphans -= settled
            self._checkpoint()

    def _apply_workload(self, name: str) -> None:
        spec = self.specs[name]
        held = placements(self.books, name)
        if any(self.cgroups.exists(spec.container_cgroup(c)) for c in spec.containers):
            self.seen.add(name)
        for c in spec.containers:
            placement = held.get(c.name)
            if placement is not None and placement.cpus:
                self._write(spec.container_cgroup(c), placement.cpus.bits, placement.mems or None)
            else:
                mems = placement.mems if placement is not None and placement.mems else None
                self._write(spec.container_cgroup(c), self.books.cpu.shared_pool, mems)

    def _apply_shared(self, pool: int) -> None:
        """The shared pool to every shared container, and to released cgroups that
        still exist (their processes must leave the CPUs numad hands out next)."""
        owned = set()
        for name, spec in self.specs.items():
            held = placements(self.books, name)
            for c in spec.containers:
                owned.add(spec.container_cgroup(c))
                placement = held.get(c.name)
                if placement is None or not placement.cpus:
                    self._write(spec.container_cgroup(c), pool, None)
        for path in sorted(self.orphans - owned):
            self._write(path, pool, None)

    def _write(self, path: str, cpus: int, mems: NodeSet | None) -> None:
        """Write a cgroup's cpuset, unless this pass already wrote that value there
        (the reconcile pass forgets what was written and writes everything). A write
        the kernel does not apply as written is not remembered: the next pass writes
        and checks it again."""
        if self.written.get(path) == (cpus, mems):
            return
        try:
            if not self.cgroups.exists(path):
                self._effective_problem(path, None)  # gone: nothing left to report
                return  # applied when the cgroup appears (next reconcile)
            if path not in self.ensured:  # the ancestors' controllers, once per cgroup
                self.cgroups.ensure(path)
                self.ensured.add(path)
            self.cgroups.write(path, CPUSet.from_bits(cpus), mems)
            if self._effective(path, CPUSet.from_bits(cpus), mems):
                self.written[path] = (cpus, mems)
            else:  # the file holds this write now, not the value remembered before
                self.written.pop(path, None)
        except NumadError as err:
            self.written.pop(path, None)
            self.ensured.discard(path)  # set it up again next time: the tree may have changed
            self.metrics.cgroup_write_errors.inc()
            self.log.error("cgroup_write_failed", cgroup=path, problem=str(err))

    def _effective(self, path: str, cpus: CPUSet, mems: NodeSet | None) -> bool:
        """Whether the kernel applies the cpuset just written, read back from the
        effective files. A write can succeed and the kernel apply another set: mems
        naming a node without memory fall back to the parent's, CPUs outside the
        parent's effective set are masked off, an offline CPU is dropped. Such a
        cgroup is logged, counted and listed in ``problems`` until a write applies."""
        now_cpus, now_mems = self.cgroups.read_effective(path)
        if (not cpus or cpus == now_cpus) and (not mems or mems == now_mems):
            self._effective_problem(path, None)
            return True
        written = [f"cpus {cpus.format_list()}"] if cpus else []
        written += [f"mems {mems.format_list()}"] if mems else []
        applied = f"cpus {now_cpus.format_list()} mems {now_mems.format_list()}"
        self._effective_problem(
            path,
            f"{path}: the kernel applies {applied}, not {' '.join(written)}"
            " (CPUs outside the parent's cpuset, or a node without memory)",
        )
        self.metrics.cgroup_not_effective.inc()
        self.log.error(
            "cpuset_not_effective",
            cgroup=path,
            wanted_cpus=cpus.format_list(),
            effective_cpus=now_cpus.format_list(),
            wanted_mems=mems.format_list() if mems else "",
            effective_mems=now_mems.format_list(),
        )
        return False

    def _effective_problem(self, path: str, problem: str | None) -> None:
        """Keep at most one line in ``problems`` about ``path``'s effective cpuset."""
        prefix = f"{path}: the kernel applies "
        kept = [p for p in self.problems if not p.startswith(prefix) or p == problem]
        if problem is not None and problem not in kept:
            kept.append(problem)
        self.problems = kept  # a new list: the health endpoint reads it without the lock
