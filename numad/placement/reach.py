"""Reachability: whether one pick per merge list intersects to exactly a mask.

Pure core, the second phase of ``numad.placement.search``. Every merged mask is the
intersection of one pick per list; a mask X is reachable when each list has a
pick that holds X and the picks leave nothing else in common, so every node
outside X is left out by some list. An explicit pick (a listed mask, a memory
group, a one-node hint equal to X) leaves out a fixed set; a described list's
pool pick (``numad.placement.hintspace``) leaves out any set of its pool whose amounts
its slack can spare (what its whole pool has beyond the need). Choosing picks
is a search over the fixed options, then an assignment of the nodes still
shared to the pool picks within their slack: a bin packing, solved exactly by
a depth-first search. A node some pool can leave out for free (outside it, or
with nothing of any requested resource) never enters the packing. Every step
is counted by the caller's ``step``, which raises past its budget.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from numad.cpuset import NodeSet
from numad.placement.hints import HintList
from numad.placement.hintspace import HintSpace


@dataclass(frozen=True, slots=True)
class MergeList:
    """One merge list as the search sees it: described, or explicit masks and nils."""

    space: HintSpace | None
    masks: tuple[tuple[int, bool], ...]  # explicit non-nil hints: (mask, preferred)
    nil: bool  # holds a nil hint ("any node")
    preferred_nil: bool
    pool_ok: bool = False  # a described list: its whole pool is a hint
    groups: tuple[int, ...] = ()  # a described list: the groups that are hints

    @classmethod
    def of(cls, hl: HintList) -> MergeList:
        s = hl.space
        if s is not None:
            groups = tuple(g for g in s.groups if s.enough(g))
            pool_ok = bool(s.pool_nodes) and s.enough(s.pool_nodes)
            return cls(s, (), nil=False, preferred_nil=False, pool_ok=pool_ok, groups=groups)
        masks = tuple((h.mask, h.preferred) for h in hl.hints if h.mask is not None)
        nils = [h.preferred for h in hl.hints if h.mask is None]
        return cls(None, masks, nil=bool(nils), preferred_nil=any(nils))


class Reach:
    """Reachability over ``lists`` on a machine whose nodes form ``default``."""

    def __init__(self, lists: Sequence[MergeList], default: int, step: Callable[[], None]) -> None:
        self.lists = lists
        self.default = default
        self._step = step
        self.slack = {id(x.space): x.space.slack for x in lists if x.space is not None}

    def reachable(self, x_mask: int) -> bool:
        """Whether one pick per list intersects to exactly ``x_mask``."""
        rest = self.default & ~x_mask
        fixed: list[list[int]] = []  # per list, the node sets its fixed picks leave out
        flexible: list[HintSpace | None] = []  # per list, its open pool pick
        for x in self.lists:
            options, pool = self._options(x, x_mask, rest)
            if not options and pool is None:
                return False
            if any(o == rest for o in options):
                options = [rest]
            fixed.append(options)
            flexible.append(pool)
        if any(o == rest for opts in fixed for o in opts):
            return True
        return self._choose(0, rest, fixed, flexible, [])

    def _options(self, x: MergeList, x_mask: int, rest: int) -> tuple[list[int], HintSpace | None]:
        """What ``x`` can leave out of ``rest`` with a pick holding ``x_mask``: fixed
        sets, and its pool (a described list whose pool pick is open)."""
        if x.space is None:
            opts = [rest & ~m for m, _ in x.masks if m & x_mask == x_mask]
            if x.nil:
                opts.append(0)
            return _maximal(opts), None
        s = x.space
        opts = [rest & ~g for g in x.groups if g & x_mask == x_mask]
        if x_mask.bit_count() == 1 and s.holds(x_mask):
            opts.append(rest)
        full = x_mask | s.must
        pool = None
        if x.pool_ok and not full & ~s.pool_nodes:
            pool = s
        return _maximal(opts), pool

    def _choose(
        self,
        i: int,
        uncovered: int,
        fixed: list[list[int]],
        flexible: list[HintSpace | None],
        pools: list[HintSpace],
    ) -> bool:
        """Pick, list by list, a fixed option or the pool; then fit what is left."""
        self._step()
        if not uncovered:
            return True
        if i == len(fixed):
            return self._fit(uncovered, pools)
        for option in sorted(fixed[i], key=lambda o: -(o & uncovered).bit_count()):
            if self._choose(i + 1, uncovered & ~option, fixed, flexible, pools):
                return True
        pool = flexible[i]
        if pool is not None:
            return self._choose(i + 1, uncovered, fixed, flexible, [*pools, pool])
        return False

    def _fit(self, uncovered: int, pools: list[HintSpace]) -> bool:
        """Whether the pools can leave out every node of ``uncovered`` within their
        slack: a node outside a pool, or free in it, costs nothing; the rest is packed."""
        if not pools:
            return False
        hard = []
        for n in NodeSet.from_bits(uncovered):
            bit = 1 << n
            if any(bit & ~p.pool_nodes or (not bit & p.must and _free_of(p, n)) for p in pools):
                continue
            costs = [None if bit & p.must else tuple(r[n] for r in p.free) for p in pools]
            if all(c is None for c in costs):
                return False
            hard.append(costs)
        slack = [list(self.slack[id(p)]) for p in pools]
        hard.sort(key=lambda c: -max((sum(x) for x in c if x is not None), default=0))
        return self._pack(0, hard, slack)

    def _pack(
        self, i: int, hard: list[list[tuple[int, ...] | None]], slack: list[list[int]]
    ) -> bool:
        self._step()
        if i == len(hard):
            return True
        tried: set[tuple[int, ...]] = set()
        for j, cost in enumerate(hard[i]):
            if cost is None:
                continue
            room = slack[j]
            if any(c > r for c, r in zip(cost, room, strict=True)):
                continue
            state = (j, *room)
            if state in tried:
                continue
            tried.add(state)
            for d, c in enumerate(cost):
                room[d] -= c
            ok = self._pack(i + 1, hard, slack)
            for d, c in enumerate(cost):
                room[d] += c
            if ok:
                return True
        return False


def _free_of(space: HintSpace, node: int) -> bool:
    return all(row[node] == 0 for row in space.free)


def _maximal(sets: list[int]) -> list[int]:
    """The sets no other set contains (a larger exclusion never hurts)."""
    unique = sorted(set(sets), key=lambda s: -s.bit_count())
    kept: list[int] = []
    for s in unique:
        if not any(k & s == s for k in kept):
            kept.append(s)
    return kept
