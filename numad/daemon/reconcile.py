"""The daemon over time: rediscovery after hotplug and the reconcile pass.

Daemon side, mixed into ``numad.daemon.root.Daemon``: each method takes the
daemon's lock and commits like a request does (checkpoint first, then
cgroups through ``numad.host.enforce``). The reconcile pass retries what failed
(checkpoint, rediscovery, unplaced workloads), releases a workload whose
cgroups have been gone for the grace period, writes every managed cgroup and
settles released ones; the supervised loop in ``numad.daemon.loops`` runs it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from numad.cpuset import CPUSet
from numad.daemon.config import Config
from numad.daemon.metrics import Metrics
from numad.daemon.restore import rediscovered
from numad.errors import CheckpointError, NumadError
from numad.host.enforce import Cgroups, Enforcer, Log
from numad.host.irqs import IrqAffinity
from numad.host.isolation import Isolation
from numad.host.migration import Migrations
from numad.hostfs import HostFS
from numad.observe import Problems
from numad.placement.admission import Books, Engine, Outcome, admit
from numad.placement.managers.cpu.static import StaticPolicy
from numad.topology.model import Topology
from numad.workload.spec import WorkloadSpec


class Reconciler:
    lock: threading.RLock
    config: Config
    fs: HostFS
    cgroups: Cgroups
    log: Log
    metrics: Metrics
    clock: Callable[[], float]
    health: Problems
    enforcer: Enforcer
    isolation: Isolation
    irqs: IrqAffinity
    migrations: Migrations
    topology: Topology
    cpu_policy: StaticPolicy
    engine: Engine
    books: Books
    reserved: int
    specs: dict[str, WorkloadSpec]
    outcomes: dict[str, Outcome]
    unplaced: dict[str, str]
    orphans: set[str]
    others: set[str]
    seen: set[str]
    gone_since: dict[str, float]
    rediscover_pending: bool
    stopped: bool
    passes: int
    repairs: int
    memory_of: Callable[[str], dict[str, Any]]

    def _commit(self, books: Books, specs: Mapping[str, WorkloadSpec]) -> None: ...
    def _enforce(self, step: Callable[[str], None] | None = None) -> None: ...
    def _after_commit(self, step: Callable[[], None]) -> None: ...
    def _unplace(self, name: str, why: str) -> None: ...
    def release(self, name: str) -> None: ...
    def update_gauges(self) -> None: ...

    def rediscover(self) -> list[str]:
        """Read the machine again after hotplug and keep every decision that still
        holds (``numad.daemon.restore.rediscovered`` says how). Commits or changes nothing;
        a rediscovery that failed is tried again by the next reconcile pass."""
        with self.lock:
            self.rediscover_pending = True
            new = rediscovered(
                self.fs,
                self.config,
                self.engine,
                self.books,
                old=self.topology,
                reserved=self.reserved,
            )
            try:  # v1 took CPUs that went offline out of its cpusets, even if back already
                self.cgroups.restore_cpus(CPUSet.from_bits(new.books.cpu.online))
            except NumadError as err:
                self.log.error("cgroup_restore_failed", problem=str(err))
            self._commit(new.books, self.specs)
            self.topology, self.cpu_policy, self.engine = new.topology, new.policy, new.engine
            self.books = new.books
            self.rediscover_pending = False
            self.enforcer.written.clear()
            for change in new.flagged:
                self.health.set(f"hotplug:{change.split(':')[0]}", change)
            self._after_commit(self._enforce)
        self.update_gauges()
        self.log.info(
            "topology_rediscovered", changes=list(new.changes), cpus=len(new.topology.online_cpus)
        )
        return list(new.changes)

    def reconcile(self) -> None:
        """One pass: retry what failed (checkpoint, rediscovery, unplaced workloads),
        release a workload whose cgroups have been gone for the grace period, write
        every managed cgroup (a new one is applied when it appears), settle released
        cgroups."""
        started = time.perf_counter()
        with self.lock, self.metrics.reconcile_duration.time():
            if self.stopped:  # a pass that waited for the lock while numad stopped
                return
            self.passes += 1
            self._check_root()
            if self.health.has("checkpoint"):
                self._commit(self.books, self.specs)
            if self.rediscover_pending:
                self.rediscover()
            repairs = self.enforcer.find_drift(self.passes)
            self.repairs += repairs
            self._releases()
            self._readmit()
            self._enforce()  # raises to the supervisor: counted, shown, retried
            self.health.clear("enforce")
            self._settle_orphans()
            self._measure_memory()
        self.log.info(  # the one line per reconcile pass
            "reconcile_completed",
            workloads=len(self.specs),
            unplaced=len(self.unplaced),
            drift_repaired=repairs,
            duration_ms=round((time.perf_counter() - started) * 1000, 3),
        )

    def _find_others(self) -> None:
        """The cgroups that are no workload's, isolated as they appear: the other
        top-level cgroups and the unmanaged ones inside the managed roots. With
        isolation turned off, the ones isolated before get their own cpusets back."""
        self.isolation.online = self.topology.online_cpus
        if not self.config.isolate:
            if self.isolation.originals:
                self._end_isolation()
            return
        roots = self.config.paths.managed_roots
        owned = {s.container_cgroup(c) for s in self.specs.values() for c in s.containers}
        inside = self.enforcer.unmanaged(roots, self.specs.values()) - self.orphans
        try:
            tops = self.isolation.top_level(roots)
            self.health.clear("isolation-list")
        except NumadError as err:
            self.health.set("isolation-list", f"{err}; the top-level cgroups stay as they were")
            tops = {p for p in self.others if p.split("/", maxsplit=1)[0] in self.isolation.tops}
        self.others = (inside | tops) - owned
        for path in self.isolation.mark(self.others, owned):
            self.enforcer.forget(path)  # numad writes it no more (or as a workload's)

    def _place_irqs(self) -> None:
        """Interrupts off the exclusive CPUs ([host] irq-affinity); turned off, every
        one numad moved gets its own affinity back."""
        if self.config.irq_affinity:
            cpu = self.books.cpu
            exclusive, pool = CPUSet.from_bits(cpu.exclusive), CPUSet.from_bits(cpu.shared_pool)
            problems = self.irqs.apply(exclusive, pool)
            if problems:
                self.health.set("irqs", "; ".join(problems))
            else:
                self.health.clear("irqs")
        else:
            self._end_irqs()

    def _end_irqs(self) -> None:
        """Every interrupt numad moved gets its own affinity back."""
        for problem in self.irqs.restore() if self.irqs.originals else []:
            self.log.error("irq_reset_failed", problem=problem)

    def _end_isolation(self) -> None:
        """Every isolated cgroup gets its own cpuset back (its parent's, or systemd's)."""
        for problem in self.isolation.restore():
            self.log.error("cgroup_reset_failed", problem=problem)
        for path in sorted(self.others):
            self.enforcer.forget(path)
        self.others = set()

    def _measure_memory(self) -> None:
        """Each placed workload's locality: exported, and listed in health while it
        stays below the threshold (not while its memory is being moved)."""
        for name in sorted(self.specs):
            memory = self.memory_of(name)
            if memory["state"] == "shared":
                continue
            share = memory["locality"]
            if share is not None:
                self.metrics.locality.labels(name).set(share)
            moving = memory["state"] == "migrating"
            self.migrations.check(name, share, self.config.locality_threshold, moving)

    def _check_root(self) -> None:
        root = getattr(self.cgroups, "root", None)
        if root is not None and not Path(root).is_dir():
            self.health.set("cgroup-root", f"{root}: the cgroup hierarchy is gone")
        else:
            self.health.clear("cgroup-root")

    def _releases(self) -> None:
        """Release a workload whose cgroups existed and have all been gone for
        ``release-grace-seconds``: a unit restart (rmdir, then mkdir) keeps it."""
        now = self.clock()
        for name, spec in list(self.specs.items()):
            if spec.unit is not None:  # stopped or started, the unit is still the workload
                continue
            present = [self.enforcer.exists(spec.container_cgroup(c)) for c in spec.containers]
            if any(p is True for p in present):
                self.seen.add(name)
                self.gone_since.pop(name, None)
            elif name in self.seen and all(p is False for p in present):
                since = self.gone_since.setdefault(name, now)
                if now - since >= self.config.release_grace_seconds:
                    self.log.info("workload_cgroup_removed", workload=name)
                    self.release(name)

    def _readmit(self) -> None:
        """Place each unplaced workload that fits again, as a new admission would."""
        for name in sorted(self.unplaced):
            try:
                books, outcome = admit(self.engine, self.books, self.specs[name].to_request())
            except NumadError as err:  # e.g. its device class left the config
                self._unplace(name, str(err))
                continue
            if not outcome.admitted:
                continue
            why = self.unplaced.pop(name)
            try:
                self._commit(books, self.specs)
            except CheckpointError:
                self.unplaced[name] = why
                return
            self.books = books
            self.outcomes[name] = outcome
            self.health.clear(f"workload:{name}")
            self.log.info("workload_placed_again", workload=name, was=why)

    def _settle_orphans(self) -> None:
        """Forget released cgroups that are gone (or belong to a workload again)."""
        owned = {spec.container_cgroup(c) for spec in self.specs.values() for c in spec.containers}
        settled = {p for p in self.orphans if p in owned or self.enforcer.exists(p) is False}
        if settled:
            was = set(self.orphans)
            self.orphans -= settled
            try:
                self._commit(self.books, self.specs)
            except CheckpointError:
                self.orphans = was
                return
            for path in settled - owned:
                self.enforcer.forget(path)

    def stop(self) -> None:
        """numad stops: the cgroups it isolated get every CPU back (their parent's)."""
        with self.lock:
            self.stopped = True
            self._end_isolation()
            self._end_irqs()
        self.migrations.stop()  # outside the lock: the mover's report takes it
