"""Host isolation: every cgroup that is no exclusive workload's stays off exclusive CPUs.

The rule: a cgroup that holds no exclusive workload runs on the shared pool,
that is the online CPUs less every exclusive set (the reserved CPUs are in the
pool: host daemons belong there). That covers the other top-level cgroups of
the hierarchy (``system.slice``, ``user.slice``, ``init.scope``, a container
engine's tree) and the cgroups inside the managed roots that are no workload's
(``Enforcer.unmanaged``). They are written in the shared phase of
``Enforcer.apply``: shrunk before any exclusive set is granted, grown after.

``Isolation`` is the cgroup backend the enforcer writes through. Every isolated
cgroup is written in cgroupfs, at once; one that systemd owns (its unit's
ControlGroup is that path) is then given the value as its runtime ``AllowedCPUs=``
by ``numad.host.unit_record``, from a thread of its own and never under the
daemon's lock, so systemd agrees and a ``daemon-reload`` keeps it (a workload
that is a unit is written by systemd alone: ``numad.host.workload_units``). Before its
first write numad keeps the cgroup's own cpuset file in ``isolation.json`` in the
state directory (the unit's own ``AllowedCPUs=`` in ``units.json``), durably, and
on stop puts every one back. A crash keeps the files, so the next numad still
knows what to give back.

Edge module: it reads the cgroup root's listing and writes through the backends
and systemd it is given.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any

from numad.cpuset import CPUSet, NodeSet
from numad.errors import CgroupError, CheckpointError, NumadError
from numad.host import isolation_file
from numad.host.strays import below_any
from numad.host.systemd_units import Units
from numad.host.targets import Cgroups, Deferred, Log
from numad.host.unit_record import UnitRecord
from numad.host.workload_units import WorkloadUnits
from numad.observe import Problems

__all__ = ["Isolation", "Units"]


class Isolation:
    """The enforcer's cgroup backend: workloads' cgroups go to ``cgroups``; the
    cgroups numad isolates go through systemd or cgroupfs, their own setting
    kept first."""

    def __init__(
        self,
        cgroups: Cgroups,
        state_dir: Path,
        log: Log,
        *,
        systemd: Units | None = None,
        host_backend: Callable[[list[str]], Cgroups] | None = None,
        root: Path | None = None,
        v1: bool = False,
        sleep: Callable[[float], None] = time.sleep,
        problems: Problems | None = None,
    ) -> None:
        self.cgroups = cgroups
        self.state_dir = state_dir
        self.log = log
        self.host_backend = host_backend  # a backend fenced to the given top-level cgroups
        self.root = root  # the hierarchy's root directory; None: no top-level isolation
        self.v1 = v1
        self.sleep = sleep
        self.record: UnitRecord | None = None
        self.problems = problems  # where the record says what systemd lacks
        self.isolated: set[str] = set()
        self.online = CPUSet()  # the online CPUs, set by the daemon: "every CPU" on stop
        self.host: Cgroups | None = None
        self.tops: set[str] = set()
        self._fenced: dict[str, Cgroups] = {}  # top -> a backend fenced to it (``_backend``)
        self.stopping = threading.Event()  # numad stops: ``hurry``
        self.pending = threading.Event()  # set when systemd is owed a value: the unit loop
        self.workloads = WorkloadUnits(
            None,
            log,
            lambda path: self._backend(path).read(path),
            self.identity,
            v1=v1,
            sleep=sleep,
            stopping=self.stopping,
            pending=self.pending,
            problems=problems,
        )
        self.originals, self.left, self.problem = isolation_file.load(state_dir)
        self.systemd = systemd  # builds the record

    @property
    def systemd(self) -> Units | None:
        return self._systemd

    @systemd.setter
    def systemd(self, systemd: Units | None) -> None:
        """systemd's bus, or None; the record of what its units are told goes with it."""
        self._systemd = systemd
        self.workloads.systemd = systemd
        if systemd is None or self.v1:  # systemd sets cpusets only on cgroup v2
            self.record = None
            return
        self.record = UnitRecord(
            systemd,
            self.state_dir,
            self.log,
            lambda path: self._backend(path).read(path)[0],
            empty=self._empty,
            exists=self._exists,
            problems=self.problems,
            sleep=self.sleep,
            stopping=self.stopping,
            pending=self.pending,
        )
        if self.record.adopt(self.originals):  # a numad before 2026-12 told units itself
            with contextlib.suppress(CheckpointError):  # units.json has them; saved later
                self._save()

    def owed(self) -> bool:
        """Whether systemd is owed a value (``send`` has work)."""
        record = self.record
        return self.workloads.owed() or bool(record and (record.wanted or record.returning))

    def send(self) -> bool:
        """One round of the unit loop: the workloads' units, then the isolated ones; True
        when a value that may have held back a write is settled."""
        self.pending.clear()
        settled = self.workloads.send()
        return (self.record is not None and self.record.send()) or settled

    def hurry(self, seconds: float) -> None:
        """numad stops: no wait on systemd lasts past ``seconds`` from now, and a call
        under way ends at once. A unit not given its own setting back by then stays in
        units.json, and the next numad gives it back."""
        if self.stopping.is_set():
            return  # the first deadline holds
        self.stopping.set()
        if self._systemd is not None:
            self._systemd.hurry(seconds)

    # -- which cgroups ---------------------------------------------------------------------

    def top_level(self, managed_roots: Iterable[str]) -> set[str]:
        """The top-level cgroups that are neither a managed root nor above one, and on
        cgroup v1 every cgroup below them (v1 refuses a parent narrower than a child;
        v2 children can only use their parent's CPUs)."""
        if self.root is None or self.host_backend is None:
            return set()
        firsts = {r.split("/", maxsplit=1)[0] for r in managed_roots}
        marker = "tasks" if self.v1 else "cgroup.type"  # every cgroup has it; a mount point not
        turn = getattr(self.cgroups, "kernel_turn", contextlib.nullcontext)
        try:
            with turn():
                tops = sorted(
                    e.name
                    for e in os.scandir(self.root)
                    if e.is_dir(follow_symlinks=False) and os.path.isfile(Path(e.path, marker))
                )
        except OSError as err:
            raise CgroupError(str(self.root), f"cannot list the top-level cgroups: {err}") from err
        tops = [t for t in tops if t not in firsts]
        if set(tops) != self.tops:
            self.tops = set(tops)
            self.host = self.host_backend(tops) if tops else None
        found = set(tops)
        if self.v1 and self.host is not None:
            for top in tops:
                found.update(self.host.descendants(top))
        return found

    def mark(self, paths: set[str], owned: set[str]) -> list[str]:
        """The cgroups isolated from now on; returns those that left the set. One
        that left is a workload's now (``owned``: its record is dropped), above one or
        below an isolated one (cgroup v2: it gets its own setting back, so it follows
        its parent's), or gone (nothing to give back)."""
        left = sorted(self.isolated - paths)
        dropped = []
        for path in sorted(set(self.originals) - paths):
            gone = path in owned or not self._exists(path)  # not numad's to give back
            above = any(o.startswith(path + "/") for o in owned)
            bounded = not self.v1 and below_any(path, paths)
            if gone or ((above or bounded) and self._give_back(path) is None):
                dropped.append(path)
        for path in dropped:
            del self.originals[path]
        removed = [p for p in self.left if p not in paths and not self._exists(p)]
        for path in removed:  # cost: per cgroup left on every CPU (rare), not per stray
            del self.left[path]
        self.isolated = set(paths)
        if self.record is not None:
            self.record.keep_only(paths, owned, self.online)
        kept = self._keep_originals(sorted(paths - set(self.originals)))
        if dropped or kept or removed:
            try:
                self._save()
            except CheckpointError as err:  # each is kept (or refused) at its first write
                for path in kept:
                    del self.originals[path]
                self.log.warning("isolation_record_failed", problem=str(err))
        return left

    def _keep_originals(self, paths: list[str]) -> list[str]:
        """The own settings of cgroups isolated from now on, read in one batch and
        saved once by the caller (not a whole-file rewrite and fsync per cgroup): cost
        in proportion to the cgroups that are new. One that cannot be read now is
        read at its first write (``_remember``)."""
        kept = []
        for path in paths:
            try:
                self.originals[path] = self._original(path)
            except NumadError:
                continue
            kept.append(path)
        return kept

    def _exists(self, path: str) -> bool:
        try:
            return self._backend(path).exists(path)
        except NumadError:
            return True  # cannot tell: keep what must be given back

    # -- the Cgroups protocol --------------------------------------------------------------

    def _backend(self, path: str) -> Cgroups:
        top = path.split("/", maxsplit=1)[0]
        if self.host is not None and top in self.tops:
            return self.host
        if top and self.host_backend is not None and self._outside(path):
            # A released workload's cgroup under a root taken out of the config, with
            # no isolation to reach it: given back through a backend fenced to its top.
            if top not in self._fenced:
                self._fenced[top] = self.host_backend([top])
            return self._fenced[top]
        return self.cgroups

    def _outside(self, path: str) -> bool:
        roots = getattr(self.cgroups, "managed_roots", ())
        parts = tuple(path.split("/"))
        return bool(roots) and not any(parts[: len(r.parts)] == r.parts for r in roots)

    def exists(self, path: str) -> bool:
        if self.workloads.unit_of(path) is not None:
            return self.workloads.exists(path)
        return self._backend(path).exists(path)

    def identity(self, path: str) -> int | None:
        return self._backend(path).identity(path)

    def ensure(self, path: str) -> None:
        # systemd enables the controller for a workload's unit
        if self.workloads.unit_of(path) is None:
            self._backend(path).ensure(path)

    def write(self, path: str, cpus: CPUSet | None, mems: NodeSet | None) -> None:
        record = self.record if cpus and path not in self.isolated else None
        above = record.above(path, wait=True) if record is not None else None
        if above is not None:
            why = (
                f"{path}: not written yet: {above}, above it, is to get its own AllowedCPUs="
                " back from systemd first (numad had narrowed it, and systemd may write that"
                " again); written once it has"
            )
            if self.problems is not None:
                self.problems.set(f"write:{path}", why)
            raise Deferred(path, why)
        unit = self.workloads.unit_of(path)
        if unit is not None:
            self.workloads.write(path, unit, cpus, mems)  # Deferred: systemd writes it
            return
        if path not in self.isolated:
            self._backend(path).write(path, cpus, mems)
            return
        self._remember(path)
        self._backend(path).write(path, cpus, mems)
        if self.record is None or cpus is None:
            return
        self.record.want(path, cpus)
        older = self.record.may_run_on(path) - cpus
        if older:
            raise CgroupError(
                path,
                f"holds cpus {cpus.format_list()}, but systemd may still write AllowedCPUs= it"
                f" was sent before, with {older.format_list()}; those are granted once it has",
            )

    def read(self, path: str, *, mems: bool = True) -> tuple[CPUSet, NodeSet]:
        """The cgroup's configured sets, with what systemd may still write there."""
        cpus, nodes = self._backend(path).read(path, mems=mems)
        if self.record is not None and path in self.isolated:
            cpus |= self.record.may_run_on(path)
        elif self.workloads.unit_of(path) is not None:
            cpus |= self.workloads.may_run_on(path)
        return cpus, nodes

    def read_effective(self, path: str) -> tuple[CPUSet, NodeSet]:
        return self._backend(path).read_effective(path)

    def restore_cpus(self, cpus: CPUSet) -> None:
        self.cgroups.restore_cpus(cpus)

    def descendants(self, path: str, beat: Callable[[], object] | None = None) -> list[str]:
        return self._backend(path).descendants(path, beat)

    def processes(self, path: str) -> list[int]:
        backend: Any = self._backend(path)
        return list(backend.processes(path))

    def via(self, path: str) -> str:
        """How numad writes a cgroup: ``systemd UNIT`` or ``cgroupfs``."""
        unit = self.workloads.unit_of(path)
        if unit is None and self.record is not None:
            unit = self.record.unit(path)
        return f"systemd {unit}" if unit else "cgroupfs"

    # -- what to give back -----------------------------------------------------------------

    def _remember(self, path: str) -> None:
        """Keep the cgroup's own setting, durably, before numad first changes it."""
        if path in self.originals:
            return
        self.originals[path] = self._original(path)
        try:
            self._save()
        except CheckpointError as err:
            del self.originals[path]
            problem = f"cannot keep its own cpuset before changing it: {err}"
            raise CgroupError(path, problem) from err

    def _original(self, path: str) -> dict[str, str]:
        """The cgroup's own setting now: its cpuset file (a unit's own AllowedCPUs=
        is kept by the record, before it is first told another)."""
        own = self._backend(path).read(path)[0]
        if self.left.pop(path, None) == own.format_list():  # numad's every CPU: not its own
            own = CPUSet()
        return {"via": "cgroupfs", "cpus": own.format_list()}

    def _give_back(self, path: str) -> str | None:
        """Write the cgroup's own setting back; the problem if that failed. A unit's own
        AllowedCPUs= is given back by the sender, off the lock (at stop too: the stop's
        last round; above a workload's cgroup, what is written below waits for it)."""
        own = self.originals[path]
        cpus = CPUSet.parse_list(own.get("cpus", ""))
        # v2 refuses an empty cpuset.cpus in a cgroup with tasks (ENOSPC), and so
        # systemd's reset of AllowedCPUs= fails there: every CPU goes in first.
        every = cpus or self.online
        try:
            if self.record is not None:
                self.record.give_back_later([path], self.online)
            if own.get("via") == "systemd" and self.systemd is not None:  # numad before 2026-12
                self.systemd.set_allowed(own["unit"], every, None, runtime=True)
                if not cpus:  # the property unset, as before (the file keeps every CPU)
                    self.systemd.set_allowed(own["unit"], cpus, None, runtime=True)
            elif self._backend(path).exists(path) and not (not cpus and self._inherits(path)):
                self._backend(path).write(path, every, None)
                if not cpus and not self.v1 and not self._empty(path):  # tasks: ENOSPC
                    self.left[path] = every.format_list()  # still none of its own
        except NumadError as err:
            return f"{path}: cannot give its cpuset back: {err}"
        self.log.info("cgroup_isolation_ended", cgroup=path, cpus=own.get("cpus") or "all")
        return None

    def _inherits(self, path: str) -> bool:
        """Empty the cgroup's cpuset.cpus straight away where the kernel allows it (no
        tasks, v2): every CPU is not written first, which a partition beside it refuses."""
        unit = self.record.unit(path) if self.record is not None else None
        return not self.v1 and unit is None and self._empty(path)

    def _empty(self, path: str) -> bool:
        """Empty the cgroup's cpuset.cpus (it inherits its parent's again); False
        where the kernel refuses: v2 does for a cgroup with tasks (ENOSPC)."""
        try:
            self._backend(path).write(path, CPUSet(), None)
        except NumadError:
            return False
        return True

    def _save(self) -> None:
        isolation_file.save(self.state_dir, self.originals, self.left)

    def restore(self, keep: Collection[str] = ()) -> list[str]:
        """Give every isolated cgroup but ``keep`` its own setting back; returns the
        problems (a cgroup that is gone has nothing to give back). The record keeps
        only those that could not be given back, and ``keep``, so a later call (or
        numad) tries them again and not every other one: with isolation off or
        partitions, each pass calls this."""
        problems = []
        failed = {p: self.originals[p] for p in keep if p in self.originals}
        for path in sorted(set(self.originals) - set(keep)):
            problem = self._give_back(path)
            if problem:
                problems.append(problem)
                failed[path] = self.originals[path]
        if self.record is not None and not keep:  # units told, though no longer isolated
            self.record.give_back_later(list(self.record.told), self.online)
        if failed != self.originals:
            self.originals = failed
            try:
                self._save()
            except CheckpointError as err:  # the cgroups are back: only the record stays
                problems.append(
                    f"the isolation record still lists them (the next numad rechecks): {err}"
                )
        self.isolated = set(keep)
        return problems
