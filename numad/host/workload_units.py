"""Workloads that are systemd units themselves (``unit = "…"``, ``numad run``):
their placement is written through systemd, as runtime ``AllowedCPUs=`` and
``AllowedMemoryNodes=``, and numad waits until systemd has written the files (the
enforcer's order, shrink before granting, holds only once the kernel has it). A
unit not running gets its placement preset, applied from its next start.

These D-Bus calls are made under the daemon's lock, at admission and when such a
workload's cgroup appears; bounded by the bus's timeout and backoff
(``numad.host.systemd_bus``). Cost: per workload unit, nothing per other cgroup.
Edge module: it writes only through the systemd it is given.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterable

from numad.cpuset import CPUSet, NodeSet
from numad.errors import CgroupError, NumadError
from numad.host.targets import Log, Target
from numad.host.unit_record import APPLY_SECONDS, Units, settle


class WorkloadUnits:
    """The workloads' units (cgroup -> unit) and what each was preset to."""

    def __init__(
        self,
        systemd: Units | None,
        log: Log,
        read: Callable[[str], tuple[CPUSet, NodeSet]],
        *,
        v1: bool = False,
        sleep: Callable[[float], None] = time.sleep,
        stopping: threading.Event | None = None,
    ) -> None:
        self.systemd = systemd
        self.stopping = stopping or threading.Event()  # numad stops: no more waiting
        self.log = log
        self.read = read  # a cgroup's configured sets, as the kernel holds them
        self.v1 = v1
        self.sleep = sleep
        self.units: dict[str, str] = {}  # a workload's cgroup -> its unit (spec.unit)
        self.presets: dict[str, tuple[int, NodeSet | None]] = {}  # set while not running

    def own(self, units: dict[str, str], orphans: Collection[str]) -> None:
        """The workloads' units (their cgroup -> unit, from the specs), written through
        systemd; a released unit stays so while its cgroup is an orphan (it is given the
        shared pool). One that is neither any more has its runtime settings reset, so
        its next start does not bring back a placement numad no longer holds."""
        for path, unit in self.units.items():
            if path in units or path in orphans or self.systemd is None or self.v1:
                continue
            try:
                self.systemd.set_allowed(unit, CPUSet(), NodeSet(), runtime=True)
            except NumadError as err:
                self.log.warning("unit_reset_failed", unit=unit, problem=str(err))
        kept = {p: u for p, u in self.units.items() if p in orphans}
        self.units = kept | units
        self.presets = {p: v for p, v in self.presets.items() if p in units}

    def preset(self, wanted: Iterable[Target], exists: Callable[[str], bool]) -> None:
        """A workload unit that is not running gets its placement as runtime properties
        now, so that systemd applies it from the first instant of its next start (the
        enforcer writes only cgroups that exist)."""
        for t in wanted:
            unit = self.unit_of(t.path)
            if unit is None or self.presets.get(t.path) == (t.cpus, t.mems):
                continue
            assert self.systemd is not None
            try:
                if exists(t.path):
                    continue
                self.systemd.set_allowed(unit, CPUSet.from_bits(t.cpus), t.mems, runtime=True)
            except NumadError as err:
                self.log.warning("unit_preset_failed", unit=unit, problem=str(err))
                continue
            self.presets[t.path] = (t.cpus, t.mems)

    def runs_in(self, unit: str, path: str) -> bool:
        """Whether the unit runs in cgroup ``path``, as systemd says. Not whether the
        directory is there: a cgroup the kernel would not remove at a stop (busy with
        exiting tasks) stays behind, and systemd applies nothing to it."""
        assert self.systemd is not None
        try:  # a stopped unit may be unloaded (systemd's GC): it runs nowhere then
            loaded = self.systemd.unit(unit) is not None
            return loaded and self.systemd.control_group(unit) == "/" + path
        except NumadError as err:
            raise CgroupError(path, f"cannot ask systemd about {unit}: {err}") from err

    def unit_of(self, path: str) -> str | None:
        """The workload's unit, where numad writes it through systemd (v2 only)."""
        if self.systemd is None or self.v1:
            return None
        return self.units.get(path)

    def set(
        self,
        path: str,
        unit: str,
        cpus: CPUSet | None,
        mems: NodeSet | None,
        exists: Callable[[str], bool],
    ) -> None:
        """AllowedCPUs= (and AllowedMemoryNodes=) at runtime, then wait until systemd
        has written the files: the enforcer's order (shrink before granting) holds only
        once the kernel has it. A unit not running gets them when it starts."""
        assert self.systemd is not None
        try:
            self.systemd.set_allowed(unit, cpus, mems, runtime=True)
        except NumadError as err:
            raise CgroupError(path, f"systemd refused AllowedCPUs= for {unit}: {err}") from err
        if cpus is None or not exists(path):
            return
        now = (CPUSet(), NodeSet())

        def done() -> bool:
            nonlocal now
            try:
                now = self.read(path)
            except NumadError:
                now = (CPUSet(), NodeSet())  # systemd may drop the controller
            return now[0] == cpus and mems in (None, now[1])

        if settle(done, self.sleep, APPLY_SECONDS, self.stopping):
            return
        if self.stopping.is_set():
            raise CgroupError(path, f"numad is stopping: not waiting for systemd to apply {unit}")
        asked = f"AllowedCPUs={cpus.format_list()}"
        held = f"cpuset.cpus {now[0].format_list() or 'empty'}"
        if mems is not None:
            asked += f" AllowedMemoryNodes={mems.format_list()}"
            held += f", cpuset.mems {now[1].format_list() or 'empty'}"
        raise CgroupError(
            path,
            f"systemd accepted {asked} for {unit} but the cgroup holds {held}"
            f" after {APPLY_SECONDS:.0f} s",
        )
