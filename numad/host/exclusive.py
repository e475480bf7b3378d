"""Exclusive sets as cgroup v2 remote partitions (``[host] partitions``).

A valid partition takes its CPUs out of the root cgroup's effective set, and so out
of every cgroup outside it: no other cgroup is written, however many there are, and
a cgroup made later never has them. numad makes each exclusive grant a partition:
the workload cgroup's ``cpuset.cpus.exclusive`` is its CPUs, every level above it
(from the top-level cgroup down) names the exclusive CPUs of the partitions below
it, and its ``cpuset.cpus.partition`` is ``root``. The kernel refuses exclusive
CPUs that a sibling names, so two partitions never share a CPU whatever numad does;
the enforcer still orders the grants as without partitions (a CPU is given up
before it is granted elsewhere), and each level gives CPUs up before any level
takes them.

A workload booked but not there (a unit not started, a cgroup not made yet) has no
cgroup to make a partition of: numad's own cgroup ``HOLDER`` in the first managed
root holds its CPUs as a partition meanwhile, and gives them up before the
workload's cgroup takes them (the enforcer's grant order).

A partition the kernel does not take (``root invalid (why)``) is a problem under
the cgroup's name, retried every pass: its CPUs are then not exclusive. Where a
grant ends (a release, a shared write, the cgroup gone) the partition is dissolved
and the levels above give its CPUs up. Cost: per grant, a read and at most two
writes per level above it, and a union over the grants; nothing per other cgroup.

Where: ``[host] partitions = "auto"`` (the default) makes them where the kernel
offers them and numad holds CAP_SYS_ADMIN, the kernel's check (``partitions``);
``true`` tries them whatever numad's capabilities, so the kernel's refusal is
reported; ``false`` never, and dissolves a previous numad's (``leftover_partitions``).

Edge module: writes only through the v2 backend it is given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Protocol

from numad.cpuset import CPUSet, NodeSet
from numad.errors import CgroupError
from numad.host.cgroup.v2 import CgroupV2Backend
from numad.host.targets import Target
from numad.observe import Problems

HOLDER = "numad-held"  # in the first managed root


class PartitionBackend(Protocol):
    def partition(self, path: str) -> tuple[CPUSet, str]: ...
    def write_exclusive(self, path: str, cpus: CPUSet) -> None: ...
    def write_partition(self, path: str, state: str) -> None: ...
    def exists(self, path: str) -> bool: ...
    def read(self, path: str) -> tuple[CPUSet, NodeSet]: ...
    def descendants(self, path: str) -> list[str]: ...


class Partitions:
    """Grants made and ended as remote partitions, through ``backend``."""

    def __init__(self, backend: PartitionBackend, holder: str) -> None:
        self.backend = backend
        self.holder = holder  # numad's own cgroup, holding the sets of workloads not there
        # Cgroups beside a partition whose own cpuset.cpus names its CPUs: the kernel
        # leaves the partition invalid while they do, so numad isolates them one by one.
        self.clashes: set[str] = set()
        # Why the kernel refuses numad any partition (it lacks CAP_SYS_ADMIN); the
        # enforcer then isolates cgroup by cgroup for the rest of the run.
        self.refused: str | None = None

    def grant(self, path: str, cpus: int, grants: Mapping[str, int]) -> None:
        """Make ``path`` a partition of ``cpus`` (``grants``: every grant, this one
        included); CgroupError where the kernel refuses it or leaves it invalid."""
        want = CPUSet.from_bits(cpus)
        try:
            have, state = self.backend.partition(path)
            if have - want:  # the CPUs it gives up first, so that the levels above can
                self.backend.write_exclusive(path, have & want)
            self._levels(path, grants)
            if have != want:
                self.backend.write_exclusive(path, want)
            if state != "root":
                self.backend.write_partition(path, "root")
            now, state = self.backend.partition(path)
        except CgroupError as err:
            raise CgroupError(
                path, f"making it a partition of cpus {want.format_list()}: {err}"
            ) from err
        if "not permitted" in state:  # the kernel's check for CAP_SYS_ADMIN
            self.refused = (
                f"the kernel refuses numad cpuset partitions ({state!r} at {path}):"
                " numad lacks CAP_SYS_ADMIN. The shipped unit grants it, so a drop-in may have"
                ' taken it away: give it back, or set [host] partitions = "auto"'
            )
            raise CgroupError(path, self.refused)
        if "not exclusive" in state:
            found = self._clashing(path, want, grants)
            if found - self.clashes:
                self.clashes |= found
                raise CgroupError(
                    path,
                    f"the kernel did not make it a partition of cpus {want.format_list()}:"
                    f" {len(found)} cgroup(s) beside it name them in cpuset.cpus"
                    f" ({', '.join(sorted(found)[:5])}); numad isolates those one by one",
                )
        if state != "root" or now != want:
            raise CgroupError(
                path,
                f"the kernel did not make it a partition of cpus {want.format_list()}"
                f" (cpuset.cpus.partition: {state!r}); its CPUs are not exclusive",
                "look for exclusive CPUs that a cgroup beside it or above it names",
            )

    def _clashing(self, path: str, cpus: CPUSet, grants: Mapping[str, int]) -> set[str]:
        """The cgroups beside ``path`` (its parent's children) whose own cpuset.cpus
        names any of ``cpus``: a partition's siblings may not (the kernel's rule for an
        exclusive cpuset). Cost: a walk below the parent, only once a partition came
        out invalid for it."""
        parent, _, _ = path.rpartition("/")
        depth = path.count("/")
        found = set()
        for other in self.backend.descendants(parent) if parent else []:
            if other.count("/") != depth or other in grants or other in (path, self.holder):
                continue
            try:
                if self.backend.read(other)[0] & cpus:
                    found.add(other)
            except CgroupError:
                continue  # gone meanwhile
        return found

    def end(self, path: str, grants: Mapping[str, int], *, known: bool = True) -> None:
        """Dissolve ``path``'s partition (if the cgroup is still there) and give its
        CPUs up at every level above it (``grants``: every grant left). ``known=False``:
        numad recorded no grant there (a cgroup it no longer writes, or one a killed
        numad left): only a partition found there is dissolved, and a fault is ignored."""
        try:
            there = self.backend.exists(path)
            have, state = self.backend.partition(path) if there else (CPUSet(), "member")
        except CgroupError:
            if known:
                raise
            return
        if not known and state == "member" and not have:
            return  # nothing of numad's there
        if state != "member":
            self.backend.write_partition(path, "member")
        if have:
            self.backend.write_exclusive(path, CPUSet())
        self._levels(path, grants)

    def end_all(self, grants: Mapping[str, int]) -> list[str]:
        """Every partition dissolved (numad stops, or starts without partitions): those
        of the grants and the holding cgroup's; what failed, per cgroup."""
        left, failed = dict(grants), []
        for path in sorted({*grants, self.holder}):
            left.pop(path, None)
            try:
                self.end(path, left, known=path in grants)
            except CgroupError as err:
                failed.append(str(err))
        return failed

    def holding(
        self,
        wanted: list[Target],
        absent: list[Target],
        pool: int,
        grants: MutableMapping[str, int],
        ensure: Callable[[str], None],
    ) -> list[Target]:
        """``wanted`` with the holding cgroup in place of the exclusive sets whose
        cgroup is not there (``absent``): it holds their CPUs, made first (``ensure``);
        with none absent, a holding cgroup still granted gives its CPUs back. One left
        by a numad killed before it recorded the grant is taken into ``grants``."""
        if self.holder not in grants and self.backend.exists(self.holder):
            have, _ = self.backend.partition(self.holder)
            if have:
                grants[self.holder] = have.bits
        cpus = 0
        for t in absent:
            cpus |= t.cpus
        if cpus:
            ensure(self.holder)
            kept = [t for t in wanted if t not in absent]
            return [Target(self.holder, cpus, None, exclusive=True), *kept]
        if self.holder in grants:
            return [Target(self.holder, pool, None, exclusive=False), *wanted]
        return wanted

    def holds(self, path: str, cpus: int) -> bool:
        """Whether ``path`` is a valid partition of ``cpus`` now."""
        try:
            have, state = self.backend.partition(path)
        except CgroupError:
            return False
        return state == "root" and have.bits == cpus

    def view(self, grants: Mapping[str, int]) -> list[dict[str, str]]:
        """Each grant's partition as the kernel holds it (``numad host``)."""
        out = []
        for path, cpus in sorted(grants.items()):
            try:
                have, state = self.backend.partition(path)
                named = have.format_list()
            except CgroupError as err:
                named, state = "", f"unreadable: {err}"
            granted = CPUSet.from_bits(cpus).format_list()
            out.append({"cgroup": path, "cpus": granted, "exclusive": named, "state": state})
        return out

    def _levels(self, path: str, grants: Mapping[str, int]) -> None:
        """Each level above ``path`` names exactly the grants below it: first every
        level gives up what it names no more (deepest first, as a child's exclusive
        CPUs must stay inside its parent's), then every level takes what it lacks
        (top first)."""
        parts = path.split("/")
        levels = ["/".join(parts[:depth]) for depth in range(1, len(parts))]
        want = {level: _below(level, grants) for level in levels}
        have = {level: self.backend.partition(level)[0] for level in levels}
        for level in reversed(levels):
            kept = have[level] & want[level]
            if kept != have[level]:
                self.backend.write_exclusive(level, kept)
                have[level] = kept
        for level in levels:
            if have[level] != want[level]:
                self.backend.write_exclusive(level, want[level])


