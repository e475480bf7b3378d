"""The hint merger: the kubelet Topology Manager's merge, without walking the product.

Pure core: no I/O, no clock, no logging. The kubelet folds a comparator over
every permutation of the hint lists (one hint from each list), first list
outermost. numad reaches the same result from the structure of that fold
(reference/topology-manager.md, section 2):

1. A preferred merged hint, once seen, is never displaced by a non-preferred
   one, and the first one seen always displaces a non-preferred incumbent. So
   if any permutation is preferred (every hint preferred, every non-nil mask
   identical), the result is the fold over preferred permutations alone. Those
   are found from the masks that every list offers as preferred (or covers
   with a preferred nil hint) — no product needed.
2. Otherwise every merged hint is non-preferred, and the comparator's width
   rules around B (the best non-preferred width) settle on one width class:
   B if any reachable mask has width B; else the widest reachable below B;
   else the narrowest above B. The reachable masks are computed exactly as a
   count of permutations per merged mask (superset zeta transform per list,
   product, Moebius inversion) over the 2^N masks of the machine's N nodes.
3. Within the class the best mask under the structural order wins, carrying
   the score of the first permutation (in iteration order) that reaches it,
   found by a depth-first search in that order.

The allocation strategy compares scores, which makes the comparator
non-transitive; when it can fire (a strategy is set and some hint that counts
has a score), steps 1 and 3 instead fold the exact sequence of preferred
permutations, or of permutations in the decisive width class, in iteration
order. That sequence is usually short; its length is the only cost that still
grows with the product.

This fold needs the lists, and its tables have 2^N entries: it serves listed
(and scored) hints on machines of up to 16 nodes. numad's own providers
describe their hints instead (numad.placement.hintspace), and ``numad.placement.search`` finds the
same answer by searching node sets in the comparator's order. Where that
search has no tractable exact answer (deciding whether a mask is reachable is
an assignment of nodes to lists within their slack, a bin packing; and when B
itself is unreachable the decisive width must be searched for), it works to a
step budget: past it, a machine of at most 16 nodes gets this fold (exact),
a larger one the rule stated in ``numad.placement.search`` (the best width-B mask found
within the budget, else the machine's mask, not preferred), which is exact on
every instance that finishes within the budget. tests/test_search_differential.py
checks the search against this fold on 100,000 random pods of 1-16 nodes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import numpy as np

from numad.placement.hints import HintList


class Strategy(StrEnum):
    """numa-allocation-strategy."""

    NONE = "none"
    MOST_ALLOCATED = "most-allocated"
    LEAST_ALLOCATED = "least-allocated"


@dataclass(frozen=True, slots=True)
class Merged:
    """A merged hint: ``mask`` is a node bit mask (0 never wins)."""

    mask: int
    preferred: bool
    score: int


Distance = Callable[[int, int], int]


@dataclass(frozen=True, slots=True)
class _Candidate:
    mask: int
    preferred: bool
    score: int


class Merger:
    """One merge of ``lists`` on a machine whose nodes form ``default``."""

    def __init__(
        self,
        lists: Sequence[HintList],
        default: int,
        *,
        distance: Distance | None = None,
        strategy: Strategy = Strategy.NONE,
        weights: Mapping[str, int] | None = None,
    ) -> None:
        self.lists = [tuple(h.mask for h in hl.hints) for hl in lists]
        self.preferred = [tuple(h.preferred for h in hl.hints) for hl in lists]
        self.scores = [tuple(h.score for h in hl.hints) for hl in lists]
        self.weights = [(weights or {}).get(hl.resource, 1) for hl in lists]
        self.default = default
        self.distance = distance
        self.strategy = strategy
        self._avg: dict[int, float] = {}
        self.best_width = _best_non_preferred_width(self.lists)

    # -- the comparator (reference 2.5, 2.6) ---------------------------------

    def key(self, mask: int) -> tuple[int, float, int]:
        """Structural order: narrowest, then (prefer-closest) lowest mean distance, then value."""
        return (mask.bit_count(), self._average_distance(mask), mask)

    def _average_distance(self, mask: int) -> float:
        if self.distance is None:
            return 0.0
        avg = self._avg.get(mask)
        if avg is None:
            nodes = _bits(mask)
            total = sum(self.distance(a, b) for a in nodes for b in nodes)
            avg = total / (len(nodes) * len(nodes)) if nodes else 0.0
            self._avg[mask] = avg
        return avg

    def mask_compare(self, inc: _Candidate, cand: _Candidate) -> _Candidate:
        if inc.mask == cand.mask:
            return inc
        # The strategy only breaks ties the structure leaves (reference 2.6).
        if (
            self.strategy is not Strategy.NONE
            and self._equally_fit(inc.mask, cand.mask)
            and inc.score
            and cand.score
            and inc.score != cand.score
        ):
            higher = cand.score > inc.score
            wins = higher if self.strategy is Strategy.MOST_ALLOCATED else not higher
            return cand if wins else inc
        return cand if self.key(cand.mask) < self.key(inc.mask) else inc

    def _equally_fit(self, a: int, b: int) -> bool:
        return a.bit_count() == b.bit_count() and (
            self.distance is None or self._average_distance(a) == self._average_distance(b)
        )

    def compare(self, inc: _Candidate | None, cand: _Candidate) -> _Candidate | None:
        """The kubelet's comparator: the new incumbent after offering ``cand``."""
        if cand.mask == 0:
            return inc
        if inc is None or (cand.preferred and not inc.preferred):
            return cand
        if inc.preferred:
            return self.mask_compare(inc, cand) if cand.preferred else inc
        b, wi, wc = self.best_width, inc.mask.bit_count(), cand.mask.bit_count()
        if wi > b or (wi == b and wc == b) or (wi < b and wc == wi):
            return self.mask_compare(inc, cand)
        if wi == b or wc > b or wc < wi:
            return inc
        return cand  # wi < b and wi < wc <= b: creep toward B

    # -- merged hints of one permutation (reference 2.4) -------------------------

    def merged(self, picks: Sequence[int]) -> _Candidate:
        mask, first, preferred = self.default, None, True
        for i, j in enumerate(picks):
            m = self.lists[i][j]
            preferred = preferred and self.preferred[i][j]
            if m is not None:
                mask &= m
                if first is None:
                    first = m
                elif m != first:
                    preferred = False
        return _Candidate(mask, preferred, self.score(picks))

    def score(self, picks: Sequence[int]) -> int:
        total = weight = 0
        for i, j in enumerate(picks):
            if self.lists[i][j] is None or self.scores[i][j] <= 0 or self.weights[i] == 0:
                continue
            total += self.weights[i] * self.scores[i][j]
            weight += self.weights[i]
        return total // weight if weight else 0

    def _scores_matter(self) -> bool:
        return self.strategy is not Strategy.NONE and any(
            w and any(s > 0 and m is not None for s, m in zip(sc, ms, strict=True))
            for w, sc, ms in zip(self.weights, self.scores, self.lists, strict=True)
        )

    # -- the merge -------------------------------------------------------------

    def run(self) -> Merged:
        best = self._preferred_phase()
        if best is None:
            best = self._non_preferred_phase()
        if best is None:
            return Merged(self.default, preferred=False, score=0)
        return Merged(best.mask, best.preferred, best.score)

    def _preferred_phase(self) -> _Candidate | None:
        sources = _preferred_sources(self.lists, self.preferred)
        by_mask: dict[int, list[tuple[int, ...]]] = {}
        for source in sources:
            common = self.default if source.mask is None else source.mask
            by_mask.setdefault(self.default & common, []).append(source.first())
        by_mask.pop(0, None)
        if not by_mask:
            return None
        if self._scores_matter():
            return self._fold(sorted(p for source in sources for p in source.all()))
        best = min(by_mask, key=self.key)
        first = min(by_mask[best])
        return _Candidate(best, preferred=True, score=self.score(first))

    def _fold(self, perms: Sequence[Sequence[int]]) -> _Candidate | None:
        inc: _Candidate | None = None
        for p in perms:
            inc = self.compare(inc, self.merged(p))
        return inc

    def _non_preferred_phase(self) -> _Candidate | None:
        reachable = reachable_masks(self.lists, self.default)
        if not reachable:
            return None
        width = _decisive_width(reachable, self.best_width)
        if self._scores_matter():
            return self._fold(list(self._permutations_of_width(width)))
        best = min((m for m in reachable if m.bit_count() == width), key=self.key)
        picks = self._first_permutation(best)
        return _Candidate(best, preferred=False, score=self.score(picks))

    def _restricted(self, i: int) -> list[tuple[int, int]]:
        return [
            (j, self.default if m is None else m & self.default)
            for j, m in enumerate(self.lists[i])
        ]

    def _first_permutation(self, target: int) -> tuple[int, ...]:
        """The first permutation, in iteration order, whose merged mask is ``target``."""
        options = [
            [(j, m) for j, m in self._restricted(i) if m & target == target]
            for i in range(len(self.lists))
        ]
        distinct = [sorted({m for _, m in opts}) for opts in options]
        memo: dict[tuple[int, int], bool] = {}

        def completes(k: int, current: int) -> bool:
            if k == len(distinct):
                return current == target
            key = (k, current)
            if key not in memo:
                memo[key] = any(completes(k + 1, current & m) for m in distinct[k])
            return memo[key]

        picks: list[int] = []
        current = self.default
        for k, opts in enumerate(options):
            j, m = next((j, m) for j, m in opts if completes(k + 1, current & m))
            picks.append(j)
            current &= m
        return tuple(picks)

    def _permutations_of_width(self, width: int) -> itertools.chain[tuple[int, ...]]:
        """Permutations whose merged mask has ``width`` nodes, in iteration order."""
        restricted = [self._restricted(i) for i in range(len(self.lists))]

        def walk(k: int, current: int, prefix: tuple[int, ...]) -> itertools.chain[tuple[int, ...]]:
            if current.bit_count() < width:  # an AND only ever narrows
                return itertools.chain()
            if k == len(restricted):
                return itertools.chain((prefix,) if current.bit_count() == width else ())
            return itertools.chain.from_iterable(
                walk(k + 1, current & m, (*prefix, j)) for j, m in restricted[k]
            )

        return walk(0, self.default, ())


