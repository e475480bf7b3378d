"""The daemon over time: rediscovery after hotplug and the reconcile pass.

Daemon side, a collaborator of ``numad.daemon.root.Daemon`` on the shared
``Holdings``: each method takes its lock and commits like a request does
(``numad.daemon.commits``: checkpoint first, then cgroups). The reconcile pass
retries what failed (checkpoint, rediscovery, unplaced workloads), releases a
workload whose cgroups have been gone for the grace period, writes every managed
cgroup and settles released ones; the supervised loop in ``numad.daemon.loops`` runs it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from numad.cpuset import CPUSet
from numad.daemon.commits import Commits
from numad.daemon.config import Config
from numad.daemon.holdings import Holdings
from numad.daemon.metrics import Metrics
from numad.daemon.restore import rediscovered
from numad.errors import CheckpointError, NumadError
from numad.host.migration import Migrations
from numad.host.targets import Cgroups, Log, Scan
from numad.hostfs import HostFS
from numad.observe import Problems
from numad.placement.admission import admit
from numad.workload.shape import WorkloadSpec

# How long in all a pass's walk waits for changes that run meanwhile (``_giving_way``),
# as a share of the reconcile period: the pass still ends before the next is due.
GIVE_WAY_SHARE = 0.5


class Reconciler:
    def __init__(  # noqa: PLR0917 - the parts a pass touches
        self,
        held: Holdings,
        commits: Commits,
        config: Config,
        fs: HostFS,
        cgroups: Cgroups,
        log: Log,
        metrics: Metrics,
        health: Problems,
        migrations: Migrations,
        *,
        release: Callable[[str], None],
        update_gauges: Callable[[], None],
        memory_of: Callable[[str], dict[str, Any]],
        clock: Callable[[], float],
    ) -> None:
        self.held = held
        self.commits = commits
        self.config = config
        self.fs = fs
        self.cgroups = cgroups
        self.log = log
        self.metrics = metrics
        self.health = health
        self.enforcer = commits.enforcer
        self.migrations = migrations
        self.release = release
        self.update_gauges = update_gauges
        self.memory_of = memory_of
        self.clock = clock

    def rediscover(self) -> list[str]:
        """Read the machine again after hotplug and keep every decision that still
        holds (``numad.daemon.restore.rediscovered`` says how). Commits or changes nothing;
        a rediscovery that failed is tried again by the next reconcile pass."""
        held = self.held
        with held.changing:
            held.rediscover_pending = True
            new = rediscovered(
                self.fs,
                self.config,
                held.engine,
                held.books,
                old=held.topology,
                reserved=held.reserved,
                wanted={
                    (s.name, c.name): c.exclusive_cpus
                    for s in held.specs.values()
                    for c in s.containers
                },
            )
            try:  # v1 took CPUs that went offline out of its cpusets, even if back already
                self.cgroups.restore_cpus(CPUSet.from_bits(new.books.cpu.online))
            except NumadError as err:
                self.log.error("cgroup_restore_failed", problem=str(err))
            self.commits.commit(new.books, held.specs)
            held.topology, held.cpu_policy, held.engine = new.topology, new.policy, new.engine
            held.books = new.books
            held.rediscover_pending = False
            self.enforcer.written.clear()
            for where in new.whole:  # given the CPUs it was short of
                self.health.clear_prefix(f"hotplug:{where}: cpus")
            for change in new.flagged:  # one problem per change: a container short of
                # CPUs that then loses its device shows both ("w/c: cpus 3 went offline")
                self.health.set(f"hotplug:{change.split(';')[0]}", change)
            self.check_classes()
            self.commits.after_commit(self.commits.enforce)
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
        held = self.held
        started = time.perf_counter()
        with self.metrics.reconcile_duration.time():
            # The reads of a pass (the managed trees, the cpusets numad wrote) come
            # first, without the lock: it is held only to decide and write.
            scan = self.enforcer.scan(self.config.paths.managed_roots, self._giving_way())
            with held.changing:
                repairs = self._pass(scan)
        if repairs is None:
            return
        self.log.info(  # the one line per reconcile pass
            "reconcile_completed",
            workloads=len(held.specs),
            unplaced=len(held.unplaced),
            drift_repaired=repairs,
            duration_ms=round((time.perf_counter() - started) * 1000, 3),
        )

    def _giving_way(self) -> Callable[[], None]:
        """A pass's walk gives way to each change that runs meanwhile, waiting for it
        to end at its next beat, for half the reconcile period in all (5 s by default):
        changes are not slowed by the walk (under emulation a walk of 10,000 strays
        takes 1-3 s), and back-to-back changes (each of seconds, isolating thousands of
        strays one by one) do not hold a pass off past its period."""
        held, left = self.held, [GIVE_WAY_SHARE * self.config.reconcile_seconds]

        def pause() -> None:
            if left[0] > 0:
                left[0] -= held.changing.step_aside(held.stopping, left[0])

        return pause

    def _pass(self, scan: Scan) -> int | None:
        held = self.held
        if held.stopped or held.stopping.is_set():  # numad stops: no new pass
            return None
        held.passes += 1
        self._check_root()
        if self.health.has("checkpoint"):
            # Retried beside enforcement, not before it: what is committed is still
            # enforced (drift repaired, new cgroups isolated) while the disk is full.
            with contextlib.suppress(CheckpointError):
                self.commits.commit(held.books, held.specs)
        if held.rediscover_pending:
            self.rediscover()
        with held.changing.unlocked():  # per cgroup numad wrote: readers get in
            repairs = self.enforcer.find_drift(held.passes, scan)
        held.repairs += repairs
        self._releases()
        self._readmit()
        self.commits.enforce(listing=scan.listing)  # raises to the supervisor: retried
        self.health.clear("enforce")
        self.commits.settle_orphans()
        with held.changing.unlocked():  # memory.numa_stat, per workload: readers get in
            self._measure_memory()
        return repairs

    def _measure_memory(self) -> None:
        """Each placed workload's locality: exported, and listed in health while it
        stays below the threshold (not while its memory is being moved)."""
        held = self.held
        for name in sorted(held.specs):
            memory = self.memory_of(name)
            if memory["state"] == "shared":
                continue
            share = memory["locality"]
            if share is not None:
                self.metrics.locality.labels(name).set(share)
            moving = memory["state"] == "migrating"
            self.migrations.check(name, share, self.config.locality_threshold, moving)

    def check_classes(self) -> None:
        """A device class that selects no device on this machine is a health problem
        and a warning (a selector mistyped, a driver not bound yet): every request for
        it is rejected until a device comes."""
        classes = self.held.books.devices.inventory.classes
        for c in self.config.device_classes:
            key = f"devices:{c.name}"
            if classes.get(c.name):
                self.health.clear(key)
            elif not self.health.has(key):
                problem = (
                    f"device class {c.name}: {c.described()} selects no device on this machine"
                )
                self.health.set(key, problem)
                self.log.warning("device_class_empty", device_class=c.name, selector=c.described())

    def _check_root(self) -> None:
        root = getattr(self.cgroups, "root", None)
        if root is not None and not Path(root).is_dir():
            self.health.set("cgroup-root", f"{root}: the cgroup hierarchy is gone")
        else:
            self.health.clear("cgroup-root")

    def _releases(self) -> None:
        """Release a workload whose cgroups existed and have all been gone for
        ``release-grace-seconds`` (a transient one's: gone or empty): a unit restart
        (rmdir, then mkdir) keeps it. Cost: one read per workload cgroup. That
        they existed is checkpointed: gone while numad was down counts too (the
        grace starts at the first pass)."""
        held = self.held
        now = self.clock()
        was = set(held.seen)
        for name, spec in list(held.specs.items()):
            # Stopped or started, a unit is still the workload; one outside the managed
            # roots is no longer looked at: it waits for its release or its root.
            if spec.unit is not None or name in held.outside:
                continue
            present = [self.enforcer.exists(spec.container_cgroup(c)) for c in spec.containers]
            if any(p is True for p in present):
                held.seen.add(name)
            self._say_cgroup(name, spec, present)
            if any(p is True for p in present) and not self._idle(spec, present):
                held.gone_since.pop(name, None)
            elif name in held.seen and all(p is not None for p in present):
                since = held.gone_since.setdefault(name, now)
                grace = self.config.release_grace_seconds
                self.health.set(
                    f"cgroup-of:{name}",
                    f"{name}: its cgroup {spec.cgroup} is gone or empty; released"
                    f" {grace - (now - since):.0f} s after this pass unless it is back",
                )
                if now - since >= grace:
                    event = "workload_cgroup_empty" if any(present) else "workload_cgroup_removed"
                    self.log.info(event, workload=name)
                    with contextlib.suppress(CheckpointError):  # released at a later pass
                        self.release(name)
        if held.seen - was:  # kept, so that cgroups gone while numad is down still count
            with contextlib.suppress(CheckpointError):  # health says so; the next pass retries
                self.commits.commit(held.books, held.specs)

    def _say_cgroup(self, name: str, spec: WorkloadSpec, present: list[bool | None]) -> None:
        """Health names a workload whose cgroup numad has never seen (it holds its
        placement, written once the cgroup is made)."""
        if name in self.held.seen or not all(p is False for p in present):
            self.health.clear(f"cgroup-of:{name}")
        else:
            self.health.set(
                f"cgroup-of:{name}",
                f"{name}: waiting for its cgroup {spec.cgroup}: it holds its placement,"
                " written once the cgroup is made",
            )

    def _idle(self, spec: WorkloadSpec, present: list[bool | None]) -> bool:
        """A transient workload whose cgroups that exist have no process left (its
        client, ``numad run`` or a container runtime, may have died without a release)."""
        if not spec.transient:
            return False
        cgroups = [
            spec.container_cgroup(c) for c, p in zip(spec.containers, present, strict=True) if p
        ]
        return all(self.enforcer.empty(path) is True for path in cgroups)

    def _readmit(self) -> None:
        """Place each unplaced workload that fits again, as a new admission would (not
        one outside the managed roots: numad could not write its placement)."""
        held = self.held
        for name in sorted(held.unplaced.keys() - held.outside):  # not written: not placed
            try:
                books, outcome = admit(held.engine, held.books, held.specs[name].to_request())
            except NumadError as err:  # e.g. its device class left the config
                self.commits.unplace(name, str(err))
                continue
            if not outcome.admitted:
                continue
            unplaced = {k: why for k, why in held.unplaced.items() if k != name}
            try:
                self.commits.commit(books, held.specs, unplaced=unplaced)
            except CheckpointError:
                return
            why = held.unplaced.pop(name)
            held.books = books
            held.outcomes[name] = outcome
            self.health.clear(f"workload:{name}")
            self.log.info("workload_placed_again", workload=name, was=why)

    def stop(self) -> None:
        """numad stops: the cgroups it isolated get every CPU back (their parent's)."""
        held = self.held
        held.stopping.set()  # a change under way ends its writes and lets go of changing
        with held.changing:
            held.stopped = True
            try:  # partitions first: a cgroup beside one may not name its CPUs again
                self.enforcer.end_partitions()
                self.commits.others.end()
            finally:  # whatever that met, the interrupts get theirs back too
                self.commits.end_irqs()
        # Sent after the lock, within the stop's deadline (``Isolation.hurry``): a released
        # unit's reset, if still owed (else its next start brings back its last placement),
        # and each isolated unit's own AllowedCPUs= (else units.json keeps it for the next
        # numad). A failure is logged by the round.
        self.commits.isolation.send()
        self.migrations.stop()  # outside the lock: the mover's report takes it
