"""A provider's hints for one resource: the ``Hint``, and hints described instead of listed.

Pure core. The kubelet's providers list every NUMA node mask that can hold a
request: 2^N - 1 masks to look at, ~131,000 hint objects at 17 nodes, none
buildable at 34. Every list they build has the same shape, so numad describes
it instead (``HintSpace``) and lists it only where a list is asked for
(``materialize``, the kubelet's order: by width, then lexicographically):

* a mask is a hint when it is made of the provider's ``nodes``, holds the
  ``must`` nodes (the nodes of CPUs or devices the container reuses), and its
  nodes' free amounts reach ``need`` in every dimension (CPUs; devices; bytes
  of memory and of each hugepage size);
* the memory manager's group rule adds the only non-monotone part: a mask of
  two or more nodes must lie in ``pool`` (nodes with no allocation yet) or be
  one of ``groups`` (a multi-node group that already holds allocations); a
  one-node mask must lie in ``singles`` (nodes not in a multi-node group);
* a hint is preferred when it is exactly ``width`` nodes wide (the narrowest
  width whose capacity, free or not, can hold the request), or, with the CPU
  manager's align-by-socket option, when it touches ``min_sockets`` sockets.

Masks are node bit masks (bit n: NUMA node n), as in ``numad.placement.merge``.
"""

from __future__ import annotations

import bisect
import functools
import heapq
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from numad.cpuset import NodeSet

Amounts = tuple[tuple[int, ...], ...]  # per dimension, per node id: an amount


@dataclass(frozen=True, slots=True)
class Hint:
    """One placement a provider could give a resource."""

    affinity: NodeSet | None
    preferred: bool
    score: int = 0  # 0: unscored; 1..100: share of the node(s) already allocated

    @property
    def mask(self) -> int | None:
        return None if self.affinity is None else self.affinity.bits


@dataclass(frozen=True, slots=True)
class HintSpace:
    """Every mask that can hold a request (see the module docstring)."""

    nodes: int
    free: Amounts  # free[d][n]: what node n has free in dimension d
    need: tuple[int, ...]  # need[d]: what the request needs in dimension d
    width: int  # the preferred width
    must: int = 0
    pool: int | None = None  # None: every node of ``nodes``
    singles: int | None = None  # None: every node of ``nodes``
    groups: tuple[int, ...] = ()
    sockets: tuple[int, ...] = ()  # align-by-socket: each socket's nodes
    min_sockets: int = 0

    # -- what a mask is -----------------------------------------------------------------

    def amount(self, mask: int, d: int) -> int:
        row = self.free[d]
        return sum(row[n] for n in bits(mask))

    def enough(self, mask: int) -> bool:
        return all(self.amount(mask, d) >= q for d, q in enumerate(self.need))

    def shaped(self, mask: int) -> bool:
        """Made of the right nodes, whatever the amounts."""
        if not mask or mask & ~self.nodes or self.must & ~mask:
            return False
        if mask & (mask - 1) == 0:
            return not mask & ~self.single_nodes
        return not mask & ~self.pool_nodes or mask in self.groups

    def holds(self, mask: int) -> bool:
        """Whether ``mask`` is one of the hints."""
        return self.shaped(mask) and self.enough(mask)

    def preferred(self, mask: int) -> bool:
        """Whether ``mask`` is a preferred hint."""
        return self.holds(mask) and self.prefers(mask)

    def prefers(self, mask: int) -> bool:
        """The provider's preference rule alone (``mask`` is known to be a hint)."""
        if self.min_sockets and sum(1 for s in self.sockets if s & mask) == self.min_sockets:
            return True
        return mask.bit_count() == self.width

    @property
    def pool_nodes(self) -> int:
        return self.nodes if self.pool is None else self.pool & self.nodes

    @property
    def single_nodes(self) -> int:
        return self.nodes if self.singles is None else self.singles & self.nodes

    @property
    def slack(self) -> tuple[int, ...]:
        """Per dimension, what a hint made of every pool node has beyond the need."""
        return tuple(self.amount(self.pool_nodes, d) - q for d, q in enumerate(self.need))

    def node_ids(self) -> list[int]:
        return bits(self.nodes)

    # -- searches in the kubelet's order --------------------------------------------------

    def first(self, within: int | None = None, base: int = 0) -> int | None:
        """The first hint in the kubelet's order that holds ``base`` and lies in
        ``within``: the narrowest, then the lexicographically first."""
        return _first(self, self.nodes if within is None else self.nodes & within, base)

    def narrowest(self) -> int | None:
        """The width of the narrowest hint; None when there is no hint."""
        found = self.first()
        return None if found is None else found.bit_count()

    def of_width(self, w: int, allowed: int | None = None, base: int = 0) -> Iterator[int]:
        """The hints of exactly ``w`` nodes that hold ``base``, in lexicographic order of
        their node lists (the kubelet's order within a width)."""
        allowed = self.nodes if allowed is None else allowed & self.nodes
        base |= self.must
        if base & ~allowed or base.bit_count() > w:
            return
        if w == 1:
            for n in bits(allowed & self.single_nodes):
                m = 1 << n
                if base & ~m == 0 and self.enough(m):
                    yield m
            return
        extra = sorted(
            (g for g in self.groups if g.bit_count() == w and g & base == base), key=lex_key
        )
        extra = [g for g in extra if not g & ~allowed and self.enough(g)]
        pooled = self._combos(w, allowed & self.pool_nodes, base)
        yield from heapq.merge(pooled, extra, key=lex_key)

    def _combos(self, w: int, allowed: int, base: int) -> Iterator[int]:
        """Masks of ``w`` nodes of ``allowed`` holding ``base`` whose amounts reach the
        need, lexicographically; a branch whose best completion falls short is cut."""
        if base & ~allowed:
            return
        nodes = bits(allowed)
        dims = range(len(self.need))
        rows = self.free
        best = top_sums(rows, nodes, w)  # best[i][k][d]: the most k of nodes[i:] add in d
        must = [n for n in nodes if base >> n & 1]

        def walk(i: int, chosen: int, count: int, have: list[int]) -> Iterator[int]:
            left = w - count
            if left == 0:
                if not base & ~chosen and all(have[d] >= self.need[d] for d in dims):
                    yield chosen
                return
            if len(nodes) - i < left:
                return
            # the base nodes not yet passed must still fit
            pending = sum(1 for n in must if n >= nodes[i])
            if pending > left:
                return
            if any(have[d] + best[i][left][d] < self.need[d] for d in dims):
                return
            n = nodes[i]
            yield from walk(
                i + 1, chosen | 1 << n, count + 1, [h + rows[d][n] for d, h in enumerate(have)]
            )
            if not base >> n & 1:
                yield from walk(i + 1, chosen, count, have)

        yield from walk(0, 0, 0, [0] * len(self.need))

    def materialize(self) -> tuple[Hint, ...]:
        """The kubelet's list: every hint, by width, then lexicographically."""
        hints: list[Hint] = []
        for w in range(1, self.nodes.bit_count() + 1):
            hints.extend(Hint(NodeSet.from_bits(m), self.prefers(m)) for m in self.of_width(w))
        return tuple(hints)