# -- preferred permutations ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Source:
    """The preferred permutations that share one common mask (None: all-nil)."""

    mask: int | None
    choices: tuple[tuple[int, ...], ...]  # per list, the qualifying hint indexes
    needed: tuple[tuple[int, ...], ...] | None  # per list, the indexes holding the mask

    def first(self) -> tuple[int, ...]:
        """The first permutation of this source in iteration order."""
        first = tuple(c[0] for c in self.choices)
        if self.needed is None or any(f in n for f, n in zip(first, self.needed, strict=True)):
            return first
        # Every list's first choice is a nil hint: the last list that holds the
        # mask must switch to its first mask hint (changing a later position
        # keeps the tuple smallest).
        last = max(i for i, n in enumerate(self.needed) if n)
        return (*first[:last], self.needed[last][0], *first[last + 1 :])

    def all(self) -> list[tuple[int, ...]]:
        perms = itertools.product(*self.choices)
        if self.needed is None:
            return list(perms)
        needed = [set(n) for n in self.needed]
        return [p for p in perms if any(j in n for j, n in zip(p, needed, strict=True))]


def _preferred_sources(
    lists: Sequence[tuple[int | None, ...]], preferred: Sequence[tuple[bool, ...]]
) -> list[_Source]:
    nils: list[tuple[int, ...]] = []
    by_mask: list[dict[int, list[int]]] = []
    for masks, prefs in zip(lists, preferred, strict=True):
        nil: list[int] = []
        held: dict[int, list[int]] = {}
        for j, (m, p) in enumerate(zip(masks, prefs, strict=True)):
            if p:
                if m is None:
                    nil.append(j)
                else:
                    held.setdefault(m, []).append(j)
        nils.append(tuple(nil))
        by_mask.append(held)
    strict_lists = [held for held, nil in zip(by_mask, nils, strict=True) if not nil]
    if strict_lists:
        common = set(strict_lists[0]).intersection(*strict_lists[1:])
    else:
        common = set().union(*by_mask)
    sources = []
    for mask in sorted(common):
        needed = tuple(tuple(held.get(mask, ())) for held in by_mask)
        choices = tuple(tuple(sorted((*nil, *n))) for nil, n in zip(nils, needed, strict=True))
        sources.append(_Source(mask, choices, needed))
    if all(nils):
        sources.append(_Source(None, tuple(nils), None))
    return sources