def _below(level: str, grants: Mapping[str, int]) -> CPUSet:
    prefix = level + "/"
    found = 0
    for path, cpus in grants.items():
        if path.startswith(prefix):
            found |= cpus
    return CPUSet.from_bits(found)


CAP_SYS_ADMIN = 21  # the kernel's check to make a partition (linux/capability.h)
NOT_OFFERED = (
    "this kernel offers no cpuset partitions (cgroup v2 with cpuset.cpus.exclusive, Linux 6.7"
    " or later; numad's rules are 6.11's)"
)


def partitions(
    cgroups: object, health: Problems, *, asked: bool, capable: Callable[[], bool] | None = None
) -> tuple[Partitions | None, str]:
    """Grants as partitions where the kernel offers them, and how numad isolates and
    why. ``asked`` (``[host] partitions = true``): one not offered is a health problem,
    and numad tries them whatever its capabilities (the kernel's refusal is reported).
    Else ("auto") only where numad holds CAP_SYS_ADMIN (``capable``), which the kernel
    asks for; an emulated kernel does not."""
    if not (isinstance(cgroups, CgroupV2Backend) and cgroups.partitions_offered()):
        if asked:
            health.set(
                "partitions",
                f"[host] partitions = true, but {NOT_OFFERED}: numad isolates every other"
                " cgroup one by one instead",
            )
        return None, f"one by one: {NOT_OFFERED}"
    health.clear("partitions")
    if not (asked or cgroups.emulate_kernel or (capable or holds_cap_sys_admin)()):
        return None, (
            "one by one: numad lacks CAP_SYS_ADMIN, which the kernel asks to make a"
            " partition (the unit's CapabilityBoundingSet=)"
        )
    return Partitions(cgroups, f"{cgroups.managed_roots[0]}/{HOLDER}"), "partitions"


def holds_cap_sys_admin(status: Path = Path("/proc/self/status")) -> bool:
    """Whether this process's effective capabilities hold CAP_SYS_ADMIN."""
    try:
        for line in status.read_text().splitlines():
            if line.startswith("CapEff:"):
                return bool(int(line.split()[1], 16) >> CAP_SYS_ADMIN & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def leftover_partitions(cgroups: object, active: bool, grants: Mapping[str, int]) -> list[str]:
    """numad starts without partitions on a kernel that offers them: any a numad made
    before (killed, or run with ``[host] partitions``) is dissolved, so nothing keeps
    CPUs out of the cgroups numad now isolates one by one. Cost: a read per grant."""
    if active or not isinstance(cgroups, CgroupV2Backend) or not cgroups.partitions_offered():
        return []
    return Partitions(cgroups, f"{cgroups.managed_roots[0]}/{HOLDER}").end_all(grants)
