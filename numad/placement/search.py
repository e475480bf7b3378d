"""The merge by search: the kubelet's answer over described hints, without lists.

Pure core. ``numad.placement.merge`` folds explicit hint lists; its tables have 2^N
entries and the lists themselves up to 2^N - 1 hints, which no machine past
~20 nodes can build. Providers describe their hints instead
(``numad.placement.hintspace``), and this module finds the same merged hint by
searching node sets in the comparator's order, pruned by the providers'
predicates. Only unscored hints come here (numad's providers, like the
kubelet's, do not score); scored lists keep the fold of ``numad.placement.merge``.

Phase 1, preferred (the fold's structure, ``numad.placement.merge`` point 1): a merged
hint is preferred when every pick is preferred and all non-nil picks are one
mask X. So the candidates are the masks preferred by every list that has no
preferred nil hint (or, when every list has one, by any list, and the
machine's own mask); the winner is the least by the structural key (width,
then mean distance under prefer-closest, then mask value). Preferred masks of
a described list are one width wide, so this is a search over node sets of
that width in key order, cut by every list's amounts at once.

Phase 2, non-preferred: every merged mask is the intersection of one pick
per list. The comparator settles on one width class around B, the widest of
the lists' narrowest hints (``numad.placement.merge`` point 2), and the least mask of
that class by key wins. A mask X is reachable (``numad.placement.reach``) when each list
has a pick that holds X and the picks leave nothing else in common: every node outside X is
left out by some list. Explicit picks leave out fixed sets; a described
list's pool pick leaves out any set whose amounts its slack can spare. That
is an assignment of the remaining nodes to lists within each list's slack
(a bin packing, NP-hard in general), solved exactly by a bounded search;
nodes some list can leave out for free (no CPUs, no devices, outside its
nodes) never enter it, so memory-only and CPU-less nodes cost nothing.

No tractable exact answer: the assignment, and the search for the decisive
width when B itself is unreachable, can take exponential time on adversarial
amounts. The search counts its steps; past ``BUDGET`` it stops. On a machine
of at most ``LISTABLE`` nodes numad then lists the hints and folds them
(``numad.placement.merge``, exact); on a larger one it takes the documented rule: the
best mask of width B found within the budget, else the machine's mask, not
preferred. The rule is exact on every instance that finishes within the
budget, which the differential test checks against the fold.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Sequence

from numad.placement.hints import HintList
from numad.placement.hintspace import HintSpace, bits, top_sums
from numad.placement.merge import Distance, Merged
from numad.placement.reach import MergeList, Reach

BUDGET = 200_000  # search steps for one merge
LISTABLE = 16  # nodes: up to this many, hints can be listed and folded instead


class SearchBudgetError(Exception):
    """The search ran out of its budget."""


class Search:
    """One merge of described and short explicit lists on a machine whose nodes form
    ``default``."""

    def __init__(
        self, lists: Sequence[HintList], default: int, *, distance: Distance | None = None
    ) -> None:
        self.lists = [MergeList.of(hl) for hl in lists]
        self.reach = Reach(self.lists, default, self._step)
        self.default = default
        self.distance = distance
        self.steps = 0
        self.found: int | None = None  # phase 2: the best width-B mask so far (the rule)

    def _step(self) -> None:
        self.steps += 1
        if self.steps > BUDGET:
            raise SearchBudgetError

    # -- the structural key ----------------------------------------------------------------

    def _pair_sum(self, mask: int) -> int:
        if self.distance is None:
            return 0
        nodes = bits(mask)
        return sum(self.distance(a, b) for a in nodes for b in nodes)

    def key(self, mask: int) -> tuple[int, float, int]:
        w = mask.bit_count()
        return (w, self._pair_sum(mask) / (w * w) if w else 0.0, mask)

    # -- the merge ---------------------------------------------------------------------------

    def run(self) -> Merged:
        best = self.preferred()
        if best is not None:
            return Merged(best, preferred=True, score=0)
        found = self.non_preferred()
        if found is None:
            return Merged(self.default, preferred=False, score=0)
        return Merged(found, preferred=False, score=0)

    # -- phase 1 ---------------------------------------------------------------------------

    def preferred(self) -> int | None:
        """The least mask, by key, that every strict list prefers."""
        strict = [x for x in self.lists if not x.preferred_nil]
        if not strict:  # every list may pick its preferred nil
            found = [self.default] + [
                m for x in self.lists for m in self._preferred_of(x, [x]) if m
            ]
            return min(found, key=self.key)
        if any(x.space is None and x.nil and not x.masks for x in strict):
            return None  # a list that is nowhere: no permutation is preferred
        candidates = self._preferred_of(strict[0], strict)
        return min(candidates, key=self.key, default=None)

    def _preferred_of(self, lead: MergeList, strict: Sequence[MergeList]) -> list[int]:
        """The least mask by key preferred by every list of ``strict`` (none, or one),
        generated from ``lead``'s preferred masks."""
        accept = self._prefers_all(strict)
        if lead.space is None:
            return [m & self.default for m, p in lead.masks if p and m & self.default and accept(m)]
        space = lead.space
        spaces = [x.space for x in strict if x.space is not None]
        widths = [space.width] if not space.min_sockets else range(1, space.nodes.bit_count() + 1)
        for w in widths:  # the key's first part is the width
            best = self._least(w, self._hint_candidates(w, spaces), accept)
            if best is not None:
                return [best]
        return []

    def _prefers_all(self, strict: Sequence[MergeList]) -> Callable[[int], bool]:
        def accept(mask: int) -> bool:
            for x in strict:
                if x.space is not None:
                    if mask & ~self.default or not x.space.preferred(mask):
                        return False
                elif not any(m == mask and p for m, p in x.masks):
                    return False
            return True

        return accept

    def _hint_candidates(self, w: int, spaces: Sequence[HintSpace]) -> Iterator[int]:
        """Masks of ``w`` nodes that may be a hint of every one of ``spaces``, in
        increasing value: pool masks cut by every space's amounts, then the groups."""
        allowed = self.default
        for s in spaces:
            allowed &= s.nodes & (s.single_nodes if w == 1 else s.pool_nodes)
        must = 0
        for s in spaces:
            must |= s.must
        rows = [(s.free[d], q) for s in spaces for d, q in enumerate(s.need)]
        pooled = _colex(w, allowed, must, rows, self._step)
        groups = (
            sorted({g for s in spaces for g in s.groups if g.bit_count() == w}) if w > 1 else []
        )
        yield from heapq.merge(pooled, groups)  # both in increasing value

    def _least(
        self,
        w: int,
        candidates: Iterator[int],
        accept: Callable[[int], bool],
        *,
        record: bool = False,
    ) -> int | None:
        """The least accepted candidate by key; without distances the first one (the
        candidates come in increasing value), with them the least mean distance."""
        if self.distance is not None:  # least mean distance first, then value
            ranked = []
            for mask in candidates:
                self._step()
                ranked.append((self._pair_sum(mask), mask))
            ranked.sort()
            candidates = iter(m for _, m in ranked)
        for mask in candidates:
            self._step()
            if accept(mask):
                if record:
                    self.found = mask
                return mask
        return None

    # -- phase 2 ---------------------------------------------------------------------------

    def best_width(self) -> int:
        """B: the widest of the lists' narrowest non-nil hints."""
        widths = []
        for x in self.lists:
            if x.space is not None:
                narrowest = x.space.narrowest()
                if narrowest is not None:
                    widths.append(narrowest)
            elif x.masks:
                widths.append(min(m.bit_count() for m, _ in x.masks))
        return max(widths, default=0)

    def fallback(self) -> Merged:
        """The documented rule past the budget (module docstring)."""
        return Merged(self.found or self.default, preferred=False, score=0)

    def non_preferred(self) -> int | None:
        if all(x.space is None and not x.masks for x in self.lists):
            return self.default or None  # every pick is nil: the machine's mask
        b = self.best_width()
        top = self.default.bit_count()
        order = [b, *range(min(b, top + 1) - 1, 0, -1), *range(b + 1, top + 1)]
        for w in order:
            if 1 <= w <= top:
                found = self._least(w, self._coverable(w), self.reach.reachable, record=w == b)
                if found is not None:
                    return found
        return None

    def _coverable(self, w: int) -> Iterator[int]:
        """Masks of ``w`` nodes for which every list has a pick holding them, in
        increasing value (a mask that some list cannot hold has no superset it can)."""
        return _colex_pred(w, self.default, self.covered, self._step)

    def covered(self, mask: int) -> bool:
        return all(self._holds_superset(x, mask) for x in self.lists)

    def _holds_superset(self, x: MergeList, mask: int) -> bool:
        if x.space is None:
            return (x.nil and not mask & ~self.default) or any(m & mask == mask for m, _ in x.masks)
        s = x.space
        full = mask | s.must
        if full & ~s.nodes:
            return False
        if full.bit_count() == 1 and s.holds(full):
            return True
        if x.pool_ok and not full & ~s.pool_nodes:
            return True
        return any(g & full == full for g in x.groups)