# -- reachable merged masks --------------------------------------------------------


def reachable_masks(lists: Sequence[tuple[int | None, ...]], default: int) -> list[int]:
    """Every non-empty mask some permutation merges to, exactly.

    For each list, count its hints by mask (over the N nodes of ``default``),
    take the superset sums (how many hints contain each mask), multiply over
    the lists (how many permutations merge to a superset of each mask), and
    invert (how many merge to exactly each mask). Counts are exact integers.
    """
    nodes = _bits(default)
    n = len(nodes)
    size = 1 << n
    product = np.ones(size, dtype=object)
    for masks in lists:
        counts = np.bincount(
            np.fromiter(
                (_compress(m, nodes, default) for m in masks), dtype=np.int64, count=len(masks)
            ),
            minlength=size,
        )
        product = product * _superset_sum(counts.astype(np.int64)).astype(object)
    exact = _superset_difference(product)
    found = np.flatnonzero(exact != 0)
    return [_expand(int(c), nodes) for c in found if c != 0]


def _superset_sum(values: np.ndarray) -> np.ndarray:
    n = values.size.bit_length() - 1
    out = values.copy()
    for bit in range(n):
        view = out.reshape(-1, 2, 1 << bit)
        view[:, 0, :] += view[:, 1, :]
    return out


