"""The one path every change takes: checkpoint first, then the host.

Daemon side. ``commit`` writes the checkpoint of the books and specs it is given
(``numad.daemon.state``); only then does ``enforce`` write the cgroups, through
``numad.host.enforce`` (which owns the order of the writes), isolate the cgroups
that are no workload's and move interrupts off the exclusive CPUs. A checkpoint
that cannot be written changes nothing and raises ``CheckpointError``; a cgroup
step that fails after a commit leaves the change standing and is retried by every
reconcile pass. Used by the composition root (requests) and the reconciler, on the
shared ``Holdings``, within a change (``changing``; the daemon's lock let go around
the cgroup writes).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from pathlib import Path

from numad.cpuset import CPUSet, NodeSet
from numad.daemon import state
from numad.daemon.config import Config
from numad.daemon.holdings import Holdings
from numad.daemon.others import Others
from numad.daemon.restore import reserved_setting
from numad.errors import CheckpointError, NumadError
from numad.host import durable
from numad.host.cgroup.events import CgroupEvents
from numad.host.cgroup.path import CgroupPath
from numad.host.drift import drifted
from numad.host.enforce import Enforcer
from numad.host.irqs import IrqAffinity
from numad.host.isolation import Isolation
from numad.host.strays import outermost
from numad.host.targets import Listing, Log, Target, related_to, targets
from numad.observe import Problems
from numad.placement.admission import Books
from numad.workload.shape import WorkloadSpec


class Commits:
    def __init__(  # noqa: PLR0917 - the parts a change touches
        self,
        held: Holdings,
        config: Config,
        state_dir: Path,
        log: Log,
        health: Problems,
        enforcer: Enforcer,
        isolation: Isolation,
        irqs: IrqAffinity,
    ) -> None:
        self.held = held
        self.config = config
        self.state_dir = state_dir
        self.log = log
        self.health = health
        self.enforcer = enforcer
        self.isolation = isolation
        self.irqs = irqs
        self.syscalls = durable.SYSCALLS  # the checkpoint's writes (a seam for fault injection)
        self.others = Others(held, config, log, health, enforcer, isolation)
        self.watched: frozenset[str] = frozenset()  # the workloads' cgroups, as last enforced
        # A failpoint for the crash tests: die at the named step, as SIGKILL would.
        self._crash_at = os.environ.get("NUMAD_TEST_CRASH_AT", "")

    def commit(
        self,
        books: Books,
        specs: Mapping[str, WorkloadSpec],
        *,
        orphans: set[str] | None = None,
        unplaced: Mapping[str, str] | None = None,
        seen: set[str] | None = None,
    ) -> None:
        """Write the checkpoint of ``books``/``specs`` (and of the holdings' ``orphans``,
        ``unplaced`` and ``seen`` as they will be: by default as they are; the caller
        sets them once this returns). CheckpointError leaves the daemon's state as it
        was and makes numad not ready until a write succeeds. Within a change, the
        write and its fsync run with the daemon's lock let go (``unlocked``): readers
        still see the holdings as last committed, for nothing of this change is in them
        yet; a disk slow to sync holds no reader."""
        held = self.held
        unplaced = held.unplaced if unplaced is None else unplaced
        records = {
            name: state.record_of(books, name, spec.to_dict(), unplaced.get(name, ""))
            for name, spec in specs.items()
        }
        reserved = CPUSet.from_bits(held.reserved).format_list()
        orphans = held.orphans if orphans is None else orphans
        grants = {p: CPUSet.from_bits(c).format_list() for p, c in self.enforcer.grants.items()}
        seen = held.seen if seen is None else seen
        checkpoint = state.Checkpoint(
            reserved,
            records,
            tuple(sorted(orphans)),
            reserved_setting(self.config),
            grants,
            tuple(sorted(seen & specs.keys())),
        )
        try:
            with held.changing.unlocked():
                state.write(self.state_dir, checkpoint, self.syscalls)
        except CheckpointError as err:
            self.health.set("checkpoint", f"{err}; numad cannot commit changes")
            self.log.error("checkpoint_write_failed", problem=str(err))
            raise
        self.health.clear("checkpoint")

    def crash_point(self, name: str) -> None:
        if self._crash_at == name:
            os._exit(137)

    def unplace(self, name: str, why: str) -> None:
        if self.held.unplaced.get(name) == why:
            return
        self.held.unplaced[name] = why
        self.health.set(f"workload:{name}", f"{name}: unplaced: {why}; admitted again once it fits")
        self.log.error("workload_unplaced", workload=name, problem=why)

    def enforce(
        self,
        step: Callable[[str], None] | None = None,
        *,
        changed: WorkloadSpec | None = None,
        listing: Listing | None = None,
    ) -> None:
        """Every managed cgroup written as the books say, the others isolated, the
        interrupts placed. A pass finds the others (in ``listing``, the managed trees
        as scanned before the lock); an admission or release (``changed``) only takes
        that workload's cgroups out of them: no tree is walked on the API path.

        The daemon's lock is let go meanwhile, the change kept (``Holdings``): isolated
        one by one, thousands of cgroups are written per change on a busy host, and a
        partition change makes the kernel walk every cpuset. Readers get in then and
        see what is committed; nothing else changes until this returns."""
        with self.held.changing.unlocked():
            self._enforce(step, changed, listing)

    def _enforce(
        self,
        step: Callable[[str], None] | None,
        changed: WorkloadSpec | None,
        listing: Listing | None,
    ) -> None:
        held = self.held
        # The release of a workload outside the managed roots changes what its top-level
        # cgroup keeps: the others are found anew (rare: a root taken out of the config).
        if changed is None or self.outside(changed):
            self.others.find(listing)
        else:
            self.others.leave(changed)
        self.isolation.workloads.own(self.units(), held.orphans)  # told through systemd
        wanted = self._wanted()
        self.watched = frozenset(held.owned())  # their writes are watched (``written_elsewhere``)
        partitions = self.enforcer.partitions
        clashes = set(partitions.clashes) if partitions is not None else set()
        self.enforcer.apply(wanted, held.books.cpu.shared_pool, step)
        if partitions is not None and self.enforcer.partitions is None:
            # Refused for good (numad.host.exclusive): the others isolated one by one
            # now, after a walk of the managed trees (once in a run).
            self.enforce(step, listing=listing)
            return
        if partitions is not None and partitions.clashes - clashes:
            # Cgroups beside a partition named its CPUs: isolated now, and the partition
            # made again in the same change (each clash is found once).
            self.enforce(step, listing=listing)
            return
        self.isolation.workloads.preset(wanted)
        self.place_irqs()

    def settle_units(self, changed: WorkloadSpec) -> None:
        """After the lock, for an API change to a unit, or one whose grant waits on a
        unit (that gives up its CPUs): systemd told what the workloads' units are owed
        (``numad.host.workload_units``), so the answer comes once it has written them,
        and what waited on them written. The daemon's lock is not held meanwhile; the
        unit loop does the same for a pass, and for any other change."""
        units, mine = self.isolation.workloads, self.held.cgroups_of(changed)
        record = self.isolation.record
        # A unit above them gets its own back first (one the unit loop gave back since
        # left their write deferred: ``write:`` says so until it is made).
        if record is not None and any(
            record.above(p) or self.health.has(f"write:{p}") for p in mine
        ):
            self.isolation.send()
            self._enforce_after(changed)
        waits = any(self.health.has(f"grant:{p}") for p in mine)
        if not units.owed() or (changed.unit is None and not waits):
            return
        units.send()
        self._enforce_after(changed)

    def _enforce_after(self, changed: WorkloadSpec) -> None:
        with self.held.changing:
            if not self.held.stopped:
                self.after_commit(lambda: self.enforce(changed=changed))

    def after_commit(self, step: Callable[[], None]) -> None:
        """A cgroup step after a commit: the change stands whatever the step raises
        (the caller's answer says what was committed); the next reconcile pass
        writes everything again."""
        try:
            step()
        except Exception as err:
            self.health.set("enforce", f"cgroup writes failed after a commit: {err!r}; retried")
            self.log.exception("enforcement_failed", problem=repr(err))

    def place_irqs(self) -> None:
        """Interrupts off the exclusive CPUs ([host] irq-affinity); turned off, every
        one numad moved gets its own affinity back."""
        if self.config.irq_affinity:
            cpu = self.held.books.cpu
            exclusive, pool = CPUSet.from_bits(cpu.exclusive), CPUSet.from_bits(cpu.shared_pool)
            problems = self.irqs.apply(exclusive, pool)
            if problems:
                self.health.set("irqs", "; ".join(problems))
            else:
                self.health.clear("irqs")
        else:
            self.end_irqs()

    def end_irqs(self) -> None:
        """Every interrupt numad moved gets its own affinity back."""
        for problem in self.irqs.restore() if self.irqs.originals else []:
            self.log.error("irq_reset_failed", problem=problem)

    def isolate_new(self, paths: list[str]) -> None:
        """Cgroups that just appeared (``numad.host.cgroup.events``), off the exclusive
        CPUs at once: each that is no workload's gets the shared pool now, not at the
        next pass. Cost: the new cgroups' writes (with the daemon's lock let go), nothing
        per existing cgroup."""
        held = self.held
        with held.changing:
            if held.stopped or not self.config.isolate or not hasattr(held, "books"):
                return
            if self.enforcer.partitions is not None:
                # The kernel keeps a new cgroup off every partition from its mkdir; one
                # that is a workload's again (its unit restarted) is made one again now.
                self.partition_again(paths)
                return
            roots = {r.strip("/") for r in self.config.paths.managed_roots}
            made, owned = set(paths), held.owned()
            mine = self.others.present(owned, made)  # above one gone: a stray
            back = [s for s in held.specs.values() if self.others.below(held.cgroups_of(s) & made)]
            theirs = made & owned  # workloads' cgroups made (again)
            with held.changing.unlocked():  # each may walk a subtree and write
                for spec in back:  # a workload's cgroup made again below an isolated one
                    self.others.leave(spec)
                if theirs:
                    self._write_made(theirs)
            if theirs:
                self._seen(theirs)
            tops = [p for p in paths if CgroupEvents.top_level(p) and p not in held.others]
            if tops:  # a new top-level cgroup: listed as a pass does (rare: no tree walk)
                was = set(held.others)
                with held.changing.unlocked():
                    self.others.find()
                tops = [p for p in tops if p in held.others and p not in was]
            new = tops + [
                p
                for p in paths
                if not CgroupEvents.top_level(p)
                and p not in roots
                and p not in held.others
                and p not in held.orphans
                and not related_to(p, mine)
            ]
            if not self.isolation.v1:  # one below a cgroup numad isolates is kept off already
                new = sorted(outermost(set(new), held.others))
            if not new:
                return
            held.others = held.others | set(new)  # a new set: a reader may be sorting the old
            pool = held.books.cpu.shared_pool
            with held.changing.unlocked():  # a batch of hundreds: no reader waits for it
                self.isolation.mark(held.others, owned)  # their own settings read, saved
                self.enforcer.share([Target(p, pool, None, exclusive=False) for p in new], pool)
        self.log.info("cgroups_isolated_on_creation", cgroups=new[:10], count=len(new))

    def _wanted(self) -> list[Target]:
        """Every cgroup numad writes, as the books say (``numad.host.targets``)."""
        held = self.held
        memory = NodeSet(n.id for n in held.topology.nodes if n.memory_total_kb)
        return targets(
            held.books, held.specs, held.orphans, held.others, memory or None, outside=held.outside
        )

    def _write_made(self, made: set[str]) -> None:
        """Workloads' cgroups just made get their own sets now, not at the next pass:
        cgroup v2 gave each its parent's CPUs, every CPU of a managed root, the
        exclusive ones too. What numad wrote to one before it went is not taken for
        the new one's. Every target is applied, so that a grant another cgroup still
        holds back (one that could not shrink) waits here too. Cost: every target,
        written only where it changed (a workload's cgroup made is rare)."""
        for path in made:
            self.enforcer.forget(path)
        self.enforcer.apply(self._wanted(), self.held.books.cpu.shared_pool)

    def _seen(self, made: set[str]) -> None:
        """The workloads whose cgroups were just made have been seen (as a pass would
        say): gone again, they are released after the grace, and the cgroups above them
        are strays meanwhile. Checkpointed, as a pass does; one that fails is retried
        by the next pass."""
        held = self.held
        names = {
            s.name for s in held.specs.values() if s.unit is None and held.cgroups_of(s) & made
        }
        if names - held.seen:
            held.seen = held.seen | names
            with contextlib.suppress(CheckpointError):
                self.commit(held.books, held.specs)

    def written_elsewhere(self, paths: set[str]) -> bool:
        """Whether another writer changed the cpuset numad wrote in one of ``paths``
        (workloads' cgroups whose cpuset files were just written: inotify); the caller
        then wakes a pass, which repairs it now instead of at the period's end. Read
        within a change, so numad's own writes (made with the lock let go) are never
        taken for another's. Cost: two reads per path."""
        with self.held.changing:
            found = drifted(self.enforcer, paths)
        if found:
            self.log.warning("cpuset_written_elsewhere", cgroups=found[:10], count=len(found))
        return bool(found)

    def partition_again(self, paths: list[str]) -> None:
        """Workload cgroups made (again: a restarted unit's) are partitions at once, not
        at the next pass: the kernel made them as plain members, and numad's holding
        cgroup gives their CPUs up first. Cost: every workload's targets (no other
        cgroup is written with partitions), written only where they changed."""
        held = self.held
        made = set(paths) & {t.path for t in targets(held.books, held.specs, ()) if t.exclusive}
        if not made:
            return
        for path in made:
            self.enforcer.written.pop(path, None)
        self.enforce()

    def units(self) -> dict[str, str]:
        """The workloads' units: their cgroup -> unit."""
        return {s.cgroup: s.unit for s in self.held.specs.values() if s.unit is not None}

    def outside(self, spec: WorkloadSpec) -> bool:
        """Whether the workload's cgroup lies outside [paths] managed-roots (a root
        taken out of the config since its admission): numad writes it no more."""
        roots = [CgroupPath.parse(r.strip("/")) for r in self.config.paths.managed_roots]
        try:
            CgroupPath.parse(spec.cgroup).managed_by(roots)
        except NumadError:
            return True
        return False

    def settle_orphans(self) -> None:
        """Forget released cgroups that are gone (or belong to a workload again); a
        released unit among them has its runtime settings reset now, not a pass later."""
        held = self.held
        owned = held.owned()
        settled = {p for p in held.orphans if p in owned or self.enforcer.exists(p) is False}
        if settled:
            orphans = held.orphans - settled
            try:
                self.commit(held.books, held.specs, orphans=orphans)
            except CheckpointError:
                return
            held.orphans = orphans
            for path in settled - owned:
                self.enforcer.forget(path)
            self.isolation.workloads.own(self.units(), held.orphans)