def _colex(
    w: int,
    allowed: int,
    must: int,
    rows: Sequence[tuple[Sequence[int], int]],
    step: Callable[[], None],
) -> Iterator[int]:
    """Masks of ``w`` nodes of ``allowed`` holding ``must`` whose amounts reach every
    row's need, in increasing value; a branch that cannot reach a need is cut."""
    nodes = bits(allowed)
    if must & ~allowed or must.bit_count() > w:
        return
    needs = [q for _, q in rows]
    # best[i][k][r]: the most that k nodes among nodes[:i] add to row r: the table of
    # the nodes' suffixes, taken over the nodes in reverse order
    best = top_sums([row for row, _ in rows], nodes[::-1], w)[::-1]

    def walk(i: int, k: int, chosen: int, have: list[int]) -> Iterator[int]:
        # k more nodes among nodes[:i], the highest first
        if k == 0:
            if not must & ~chosen and all(h >= q for h, q in zip(have, needs, strict=True)):
                yield chosen
            return
        if any(h + b < q for h, b, q in zip(have, best[i][k], needs, strict=True)):
            return
        below = must & ((1 << nodes[i - 1] + 1) - 1)
        if below.bit_count() > k:
            return
        for top in range(k - 1, i):  # the highest of the k, lowest first: increasing value
            n = nodes[top]
            if below >> (n + 1):
                continue  # a must node between ``n`` and the last choice would be skipped
            step()
            more = [h + row[n] for h, (row, _) in zip(have, rows, strict=True)]
            yield from walk(top, k - 1, chosen | 1 << n, more)

    yield from walk(len(nodes), w, 0, [0] * len(rows))


def _colex_pred(
    w: int, allowed: int, ok: Callable[[int], bool], step: Callable[[], None]
) -> Iterator[int]:
    """Masks of ``w`` nodes of ``allowed`` in increasing value whose every partial
    choice (the highest nodes first) passes ``ok``; ``ok`` must hold for subsets of
    what it holds for."""
    nodes = bits(allowed)

    def walk(i: int, k: int, chosen: int) -> Iterator[int]:
        if k == 0:
            yield chosen
            return
        for top in range(k - 1, i):
            step()
            mask = chosen | 1 << nodes[top]
            if ok(mask):
                yield from walk(top, k - 1, mask)

    yield from walk(len(nodes), w, 0)