def _superset_difference(values: np.ndarray) -> np.ndarray:
    n = values.size.bit_length() - 1
    out = values.copy()
    for bit in range(n):
        view = out.reshape(-1, 2, 1 << bit)
        view[:, 0, :] -= view[:, 1, :]
    return out


def _compress(mask: int | None, nodes: Sequence[int], default: int) -> int:
    """A node mask as bits 0..N-1 over the machine's nodes (nil: all of them)."""
    if mask is None:
        return (1 << len(nodes)) - 1
    if default == (1 << len(nodes)) - 1:
        return mask & default
    return sum(1 << i for i, node in enumerate(nodes) if mask >> node & 1)


def _expand(compressed: int, nodes: Sequence[int]) -> int:
    return sum(1 << node for i, node in enumerate(nodes) if compressed >> i & 1)


def _decisive_width(reachable: Sequence[int], best: int) -> int:
    widths = {m.bit_count() for m in reachable}
    if best in widths:
        return best
    below = [w for w in widths if w < best]
    return max(below) if below else min(widths)


def _best_non_preferred_width(lists: Sequence[tuple[int | None, ...]]) -> int:
    """Max over lists of the width of the list's narrowest non-nil hint."""
    widths = [
        min(m.bit_count() for m in masks if m is not None)
        for masks in lists
        if any(m is not None for m in masks)
    ]
    return max(widths, default=0)


def _bits(mask: int) -> list[int]:
    return [i for i in range(mask.bit_length()) if mask >> i & 1]
