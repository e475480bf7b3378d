"""Enforcement: the one place that writes cpusets, and the order of those writes.

Daemon side; touches the host only through the cgroup backend it is given.
Every write goes through ``Enforcer.write``, which reads the effective cpuset
back, remembers what it wrote (for drift repair) and turns any failure into a
problem that stays in ``/v1/health`` until a later write succeeds.

``Enforcer.apply`` holds DESIGN invariant 4: a CPU is never in an exclusive
set and another cgroup at once, whatever fails. numad remembers per cgroup the
exclusive CPUs its file may still hold (``grants``: the last exclusive set
written there, kept in the checkpoint) until the file is rewritten or gone.
The cgroups that follow the shared pool (released cgroups, cgroups that are
no workload's, shared containers, unplaced workloads) never get a CPU that
another cgroup may hold as a grant (but one above a workload numad no longer
writes keeps that workload's CPUs: ``Target.keeps``), and shrink before any
exclusive set is written; an exclusive set is granted only once no other cgroup
may run on its CPUs (a shared cgroup that failed to shrink, or an older grant
elsewhere).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

from numad.cpuset import CPUSet, NodeSet
from numad.errors import NumadError
from numad.host import strays
from numad.host.drift import find_drift, scan
from numad.host.exclusive import Partitions
from numad.host.targets import Cgroups, Deferred, Listing, Log, Moves, Scan, Target, union
from numad.observe import EnforcementCounters, Problems
from numad.workload.shape import WorkloadSpec


class Enforcer:
    def __init__(
        self, cgroups: Cgroups, metrics: EnforcementCounters, log: Log, problems: Problems
    ) -> None:
        self.cgroups = cgroups
        self.cancelled: Callable[[], bool] = lambda: False  # numad is stopping
        self.beat: Callable[[], object] = lambda: None  # the pass advanced (the watchdog)
        self.metrics = metrics
        self.log = log
        self.problems = problems
        self.written: dict[str, tuple[int, NodeSet | None]] = {}  # last value per cgroup
        self.ensured: set[str] = set()  # cgroups whose ancestors have cpuset enabled
        self.drift: dict[str, tuple[int, int]] = {}  # cgroup -> (drifts in a row, next pass)
        # cgroup -> the exclusive CPUs its file may hold: the last exclusive set
        # written there (or recorded in the checkpoint), until a shared write or
        # its removal. No other cgroup is given these CPUs meanwhile.
        self.grants: dict[str, int] = {}
        self.moves: Moves | None = None  # None: every mems write is made here
        self.partitions: Partitions | None = None  # grants as remote partitions

    def scan(self, roots: Iterable[str], pause: Callable[[], object]) -> Scan:
        """The reconcile pass's reads, made before it takes the daemon's lock
        (``numad.host.drift.scan``); ``pause`` where it may step aside for a change."""
        return scan(self, roots, pause)

    def unmanaged(
        self,
        roots: Iterable[str],
        specs: Collection[WorkloadSpec],
        listing: Listing | None = None,
        seen: Collection[str] = (),
    ) -> set[str]:
        """The cgroups inside the managed roots that are no workload's (``strays``)."""
        return strays.unmanaged(
            self.cgroups, roots, specs, listing, self.problems, self._failed, seen
        )

    def exists(self, path: str) -> bool | None:
        """Whether the cgroup exists; None when that cannot be told (the fault is a
        problem under the cgroup's name, like a failed write)."""
        try:
            found = self.cgroups.exists(path)
        except NumadError as err:
            self._failed(path, err)
            return None
        return found

    def empty(self, path: str) -> bool | None:
        """Whether no live process is in the cgroup (a scratch tree keeps the pids of
        exited ones: they do not count); None when that cannot be told."""
        try:
            pids = self.cgroups.processes(path)
        except NumadError as err:
            self._failed(path, err)
            return None
        return not any(_alive(pid) for pid in pids)

    def apply(
        self, wanted: list[Target], pool: int, step: Callable[[str], None] | None = None
    ) -> None:
        """Write every target so that no CPU is ever in an exclusive set and another
        cgroup at once (see the module docstring), in three phases:

        1. shared cgroups shrink to the pool less every CPU another cgroup may run
           on as an exclusive grant (``grants``); so does a cgroup about to be
           granted whose file holds shared CPUs that others are about to get;
        2. exclusive sets are granted once no other cgroup may run on their CPUs;
        3. shared cgroups grow to the pool, less what is still granted elsewhere.

        ``step`` is called after phases 1 and 2 ("shared", "exclusive"): the crash
        tests' failpoints."""
        if self.partitions is not None:
            wanted = self._holding(wanted, pool)
        shared = [t for t in wanted if not t.exclusive]
        pending = [t for t in wanted if t.exclusive and not self._holds(t)]
        claimed = union(t.cpus for t in pending)
        narrow = [  # shared CPUs in their files that others are about to be granted
            t
            for t in pending
            if self._held(t.path, empty=0) & ~self.grants.get(t.path, 0) & claimed & ~t.cpus
        ]
        blocked, failing = 0, []
        # Deepest first when shrinking, top first when growing: cgroup v1 refuses a
        # parent narrower than its child (host isolation writes whole v1 trees).
        shared.sort(key=lambda t: t.path.count("/"), reverse=True)
        # numad stopping (``cancelled``) ends the writes between two of them: the
        # order holds for every write made, and the next start writes the rest.
        for t in shared + narrow:
            if self.cancelled():
                return
            if not self._share(t, pool):
                failing.append(t.path)
                blocked |= self._held(t.path, empty=-1)
        if step is not None:
            step("shared")
        if self.cancelled():
            return
        self._hold_back(pending, blocked, pool)
        self._grant(pending, blocked, failing)
        if step is not None:
            step("exclusive")
        for t in reversed(shared):
            if self.cancelled():
                return
            self._share(t, pool)

    def _holding(self, wanted: list[Target], pool: int) -> list[Target]:
        """Partitions: numad's holding cgroup in place of each exclusive set whose cgroup
        is not there (``numad.host.exclusive``); a check per set not written yet."""
        assert self.partitions is not None
        absent = [
            t for t in wanted if t.exclusive and not self._holds(t) and self.exists(t.path) is False
        ]
        for t in absent:  # no grant there (one assumed at start; a unit's left-over cgroup)
            self.forget(t.path)
        try:
            return self.partitions.holding(wanted, absent, pool, self.grants, self.cgroups.ensure)
        except NumadError as err:
            self._failed(self.partitions.holder, err)
            return wanted

    def share(self, shared: list[Target], pool: int) -> list[str]:
        """Write shared targets alone (cgroups that just appeared: they only shrink);
        returns those that do not hold their set now."""
        return [t.path for t in shared if not self._share(t, pool)]

    def _share(self, t: Target, pool: int) -> bool:
        """Write the shared pool less what other cgroups may still run on as an
        exclusive grant (but with what a cgroup above a workload numad no longer
        writes ``keeps``); never an empty set (that would mean every CPU). Each write is
        a pass advancing (``beat``: the watchdog), shrinking or growing."""
        self.beat()
        cpus = (pool & ~self._granted_elsewhere(t.path)) | t.keeps
        if cpus:
            if (written := self.write(t.path, cpus, t.mems)) and not t.exclusive:
                self.problems.clear(f"grant:{t.path}")  # a grant it waited for is not its now
            return written
        if self.exists(t.path):
            self.problems.set(
                f"write:{t.path}",
                f"{t.path}: no shared CPU to give it: every one is still held by an exclusive"
                " cgroup not yet rewritten; retried every pass",
            )
        return False

    def _holds(self, t: Target) -> bool:
        return self.written.get(t.path) == (t.cpus, t.mems)

    def _granted_elsewhere(self, path: str) -> int:
        """The CPUs other cgroups may run on as an exclusive grant."""
        return union(cpus for p, cpus in self.grants.items() if p != path)

    def _grant(self, pending: list[Target], blocked: int, failing: list[str]) -> None:
        """Grant each exclusive set once no other cgroup may run on its CPUs: one
        that failed to shrink (``blocked``) or one that still holds an older grant.
        Where cgroups wait on each other, each first narrows to the part of its old
        grant that it keeps."""
        narrowed = False
        mode = self.partitions
        while pending:
            done = [t for t in pending if not t.cpus & (blocked | self._granted_elsewhere(t.path))]
            for t in done:
                self.problems.clear(f"grant:{t.path}")
                self.write(t.path, t.cpus, t.mems, exclusive=True)
                if mode is not None and self.partitions is None:
                    return  # partitions refused: no grant until the others shrink
            if not done:
                if narrowed or not self._narrow(pending, blocked):
                    break
                narrowed = True
            pending = [t for t in pending if t not in done]
        for t in pending:
            holders = failing + [
                p for p, cpus in self.grants.items() if p != t.path and cpus & t.cpus
            ]
            self.problems.set(
                f"grant:{t.path}",
                f"{t.path}: exclusive cpus {CPUSet.from_bits(t.cpus).format_list()} not"
                f" granted yet: {', '.join(holders)} may still run there; retried every pass",
            )

    def _hold_back(self, pending: list[Target], blocked: int, pool: int) -> None:
        """Each cgroup whose grant must wait and whose file is empty (made since numad
        last wrote it: cgroup v2 runs it on its parent's CPUs, every CPU of a managed
        root) runs on the shared pool meanwhile, like any cgroup that holds no grant."""
        for t in pending:
            waits = t.cpus & (blocked | self._granted_elsewhere(t.path))
            if waits and self._held(t.path, empty=-1) == -1:
                self._share(Target(t.path, pool, t.mems, exclusive=False), pool)

    def _narrow(self, pending: list[Target], blocked: int) -> bool:
        """Each waiting cgroup whose file holds an older grant gives up the CPUs of
        it that it does not keep (a subset of what it runs on now, granted to it
        before and to no one else since: nothing is added, nothing shared)."""
        progress = False
        for t in pending:
            now = self._held(t.path, empty=0)
            kept = now & t.cpus & self.grants.get(t.path, 0) if now > 0 else 0
            others = blocked | self._granted_elsewhere(t.path)
            if kept and kept != now and not kept & others:
                progress |= self.write(t.path, kept, t.mems, exclusive=True)
        return progress

    def _held(self, path: str, *, empty: int) -> int:
        """The CPUs a cgroup may still run on: its configured set; ``empty`` when the
        file is empty (it inherits its parent's). One whose file cannot be read (no
        cpuset controller there) runs on what its nearest readable ancestor applies;
        every CPU only when no ancestor can be read either."""
        try:
            cpus, _ = self.cgroups.read(path)
        except NumadError:
            return self._applied_above(path)
        return cpus.bits if cpus else empty

    def _applied_above(self, path: str) -> int:
        parts = path.split("/")
        for depth in range(len(parts) - 1, 0, -1):
            try:
                cpus, _ = self.cgroups.read_effective("/".join(parts[:depth]))
            except NumadError:
                continue
            if cpus:
                return cpus.bits
        return -1

    def write(self, path: str, cpus: int, mems: NodeSet | None, *, exclusive: bool = False) -> bool:
        """Write a cgroup's cpuset unless it already holds this value from numad.
        True when the cgroup holds it now (or does not exist: written when it
        appears); False when the write failed or the kernel applies another set."""
        if self.written.get(path) == (cpus, mems):
            return True
        try:
            if not self.cgroups.exists(path):
                self.forget(path)  # gone: nothing left to report
                if self.moves is not None:
                    self.moves.settled(path)
                return True
            if path not in self.ensured:  # the ancestors' controllers, once per cgroup
                self.cgroups.ensure(path)
                self.ensured.add(path)
            start = time.perf_counter()
            now = self._write(path, cpus, mems, exclusive=exclusive)
            kind = "grant" if exclusive else "shared"
            self.metrics.cgroup_write_seconds.labels(kind).observe(time.perf_counter() - start)
            if self._effective(path, CPUSet.from_bits(cpus), now):
                moved = self.written.get(path, (0, None))[0] != cpus
                self.written[path] = (cpus, mems)
                if exclusive and moved and self.moves is not None:
                    self.moves.placed(path, CPUSet.from_bits(cpus), mems)
                return True
            self.written.pop(path, None)  # the file holds this write, not the value remembered
            return False
        except Deferred:  # systemd writes it after the lock; then it is written here again
            self.written.pop(path, None)
            return False
        except NumadError as err:
            self._failed(path, err)
            if self.partitions is not None and self.partitions.refused:
                self._without_partitions(self.partitions)
            return False

    def _write(
        self, path: str, cpus: int, mems: NodeSet | None, *, exclusive: bool
    ) -> NodeSet | None:
        """The file written, its grant held or ended; the mems it holds now."""
        # A mems write that moves pages (seconds per GiB) is the mover's: the file
        # holds the old and new nodes meanwhile.
        wide = None
        if mems is not None and self.moves is not None:
            wide = self.moves.interim(path, mems)
        now = mems if wide is None else wide
        if not exclusive and self.partitions is not None:  # before its CPUs change
            self._end_grant(path)  # (6.12 warns at a cpus write to a partition)
        self.cgroups.write(path, CPUSet.from_bits(cpus), now)
        self._hold_grant(path, cpus if exclusive else 0)
        self.problems.clear(f"write:{path}")
        if wide is not None and mems is not None and self.moves is not None:
            self.moves.narrow(path, mems, wide)
        elif mems is not None and self.moves is not None:
            self.moves.settled(path)
        return now

    def _without_partitions(self, refused: Partitions) -> None:
        """The kernel refuses numad partitions for good: each is dissolved, and every grant
        written again once the others are isolated one by one (the caller's next apply)."""
        self.end_partitions()
        self.partitions = None
        self.written.clear()
        self.problems.set(
            "partitions", f"{refused.refused}; numad isolates every other cgroup one by one"
        )
        self.log.error("partitions_refused", problem=refused.refused)

    def _failed(self, path: str, err: NumadError) -> None:
        self.written.pop(path, None)
        self.ensured.discard(path)  # set it up again next time: the tree may have changed
        self.metrics.cgroup_write_errors.inc()
        self.problems.set(f"write:{path}", f"{err}; retried every reconcile pass")
        self.log.error("cgroup_write_failed", cgroup=path, problem=str(err))

    def _hold_grant(self, path: str, cpus: int) -> None:
        """The cgroup's file holds ``cpus`` as an exclusive grant now, whatever the
        kernel applies (0: a shared set, its grant ended); a partition where numad
        makes them."""
        if not cpus:
            self._end_grant(path)
            return
        self.grants[path] = cpus
        if self.partitions is not None:
            self.partitions.grant(path, cpus, self.grants)

    def _end_grant(self, path: str) -> None:
        """No exclusive grant there now: a partition there is dissolved (recorded or not)."""
        had = self.grants.pop(path, None)
        if self.partitions is not None:
            self.partitions.end(path, self.grants, known=had is not None)

    def end_partitions(self) -> None:
        """Every partition dissolved (numad stops); the grants stay in the files."""
        if self.partitions is not None:
            for problem in self.partitions.end_all(self.grants):
                self.log.error("partition_end_failed", problem=problem)

    def forget(self, path: str) -> None:
        """Drop everything known about a cgroup that is gone or no longer numad's."""
        self.written.pop(path, None)
        try:
            self._end_grant(path)
        except NumadError as err:
            self.log.error("partition_end_failed", cgroup=path, problem=str(err))
        self.ensured.discard(path)
        self.drift.pop(path, None)
        for kind in ("write", "effective", "grant"):
            self.problems.clear(f"{kind}:{path}")

    def _effective(self, path: str, cpus: CPUSet, mems: NodeSet | None) -> bool:
        """Whether the kernel applies the cpuset just written, read back from the
        effective files. A write can succeed and the kernel apply another set: mems
        naming a node without memory fall back to the parent's, CPUs outside the
        parent's effective set are masked off, an offline CPU is dropped. Such a
        cgroup is logged, counted and listed in the problems until a write applies."""
        now_cpus, now_mems = self.cgroups.read_effective(path)
        key = f"effective:{path}"
        if (not cpus or cpus == now_cpus) and (not mems or mems == now_mems):
            self.problems.clear(key)
            return True
        written = [f"cpus {cpus.format_list()}"] if cpus else []
        written += [f"mems {mems.format_list()}"] if mems else []
        applied = f"cpus {now_cpus.format_list()} mems {now_mems.format_list()}"
        self.problems.set(
            key,
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

    def find_drift(self, passes: int, scan: Scan | None = None) -> int:
        """Every cpuset numad wrote that another writer changed, forgotten so the pass
        writes it again (``numad.host.drift``); the number of repairs."""
        return find_drift(self, passes, scan)


def _alive(pid: int) -> bool:
    """Whether the process runs (a zombie has exited: the kernel no longer lists it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] not in (["Z"], ["X"])
