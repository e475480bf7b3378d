"""Workloads that are systemd units themselves (``unit = "…"``, ``numad run``):
their placement is written through systemd, as runtime ``AllowedCPUs=`` and
``AllowedMemoryNodes=``, never under the daemon's lock.

Under the lock the enforcer only asks (``write``: memory, and a read of the
cgroup's files); the write is ``Deferred``. A sender (``send``: the unit loop,
and an API request after the lock, so its answer comes once systemd has it)
sets the properties and waits until systemd has written the files; the enforcer
then writes what waited on it. Until a value is written, the cgroup may run on it
and on every value sent before (``may_run_on``), so the enforcer's order (shrink
before granting) holds: an exclusive set another cgroup may still run on is not
granted. A unit not running gets its placement as a preset, applied by systemd
from its next start; a released one has its settings reset.

A failing or slow systemd is a health problem, retried by the unit loop with the
bus's timeout and backoff (``numad.host.systemd_bus``). Cost: per workload unit
whose value changed, nothing per other cgroup. Edge module: it writes only
through the systemd it is given.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable
from typing import NamedTuple

from numad.cpuset import CPUSet, NodeSet
from numad.errors import CgroupError, NumadError
from numad.host.systemd_units import APPLY_SECONDS, Units, settle
from numad.host.targets import Deferred, Log, Target
from numad.observe import Problems


class Want(NamedTuple):
    """A value for systemd to hold for a unit (both empty: its settings reset)."""

    unit: str
    cpus: CPUSet | None
    mems: NodeSet | None

    @property
    def reset(self) -> bool:
        return self.cpus == CPUSet() and self.mems == NodeSet()

    def asked(self) -> str:
        if self.reset:
            return "no AllowedCPUs= nor AllowedMemoryNodes="
        text = f"AllowedCPUs={self.cpus.format_list()}" if self.cpus is not None else ""
        if self.mems is not None:
            text += f" AllowedMemoryNodes={self.mems.format_list()}"
        return text.strip()


class WorkloadUnits:
    """The workloads' units (cgroup -> unit), what systemd is to hold for each, and
    what it was told. The daemon's side touches memory only (under a lock of its
    own); the sender's makes the D-Bus calls, one round at a time."""

    def __init__(
        self,
        systemd: Units | None,
        log: Log,
        read: Callable[[str], tuple[CPUSet, NodeSet]],
        identity: Callable[[str], int | None],
        *,
        v1: bool = False,
        sleep: Callable[[float], None] = time.sleep,
        stopping: threading.Event | None = None,
        pending: threading.Event | None = None,
        problems: Problems | None = None,
    ) -> None:
        self.systemd = systemd
        self.stopping = stopping or threading.Event()  # numad stops: no more waiting
        self.pending = pending or threading.Event()  # set by the daemon's side: work to send
        self.problems = problems or Problems()  # "systemd:PATH": what systemd lacks
        self.log = log
        self.read = read  # a cgroup's configured sets, as the kernel holds them
        self.identity = identity  # a cgroup directory's inode, None when absent
        self.v1 = v1
        self.sleep = sleep
        self.lock = threading.Lock()  # the daemon's side and the sender's, briefly
        self.round = threading.Lock()  # one sender at a time
        self.units: dict[str, str] = {}  # a workload's cgroup -> its unit (spec.unit)
        self.wanted: dict[str, Want] = {}  # cgroup -> the value to tell systemd next
        self.told: dict[str, tuple[CPUSet | None, NodeSet | None]] = {}  # and written
        self.sending: dict[str, CPUSet] = {}  # cgroup -> CPUs sent, maybe not written yet
        self.stale: dict[str, int | None] = {}  # a directory the unit does not run in

    # -- the daemon's side: memory only ----------------------------------------------------

    def own(self, units: dict[str, str], orphans: Collection[str]) -> None:
        """The workloads' units (their cgroup -> unit, from the specs); a released unit
        stays so while its cgroup is an orphan (it is given the shared pool). One that
        is neither any more has its runtime settings reset, so its next start does not
        bring back a placement numad no longer holds."""
        with self.lock:
            for path, unit in self.units.items():
                if path in units or path in orphans or self.systemd is None or self.v1:
                    continue
                self.wanted[path] = Want(unit, CPUSet(), NodeSet())
                self.pending.set()
            self.units = {p: u for p, u in self.units.items() if p in orphans} | units

    def unit_of(self, path: str) -> str | None:
        """The workload's unit, where numad writes it through systemd (v2 only)."""
        if self.systemd is None or self.v1:
            return None
        return self.units.get(path)

    def exists(self, path: str) -> bool:
        """Whether the unit's cgroup is there to write: not a directory the kernel kept
        at a stop (busy with exiting tasks), where systemd applies nothing, as the
        sender last found (a cgroup made again has another inode)."""
        found = self.identity(path)
        with self.lock:
            return found is not None and self.stale.get(path) != found

    def write(self, path: str, unit: str, cpus: CPUSet | None, mems: NodeSet | None) -> None:
        """Done when systemd was told this value and the cgroup holds it; else asked of
        the sender, and ``Deferred`` (the enforcer writes what waits on it after)."""
        want = Want(unit, cpus, mems)
        with self.lock:
            told = self._told(path, want)
        if told and self._holds(path, want):
            return
        with self.lock:
            self.wanted[path] = want
        self.pending.set()
        raise Deferred(path, f"{unit}: systemd is to apply {want.asked()} (after the lock)")

    def preset(self, wanted: Iterable[Target]) -> None:
        """A workload unit that is not running gets its placement as runtime properties,
        so that systemd applies it from the first instant of its next start (the
        enforcer writes only cgroups that exist)."""
        for t in wanted:
            unit = self.unit_of(t.path)
            if unit is None or self.exists(t.path):
                continue
            want = Want(unit, CPUSet.from_bits(t.cpus), t.mems)
            with self.lock:
                if not self._told(t.path, want) and self.wanted.get(t.path) != want:
                    self.wanted[t.path] = want
                    self.pending.set()

    def _told(self, path: str, want: Want) -> bool:
        """Whether systemd holds ``want`` and nothing else is asked of it (under the lock)."""
        cpus, mems = self.told.get(path, (None, None))
        if path in self.wanted or (cpus is None and mems is None):
            return False
        return want.cpus in (None, cpus) and want.mems in (None, mems)

    def may_run_on(self, path: str) -> CPUSet:
        """The CPUs systemd was sent for ``path`` and may not have written yet."""
        with self.lock:
            return self.sending.get(path, CPUSet())

    def owed(self) -> bool:
        with self.lock:
            return bool(self.wanted)

    # -- the sender's side: D-Bus, never under the daemon's lock ---------------------------

    def send(self) -> bool:
        """One round: each value asked for to its unit, waiting until systemd wrote it
        where the unit runs. True when one was written (what waited on it can go on)."""
        with self.round:
            with self.lock:
                batch = sorted(self.wanted.items())
            written = False
            for path, want in batch:
                try:
                    written |= self._send(path, want)
                except NumadError as err:
                    if want.reset and self._unknown(want.unit):
                        self._drop(path, want)  # no unit left to reset
                        continue
                    problem = f"{path}: systemd lacks {want.unit}'s placement yet: {err}; retried"
                    self.problems.set(f"systemd:{path}", problem)
                    self.log.warning("unit_placement_failed", unit=want.unit, problem=str(err))
                    continue
                self.problems.clear(f"systemd:{path}")
            return written

    def _send(self, path: str, want: Want) -> bool:
        assert self.systemd is not None
        with self.lock:
            if want.cpus:  # from now on systemd may write it
                self.sending[path] = self.sending.get(path, CPUSet()) | want.cpus
        try:  # a failure keeps it in ``sending``: a call that timed out may still land
            self.systemd.set_allowed(want.unit, want.cpus, want.mems, runtime=True)
        except NumadError as err:
            problem = f"systemd refused {want.asked()} for {want.unit}: {err}"
            raise CgroupError(path, problem) from err
        running = not want.reset and self._runs_in(want.unit, path)
        if running and not self._applied(path, want):
            return False  # a newer value is wanted: sent next, this one may still land
        with self.lock:
            if self.wanted.get(path) != want:
                return False
            del self.wanted[path]
            self.sending.pop(path, None)  # systemd takes calls in order: none left to land
            self.stale.pop(path, None)
            if want.reset:
                self.told.pop(path, None)
                return False
            cpus, mems = self.told.get(path, (None, None))  # a mems-only write keeps cpus
            self.told[path] = (
                want.cpus if want.cpus is not None else cpus,
                want.mems if want.mems is not None else mems,
            )
        if not running:
            found = self.identity(path)
            with self.lock:
                self.stale[path] = found
        return True

    def _unknown(self, unit: str) -> bool:
        """Whether systemd knows no such unit now (its file removed): nothing to reset."""
        try:
            return self.systemd is not None and self.systemd.unit(unit) is None
        except NumadError:
            return False

    def _drop(self, path: str, want: Want) -> None:
        with self.lock:
            if self.wanted.get(path) == want:
                del self.wanted[path]
            self.told.pop(path, None)
            self.sending.pop(path, None)
        self.problems.clear(f"systemd:{path}")
        self.log.info("unit_reset_skipped", unit=want.unit, why="systemd has no such unit")

    def _runs_in(self, unit: str, path: str) -> bool:
        """Whether the unit runs in cgroup ``path``, as systemd says. Not whether the
        directory is there: a cgroup the kernel would not remove at a stop stays
        behind, and systemd applies nothing to it."""
        assert self.systemd is not None
        try:  # a stopped unit may be unloaded (systemd's GC): it runs nowhere then
            loaded = self.systemd.unit(unit) is not None
            return loaded and self.systemd.control_group(unit) == "/" + path
        except NumadError as err:
            raise CgroupError(path, f"cannot ask systemd about {unit}: {err}") from err

    def _holds(self, path: str, want: Want) -> bool:
        try:
            cpus, mems = self.read(path)
        except NumadError:
            return False  # systemd may drop the controller
        return want.cpus in (None, cpus) and want.mems in (None, mems)

    def _applied(self, path: str, want: Want) -> bool:
        """Wait until systemd has written the value (it does so after answering); False
        as soon as a newer value is wanted instead."""
        newer = False

        def done() -> bool:
            nonlocal newer
            if self._holds(path, want):
                return True
            with self.lock:
                newer = self.wanted.get(path) != want
            return newer

        if settle(done, self.sleep, APPLY_SECONDS, self.stopping):
            return not newer
        if self.stopping.is_set():
            problem = f"numad is stopping: not waiting for systemd to apply {want.unit}"
            raise CgroupError(path, problem)
        try:
            cpus, mems = self.read(path)
            held = f"cpuset.cpus {cpus.format_list() or 'empty'}"
            held += f", cpuset.mems {mems.format_list() or 'empty'}" if want.mems else ""
        except NumadError as err:
            held = f"no readable cpuset ({err})"
        raise CgroupError(
            path,
            f"systemd accepted {want.asked()} for {want.unit} but the cgroup holds {held}"
            f" after {APPLY_SECONDS:.0f} s",
        )