@functools.lru_cache(maxsize=1024)
def _first(space: HintSpace, allowed: int, base: int) -> int | None:
    """``HintSpace.first``, remembered (the merge asks each space more than once). The
    search starts at the narrowest width whose best nodes could reach the need."""
    nodes = bits(allowed)
    start = max(1, base.bit_count())
    if nodes:
        tails = top_sums(space.free, nodes, len(nodes))[0]
        reach = [
            k
            for k in range(len(nodes) + 1)
            if all(a >= q for a, q in zip(tails[k], space.need, strict=True))
        ]
        if not reach:
            return None
        start = max(start, reach[0])
    for w in range(start, len(nodes) + 1):
        for mask in space.of_width(w, allowed, base):
            return mask
    return None


def forget_searches() -> None:
    """Drop what ``_first`` remembers: each merge starts afresh (a benchmark that
    repeats one merge must not time remembered answers)."""
    _first.cache_clear()


def top_sums(rows: Sequence[Sequence[int]], nodes: Sequence[int], w: int) -> list[list[list[int]]]:
    """``best[i][k][d]``: the most that ``k`` of ``nodes[i:]`` add in dimension ``d``
    (k up to ``w``): one pass from the end, keeping each dimension's amounts sorted."""
    dims = len(rows)
    best = [[[0] * dims for _ in range(w + 1)] for _ in range(len(nodes) + 1)]
    ranked: list[list[int]] = [[] for _ in range(dims)]
    for i in range(len(nodes) - 1, -1, -1):
        level = best[i]
        for d in range(dims):
            bisect.insort(ranked[d], -rows[d][nodes[i]])
            acc = 0
            for k, neg in enumerate(ranked[d][:w], 1):
                acc -= neg
                level[k][d] = acc
            for k in range(len(ranked[d]) + 1, w + 1):
                level[k][d] = acc
    return best


def min_width(capacity: Amounts, need: Sequence[int], nodes: int) -> int:
    """The narrowest width at which some set of ``nodes`` has ``capacity`` reaching
    ``need`` in every dimension (every node's width when none does): the providers'
    preferred width. One dimension: the largest capacities first. More: a search
    that stops at the first width that works."""
    members = bits(nodes)
    if not members:
        return 0
    if len(need) == 1:
        acc = 0
        for k, amount in enumerate(sorted((capacity[0][n] for n in members), reverse=True), 1):
            acc += amount
            if acc >= need[0]:
                return k
        return len(members)
    space = HintSpace(nodes, capacity, tuple(need), width=0)
    found = space.narrowest()
    return len(members) if found is None else found


def lex_key(mask: int) -> tuple[int, ...]:
    """The kubelet's order within one width: the node lists, lexicographically."""
    return tuple(bits(mask))


def bits(mask: int) -> list[int]:
    """The set bits of ``mask`` (node ids), ascending."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def listed(hints: HintSpace | Sequence[Hint] | None) -> tuple[Hint, ...] | None:
    """A provider's answer as the kubelet lists it (tests and small machines)."""
    if hints is None:
        return None
    if isinstance(hints, HintSpace):
        return hints.materialize()
    return tuple(hints)
