"""What enforcement works on: the cgroup backend's and the memory mover's protocols,
the targets (what each cgroup must hold, in write order) and a pass's scan.

Host side, shared by ``numad.host.enforce`` (which writes) and the modules that
hand it cgroups (isolation, the daemon's commits). Reads nothing itself.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from numad.cpuset import CPUSet, NodeSet
from numad.errors import CgroupError, NumadError
from numad.placement.admission import Books, placements
from numad.workload.shape import WorkloadSpec


class Cgroups(Protocol):
    def exists(self, path: str) -> bool: ...
    def identity(self, path: str) -> int | None: ...
    def ensure(self, path: str) -> None: ...
    def write(self, path: str, cpus: CPUSet | None, mems: NodeSet | None) -> None: ...
    def read(self, path: str, *, mems: bool = True) -> tuple[CPUSet, NodeSet]: ...
    def read_effective(self, path: str) -> tuple[CPUSet, NodeSet]: ...
    def restore_cpus(self, cpus: CPUSet) -> None: ...
    def descendants(self, path: str, beat: Callable[[], object] | None = None) -> list[str]: ...
    def processes(self, path: str) -> list[int]: ...


class Deferred(CgroupError):  # noqa: N818 - not a fault
    """A write left to another writer (systemd, for a workload that is a unit), made
    after the daemon's lock: the cgroup holds the value once it has (no fault)."""


class Moves(Protocol):
    """Memory moves left to a background worker (``numad.host.migration.Migrations``)."""

    def interim(self, path: str, mems: NodeSet) -> NodeSet | None: ...
    def narrow(self, path: str, mems: NodeSet, wide: NodeSet) -> None: ...
    def placed(self, path: str, cpus: CPUSet, mems: NodeSet | None) -> None: ...
    def drifting(self, path: str) -> bool: ...
    def settled(self, path: str) -> None: ...


class Log(Protocol):
    def info(self, event: str, **kw: Any) -> Any: ...
    def warning(self, event: str, **kw: Any) -> Any: ...
    def error(self, event: str, **kw: Any) -> Any: ...
    def exception(self, event: str, **kw: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class Target:
    """What one cgroup must hold."""

    path: str
    cpus: int
    mems: NodeSet | None
    exclusive: bool
    # A shared cgroup above a workload numad no longer writes (``outside``): that
    # workload's exclusive CPUs, which it keeps beside the pool so they stay in effect.
    keeps: int = 0


def targets(
    books: Books,
    specs: Mapping[str, WorkloadSpec],
    orphans: Iterable[str],
    others: Iterable[str] = (),
    every_node: NodeSet | None = None,
    *,
    outside: Collection[str] = (),
) -> list[Target]:
    """Every cgroup numad writes, in write order: released cgroups that still exist
    (their processes must leave the CPUs numad hands out next) and the other
    cgroups it isolates (``others``), then each workload's containers. Unplaced
    workloads hold nothing and follow the pool. A released cgroup gets ``every_node``
    (the nodes with memory), so memory numad pinned is free again; the others'
    memory nodes, and an unpinned workload's, are not touched. The workloads named
    in ``outside`` are not written: a cgroup numad isolates above one of them keeps
    its exclusive CPUs beside the pool, so it runs where it was placed."""
    pool = books.cpu.shared_pool
    out: list[Target] = []
    owned: set[str] = set()
    kept: dict[str, int] = {}  # an outside workload's cgroup -> its exclusive CPUs
    for name, spec in sorted(specs.items()):
        held = placements(books, name)
        for c in spec.containers:
            path = spec.container_cgroup(c)
            owned.add(path)
            p = held.get(c.name)
            mems = p.mems if p is not None and p.mems else None
            cpus = p.cpus.bits if p is not None and p.cpus else 0
            if name in outside:
                kept[path] = cpus
            elif cpus:
                out.append(Target(path, cpus, mems, exclusive=True))
            else:
                out.append(Target(path, pool, mems, exclusive=False))
    orphaned = set(orphans) - owned
    shared = sorted((orphaned | set(others)) - owned)
    released = [
        Target(
            p,
            pool,
            every_node if p in orphaned else None,
            exclusive=False,
            keeps=union(cpus for k, cpus in kept.items() if k.startswith(p + "/")),
        )
        for p in shared
    ]
    return released + out


def union(masks: Iterable[int]) -> int:
    """The CPUs (or nodes) of every mask."""
    found = 0
    for mask in masks:
        found |= mask
    return found


def related_to(path: str, cgroups: Iterable[str]) -> bool:
    """Whether ``path`` is one of ``cgroups``, above one or below one."""
    return any(path == m or m.startswith(path + "/") or path.startswith(m + "/") for m in cgroups)


Listing = Mapping[str, "list[str] | NumadError"]  # a managed root -> the cgroups below it


@dataclass(frozen=True)
class Scan:
    """What a reconcile pass reads before it takes the lock (``Enforcer.scan``)."""

    listing: Listing
    reads: Mapping[str, tuple[tuple[int, NodeSet | None], tuple[CPUSet, NodeSet] | None]]
