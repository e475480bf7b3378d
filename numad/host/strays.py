"""The strays: cgroups inside the managed roots that are no workload's.

Host side, used by ``numad.host.enforce`` when a pass finds the cgroups numad
isolates one by one. Not a container's cgroup, nor above one (a pod's), nor below
one (the container's own business: it only sees the container's CPUs). Cgroups
``MAX_DEPTH`` levels deep or more are left out, with a problem naming them. Cost:
one prefix test per listed cgroup and workload cgroup; the listing is the pass's
scan, made before the daemon's lock. On cgroup v2 only the outermost strays are
written (``outermost``): each bounds every cgroup below it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator

from numad.errors import NumadError
from numad.host.cgroup.path import MAX_DEPTH
from numad.host.targets import Cgroups, Listing, related_to
from numad.observe import Problems
from numad.workload.shape import WorkloadSpec


def unmanaged(  # noqa: PLR0917 - the pass's parts
    cgroups: Cgroups,
    roots: Iterable[str],
    specs: Collection[WorkloadSpec],
    listing: Listing | None,
    problems: Problems,
    failed: Callable[[str, NumadError], None],
    seen: Collection[str] = (),
) -> set[str]:
    """The strays below ``roots``, from ``listing`` where given (the pass's scan), else
    listed now; a root that cannot be listed is ``failed``. A cgroup above a workload's
    is no stray, unless that one is gone: of ``seen`` (workloads' cgroups numad has
    seen), one that exists no more (its workload held through the release grace), so
    that whatever runs above it meanwhile stays off the exclusive CPUs. One not seen
    yet is to be made: the cgroups above it are left to it."""
    mine = {s.container_cgroup(c) for s in specs for c in s.containers}
    found: set[str] = set()
    for root in roots:
        try:
            listed = listing.get(root) if listing is not None else None
            if isinstance(listed, NumadError):
                raise listed
            below = listed if listed is not None else cgroups.descendants(root)
        except NumadError as err:
            failed(root, err)
            continue
        present = mine - _gone(cgroups, root, mine.intersection(seen), set(below))
        deep = [p for p in below if p.count("/") >= MAX_DEPTH]
        if deep:
            problems.set(
                f"depth:{root}",
                f"{deep[0]}: {len(deep)} cgroups in {root} lie {MAX_DEPTH} levels or more"
                " deep; numad does not isolate them one by one (their ancestors bound them"
                " on cgroup v2)",
            )
            below = [p for p in below if p.count("/") < MAX_DEPTH]
        else:
            problems.clear(f"depth:{root}")
        found.update(path for path in below if not related_to(path, present))
    return found


def _gone(cgroups: Cgroups, root: str, seen: set[str], listed: set[str]) -> set[str]:
    """Of ``seen`` below ``root``, those that exist no more: not listed, nor made since
    the listing (asked of each). Cost: a lookup per cgroup, a stat per one not listed."""
    root = root.strip("/")
    return {
        m for m in seen if m.startswith(root + "/") and m not in listed and not _exists(cgroups, m)
    }


def _exists(cgroups: Cgroups, path: str) -> bool:
    try:
        return bool(cgroups.exists(path))
    except NumadError:
        return True  # cannot tell: as if it were, so the cgroups above it are left as they are


def outermost(paths: Collection[str], isolated: Collection[str] = ()) -> set[str]:
    """Of ``paths`` (cgroups to isolate), those with no ancestor among them or
    ``isolated`` already. On cgroup v2 a cgroup's effective CPUs lie within its parent's,
    whatever its own setting, so an ancestor's write keeps every cgroup below it, made
    before or after, off the exclusive CPUs: 12,500 strays three deep in 2,500 pods under
    one ``kubepods`` are one write. (cgroup v1 checks each child's setting against its
    parent's instead, so there every cgroup is written.) Cost: a set lookup per level of
    each path."""
    return {p for p in paths if not below_any(p, paths) and not below_any(p, isolated)}


def _ancestors(path: str) -> Iterator[str]:
    while "/" in path:
        path = path.rpartition("/")[0]
        yield path


def below_any(path: str, others: Collection[str]) -> bool:
    """Whether ``path`` lies below one of ``others``."""
    return any(a in others for a in _ancestors(path))


def around(paths: Iterable[str], others: Collection[str]) -> list[str]:
    """Those of ``paths`` that lie below or above one of ``others``, sorted. Cost: a set
    lookup per level of each path and of each of ``others``."""
    above = {a for o in others for a in _ancestors(o)}
    return sorted(p for p in paths if p in above or below_any(p, others))
