"""What counting says of a move search (``numad.placement.moves``): which sets of
candidates can help a newcomer that must sit on one node, tried cheapest first, and
the least a single move there costs. Counts of CPUs per node only: no admission."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from numad.placement.admission import Books, Engine, WorkloadRequest
from numad.placement.policy import Policy

ONE_NODE = frozenset({Policy.SINGLE_NUMA_NODE, Policy.RESTRICTED})
Key = tuple[str, str]  # (workload, container)


@dataclass(frozen=True, slots=True)
class Room:
    """A newcomer of one container that must sit on one node (single-numa-node or
    restricted, and a node holds its CPUs) and that no node has the CPUs free for: a
    move helps only if it frees CPUs on a node where then ``ask`` are free, and the
    moved workload leaves that node (else the newcomer would have fit)."""

    ask: int
    free: Mapping[int, int]  # node -> free CPUs
    policy: Policy  # the host's

    @classmethod
    def of(cls, engine: Engine, books: Books, request: WorkloadRequest) -> Room | None:
        ask = whole(engine, request)
        if not ask:  # no node holds it: a multi-node placement may be preferred
            return None
        numa = engine.cpu_policy.topo.numa
        free = {n: (books.cpu.available & m).bit_count() for n, m in numa.items()}
        if max(free.values(), default=0) >= ask:
            return None  # not refused by the count: alignment, memory (no pruning then)
        return cls(ask, free, engine.policy)

    def helps(self, held: Mapping[int, int], sizes: Sequence[int] | None = None) -> bool:
        """Whether freeing ``held`` (node -> CPUs) leaves ``ask`` free on a node and,
        where the moved workloads must each sit whole on one node (``sizes``: their
        CPUs; None: not all must), they then fit in what is left, by the counts."""
        for n, cpus in held.items():
            if self.free[n] + cpus < self.ask:
                continue
            if sizes is None:
                return True
            left = [f + held.get(m, 0) - (self.ask if m == n else 0) for m, f in self.free.items()]
            if packs(left, sizes):
                return True
        return False

    def bound(
        self,
        held: Mapping[int, int],
        keys: set[Key],
        books: Books,
        policy: Policy | None,
        resident: Mapping[int, int],
    ) -> tuple[int, int, int, int]:
        """The least a single move of a workload (``held``: its CPUs per node) can cost:
        it gives up at least the CPUs the newcomer lacks on a node it helps on; one on
        a single node changes nodes; one that must stay on one node (its policy) leaves
        that node whole, and migrates its pinned memory there (``resident``: measured,
        else its blocks'; ``policy``: its own, None for the host's)."""
        one = (policy or self.policy) in ONE_NODE and len(held) == 1
        pinned = one and any(books.memory.blocks.get(k) for k in keys)
        moving = (resident or split(books, keys)) if pinned else {}
        return min(
            (moving.get(n, 0), int(len(held) == 1), cpus if one else self.ask - self.free[n], 1)
            for n, cpus in held.items()
            if self.free[n] + cpus >= self.ask
        )


def whole(engine: Engine, request: WorkloadRequest) -> int | None:
    """The CPUs of a workload that must sit whole on one node (one container, its
    policy one-node, a node holds them); None for any other."""
    if len(request.containers) != 1 or (request.policy or engine.policy) not in ONE_NODE:
        return None
    cpus = request.containers[0].cpus
    numa = engine.cpu_policy.topo.numa
    return cpus if any(m.bit_count() >= cpus for m in numa.values()) else None


def packs(room: Sequence[int], items: Sequence[int]) -> bool:
    """Whether each of ``items`` goes whole into one of ``room``'s bins (free CPUs per
    node), exactly: the largest item tried in each distinct bin that holds it."""
    if not items:
        return True
    rest = sorted(items)
    item = rest.pop()
    seen = set()
    for i, left in enumerate(room):
        if left >= item and left not in seen:
            seen.add(left)
            if packs([*room[:i], left - item, *room[i + 1 :]], rest):
                return True
    return False


def per_node(engine: Engine, books: Books, keys: set[Key]) -> dict[int, int]:
    """A workload's exclusive CPUs on each node (``keys``: its containers)."""
    held = 0
    for key in keys:
        held |= books.cpu.assignments.get(key, 0)
    numa = engine.cpu_policy.topo.numa
    return {n: (held & m).bit_count() for n, m in numa.items() if held & m}


def summed(*held: Mapping[int, int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for one in held:
        for node, cpus in one.items():
            out[node] = out.get(node, 0) + cpus
    return out


def cheapest(n: int, size: int) -> Iterator[tuple[int, ...]]:
    """Sets of ``size`` of ``range(n)`` (candidates, cheapest first), by the sum of their
    ranks, then the first's, ...: (0, 1), (0, 2), (0, 3), (1, 2), ... made as taken."""
    least = size * (size - 1) // 2
    for total in range(least, size * (2 * n - size - 1) // 2 + 1):
        yield from _summing(total, size, 0, n)


def _summing(total: int, size: int, start: int, n: int) -> Iterator[tuple[int, ...]]:
    """Increasing ``size`` indices from ``start`` to ``n`` whose sum is ``total``."""
    if size == 1:
        if start <= total < n:
            yield (total,)
        return
    for i in range(start, n):
        if size * i + size * (size - 1) // 2 > total:
            return  # the least the rest can add is already too much
        for rest in _summing(total - i, size - 1, i + 1, n):
            yield (i, *rest)


def split(books: Books, keys: set[Key]) -> dict[int, int]:
    """A workload's bytes per node as its blocks say (what it asked, not touched)."""
    out: dict[int, int] = {}
    for key in keys:
        for node, size in books.memory.per_node(key).items():
            out[node] = out.get(node, 0) + size
    return out
