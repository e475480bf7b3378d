"""Drift: a cpuset numad wrote, changed since by another writer (an admin, a
service manager, a container runtime), found by reading it back each pass, and
as it happens for the workloads' cgroups (``drifted``: inotify told of a write).

Host side; works on the enforcer's memory of what it wrote (``numad.host.enforce``).
Cost: one read per cgroup numad wrote (made by the pass's scan before the lock),
and per exclusive grant kept as a partition one read of its partition file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from numad.cpuset import CPUSet, NodeSet
from numad.errors import CgroupError, NumadError
from numad.host.cgroup.hierarchy import BEAT_EVERY
from numad.host.exclusive import Partitions
from numad.host.targets import Cgroups, Log, Moves, Scan
from numad.observe import EnforcementCounters

# The repair in a row from which a cgroup that keeps drifting is repaired less and less
# often: that one waits 2 passes, the next 4, ... up to 64 (``find_drift``). A write seen
# as it happens (``drifted``) wakes no pass for a cgroup whose next repair would wait.
BACKOFF_FROM = 3


class Enforcer(Protocol):
    """What drift is found on (``numad.host.enforce.Enforcer``)."""

    cgroups: Cgroups
    beat: Callable[[], object]
    metrics: EnforcementCounters
    log: Log
    written: dict[str, tuple[int, NodeSet | None]]
    drift: dict[str, tuple[int, int]]
    grants: dict[str, int]
    moves: Moves | None
    partitions: Partitions | None


def scan(enforcer: Enforcer, roots: Iterable[str], pause: Callable[[], object]) -> Scan:
    """The managed trees listed, and every cgroup numad wrote read back (reads only).
    Every ``BEAT_EVERY`` cgroups walked or read the watchdog hears the pass advance,
    and ``pause`` runs: a change under way meanwhile goes first. Cost: a listing per
    parent cgroup, an lstat per other, a read per cgroup numad wrote."""

    def beat() -> None:
        enforcer.beat()
        pause()

    listing: dict[str, list[str] | NumadError] = {}
    for root in roots:
        try:
            listing[root] = enforcer.cgroups.descendants(root, beat)
        except NumadError as err:
            listing[root] = err
    reads: dict[str, tuple[tuple[int, NodeSet | None], tuple[CPUSet, NodeSet] | None]] = {}
    for done, (path, value) in enumerate(list(enforcer.written.items()), 1):
        if done % BEAT_EVERY == 0:
            beat()
        try:  # the memory numad leaves alone (value[1] None) is not read
            reads[path] = (value, enforcer.cgroups.read(path, mems=value[1] is not None))
        except NumadError:
            reads[path] = (value, None)
    return Scan(listing, reads)


def find_drift(enforcer: Enforcer, passes: int, scan: Scan | None = None) -> int:
    """Every cpuset numad wrote, as read back (by ``scan`` before the lock, where
    given: a cgroup written since is left to the next pass); one another writer
    changed is forgotten, so the pass writes it again, and counted. A cgroup that
    keeps drifting is repaired less and less often (up to every 64th pass) instead
    of fighting the other writer. Returns the number of repairs."""
    repairs = 0
    reads = scan.reads if scan is not None else None
    for path, (cpus, wanted) in list(enforcer.written.items()):
        try:
            if reads is None:
                now: tuple[CPUSet, NodeSet] | None = enforcer.cgroups.read(
                    path, mems=wanted is not None
                )
            elif path in reads and reads[path][0] == (cpus, wanted):
                now = reads[path][1]
            else:
                continue  # written since the scan read it
            if now is None:
                raise CgroupError(path, "unreadable when scanned")
            now_cpus, now_mems = now
        except NumadError:
            enforcer.written.pop(path, None)  # gone or unreadable: rewrite if it is back
            continue
        if _holds(enforcer, path, (cpus, wanted), (now_cpus, now_mems)):
            enforcer.drift.pop(path, None)
            continue
        count, due = enforcer.drift.get(path, (0, 0))
        if passes < due:
            continue  # backing off
        count += 1
        wait = 0 if count < BACKOFF_FROM else min(64, 2 ** (count - BACKOFF_FROM + 1))
        enforcer.drift[path] = (count, passes + wait)
        enforcer.written.pop(path)
        enforcer.metrics.drift_repairs.inc()
        repairs += 1
        enforcer.log.warning(
            "cpuset_drift_repaired",
            cgroup=path,
            found=now_cpus.format_list(),
            wanted=CPUSet.from_bits(cpus).format_list(),
            in_a_row=count,
            next_repair_in_passes=wait,
        )
    return repairs


def drifted(enforcer: Enforcer, paths: Iterable[str]) -> list[str]:
    """Those of ``paths`` (cgroups whose cpuset files were just written: inotify) that
    no longer hold what numad wrote there: another writer's change, such as a
    ``daemon-reload`` writing a unit's own ``AllowedCPUs=`` back. Reads only: the
    caller wakes a pass, which repairs. A cgroup repaired twice in a row without a
    clean pass between is left to the passes' backoff (a writer fighting numad gets
    no pass per write). Cost: two reads per path."""
    found = []
    for path in sorted(paths):
        value = enforcer.written.get(path)
        if value is None or enforcer.drift.get(path, (0, 0))[0] + 1 >= BACKOFF_FROM:
            continue  # not numad's to hold (or to be written anyway), or backing off
        try:
            now = enforcer.cgroups.read(path, mems=value[1] is not None)
        except NumadError:
            continue  # gone or unreadable: its removal is an event of its own
        if not _holds(enforcer, path, value, now):
            found.append(path)
    return found


def _holds(
    enforcer: Enforcer, path: str, value: tuple[int, NodeSet | None], now: tuple[CPUSet, NodeSet]
) -> bool:
    """Whether a cgroup read back as ``now`` still holds what numad wrote (``value``)."""
    cpus, wanted = value
    # The mover has yet to write the mems: only the CPUs are numad's yet.
    moving = enforcer.moves is not None and enforcer.moves.drifting(path)
    mems = None if moving else wanted
    now_cpus, now_mems = now
    same = now_cpus.bits == cpus and (mems is None or now_mems == mems)
    return same and not _lost(enforcer, path, cpus)


def _lost(enforcer: Enforcer, path: str, cpus: int) -> bool:
    """Whether the cgroup's grant should be a partition and is not (undone by
    another writer, or the kernel dissolved it)."""
    partitions = enforcer.partitions
    return partitions is not None and path in enforcer.grants and not partitions.holds(path, cpus)
