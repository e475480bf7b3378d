"""The others: the cgroups numad isolates one by one, as they are found and as they leave.

Daemon side, a part of every change (``numad.daemon.commits``): a pass finds them in the
managed trees it scanned and among the other top-level cgroups (``find``); an
admission only takes the workload's cgroups out of them (``leave``); with partitions
only those that would clash with one stay; with isolation turned off, none. On cgroup
v2 only the outermost are written (``numad.host.strays.outermost``), and a cgroup
given back never leaves a stray unbounded, nor is given back while a stray around it
could not be written (``isolate``). A cgroup above a workload's cgroup that numad has
seen and that is gone is a stray again (``seen``). Writes through the enforcer and the
isolation backend, within the caller's change.
"""

from __future__ import annotations

from collections.abc import Collection

from numad.cpuset import CPUSet
from numad.daemon.config import Config
from numad.daemon.holdings import Holdings
from numad.errors import NumadError
from numad.host.enforce import Enforcer
from numad.host.isolation import Isolation
from numad.host.strays import around, below_any, outermost
from numad.host.targets import Listing, Log, Target, related_to
from numad.observe import Problems
from numad.workload.shape import WorkloadSpec


class Others:
    """The cgroups that are no workload's, isolated (``held.others``)."""

    def __init__(  # noqa: PLR0917 - the parts the others touch
        self,
        held: Holdings,
        config: Config,
        log: Log,
        health: Problems,
        enforcer: Enforcer,
        isolation: Isolation,
    ) -> None:
        self.held = held
        self.config = config
        self.log = log
        self.health = health
        self.enforcer = enforcer
        self.isolation = isolation

    def leave(self, spec: WorkloadSpec) -> None:
        """A workload's cgroups, and those above and below them, are no others now:
        cost per cgroup numad isolates, a prefix test per cgroup of the workload; on
        cgroup v2, where an isolated cgroup lies above it, a walk of that cgroup's
        subtree (the strays it bounded are isolated themselves now). A workload released
        takes nothing out: its cgroups are released ones now, and the next pass finds
        the cgroups above them strays again, if no workload lies below."""
        held = self.held
        if held.specs.get(spec.name) != spec:
            return
        # Made, or to be made (not seen yet): the cgroups above are its. Seen and gone
        # since (moved, resized): they stay strays, as a pass finds them.
        seen = self.seen()
        mine = self.present(held.cgroups_of(spec), held.others, seen)
        gone = {p for p in held.others if related_to(p, mine)}
        if not gone:
            return
        others = held.others - gone  # a new set: a reader may be sorting the old
        above = [p for p in gone if any(m.startswith(p + "/") for m in mine)]
        if above and not self.isolation.v1:  # those bounded it bounded: a walk below it
            found = self.enforcer.unmanaged(above, held.specs.values(), seen=seen)
            found -= held.orphans
            others |= outermost(found - held.owned(), others)
        self.isolate(others)

    def present(
        self, mine: set[str], near: Collection[str], seen: set[str] | None = None
    ) -> set[str]:
        """Of workloads' cgroups ``mine``, those that count for the cgroups above them:
        all but those below one of ``near`` that numad has seen and that exist no more
        (``numad.host.strays.unmanaged``; ``seen``: ``seen()``, where the caller has it).
        Cost: a stat per such cgroup."""
        if seen is None:
            seen = self.seen()
        return {
            m
            for m in mine
            if m not in seen or not below_any(m, near) or self.enforcer.exists(m) is not False
        }

    def seen(self) -> set[str]:
        """The cgroups of workloads whose cgroups numad has seen (not units': systemd
        makes theirs). Cost: per workload."""
        held = self.held
        specs = [held.specs[n] for n in held.seen if n in held.specs]
        return {c for s in specs if s.unit is None for c in held.cgroups_of(s)}

    def below(self, mine: Collection[str]) -> bool:
        """Whether one of ``mine`` lies below an isolated cgroup. Cost: per level of each."""
        return any(below_any(m, self.held.others) for m in mine)

    def isolate(self, others: set[str], *, whole: bool = False) -> None:
        """``others`` isolated from now on. cgroup v2: a cgroup given back now bounded
        the strays below it (a workload's cgroup lies below it now), or is bounded now
        by one above it (a pod released: its sidecar; a stray made again above those
        isolated before numad restarted); those of ``others`` not written yet are
        written first, so that none runs unbounded between (``outermost``). One that
        could not be written keeps those around it isolated, and health says so,
        until a pass (``whole``: ``others`` is every stray) writes it. Cost: set
        operations over the isolated cgroups, and the writes."""
        held, isolation, enforcer = self.held, self.isolation, self.enforcer
        leaving = (held.others - others) | (isolation.originals.keys() - others)
        fresh = []
        if leaving and not isolation.v1:
            unwritten = (others - held.others) | (others - enforcer.written.keys())
            made = self._made_below(leaving)
            for path in made:  # made again: what numad wrote or enabled for the old one
                enforcer.forget(path)  # (its parent's cpuset controller) holds no more
            fresh = around(unwritten, leaving) + made
        kept: set[str] = set()
        failed: list[str] = []
        if fresh:  # recorded, written, and only then the others given back
            for path in isolation.mark(others | leaving, held.owned()):
                enforcer.forget(path)
            pool = held.books.cpu.shared_pool
            failed = enforcer.share([Target(p, pool, None, exclusive=False) for p in fresh], pool)
            kept = {p for p in leaving if related_to(p, failed) and isolation.exists(p)}
            others = others | kept
        self._kept(kept, failed, kept if whole else others)
        held.others = others
        for path in isolation.mark(others, held.owned()):
            enforcer.forget(path)  # numad writes it no more (or as a workload's)

    def _made_below(self, leaving: set[str]) -> list[str]:
        """Workloads' cgroups below one given back, that exist: each was gone or not
        made yet when that one was isolated (else it would bound a workload), so numad
        may not have written it since it was made (a pass or its event would), and its
        file may be empty (what the one above runs on). They are written first, as the
        strays are. Cost: a prefix test per level of each workload cgroup, a stat per one
        below."""
        mine = (p for p in self.held.owned() if below_any(p, leaving))
        return sorted(p for p in mine if self.enforcer.exists(p))

    def _kept(self, kept: set[str], failed: list[str], still: set[str]) -> None:
        """Health names each cgroup kept isolated because one around it could not be
        written (a workload below it runs within the shared pool meanwhile), and
        forgets those not ``still`` kept (a pass knows; another change, only those
        given back since). Cost: per problem."""
        for subject in self.health.subjects():
            if subject.startswith("bounding:") and subject[len("bounding:") :] not in still:
                self.health.clear(subject)
        for path in sorted(kept):
            around_it = ", ".join(f for f in failed if related_to(path, [f]))
            self.health.set(
                f"bounding:{path}",
                f"{path}: still isolated (the shared pool, for every cgroup below it too):"
                f" {around_it}, around it, could not be written yet; given its own cpuset"
                " back once that is (retried every pass)",
            )

    def find(self, listing: Listing | None = None) -> None:
        """The cgroups that are no workload's, isolated as they appear: the other
        top-level cgroups and the unmanaged ones inside the managed roots. With
        isolation turned off, the ones isolated before get their own cpusets back."""
        held = self.held
        self.isolation.online = held.topology.online_cpus
        if not self.config.isolate:
            if self.isolation.originals or held.others:
                self.end()
            return
        if self.enforcer.partitions is not None:
            # Partitions keep every other cgroup off the exclusive CPUs: none is written
            # but those that would clash with one (``beside_partitions``).
            keep = self.beside_partitions()
            if set(self.isolation.originals) - keep or held.others - keep:
                for problem in self.isolation.restore(keep=keep):
                    self.log.error("cgroup_reset_failed", problem=problem)
                for path in held.others - keep:
                    self.enforcer.forget(path)
            held.others = keep
            self.isolation.mark(keep, held.owned())
            return
        roots = self.config.paths.managed_roots
        owned = held.owned()
        inside = self.enforcer.unmanaged(roots, held.specs.values(), listing, self.seen())
        inside -= held.orphans
        try:
            tops = self.isolation.top_level(roots)
            self.health.clear("isolation-list")
        except NumadError as err:
            self.health.set("isolation-list", f"{err}; the top-level cgroups stay as they were")
            tops = {p for p in held.others if p.split("/", maxsplit=1)[0] in self.isolation.tops}
        others = (inside | tops) - owned
        if not self.isolation.v1:  # each bounds the cgroups below it
            others = outermost(others)
        if held.outside:  # not theirs, nor below them: what runs there is theirs
            mine = [c for n in held.outside for c in held.cgroups_of(held.specs[n])]
            others = {p for p in others if not any(_within(p, c) for c in mine)}
        self.isolate(others, whole=True)

    def beside_partitions(self) -> set[str]:
        """With partitions, the cgroups still isolated one by one: those beside a
        partition whose own cpuset.cpus named its CPUs (the kernel leaves it invalid
        while they do), and those isolated before whose own setting would name
        exclusive CPUs again (every CPU, for one with tasks that cannot inherit its
        parent's again). Cost: per cgroup in the isolation record, and per clash."""
        parts, held = self.enforcer.partitions, self.held
        assert parts is not None
        exclusive = CPUSet.from_bits(held.books.cpu.exclusive)
        keep = set()
        for path in sorted(parts.clashes):
            if self.isolation.exists(path):
                keep.add(path)
        parts.clashes = set(keep)
        for path, own in self.isolation.originals.items():
            cpus = CPUSet.parse_list(own.get("cpus", ""))
            try:
                busy = not cpus and bool(self.isolation.processes(path))
            except NumadError:
                continue  # gone: nothing to give back
            if cpus & exclusive or busy:
                keep.add(path)
        return keep - held.owned()

    def end(self) -> None:
        """Every isolated cgroup gets its own cpuset back (its parent's, or systemd's);
        partitions are not touched (``end_partitions``)."""
        with self.held.changing.unlocked():  # one write per isolated cgroup
            for problem in self.isolation.restore():
                self.log.error("cgroup_reset_failed", problem=problem)
            for path in sorted(self.held.others):
                self.enforcer.forget(path)
        self.held.others = set()


def _within(path: str, cgroup: str) -> bool:
    return path == cgroup or path.startswith(cgroup + "/")
