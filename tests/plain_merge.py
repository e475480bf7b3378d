"""A plain enumeration of the kubelet's merge, written straight from the reference.

Tests only (and the benchmark's ratio): it walks the whole Cartesian product of
the hint lists, exactly as reference/topology-manager.md sections 2.1-2.7 say,
sharing no code with numad.placement.merge but the input types.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from numad.placement.hints import ProviderHints
from numad.placement.hintspace import listed

Mask = int | None
Flat = tuple[str, list[tuple[Mask, bool, int]]]


def plain_merge(  # noqa: PLR0912 - one straight walk, as the reference reads
    policy: str,
    nodes: Sequence[int],
    providers: Sequence[ProviderHints],
    *,
    prefer_closest: bool = False,
    strategy: str = "none",
    weights: Mapping[str, int] | None = None,
    distances: Mapping[int, Mapping[int, int]] | None = None,
) -> tuple[list[int] | None, bool, int, bool]:
    """(affinity, preferred, score, admit) by walking every permutation."""
    if policy == "none":
        return None, False, 0, True
    default = sum(1 << n for n in nodes)
    flat = _flatten(providers)
    if policy == "single-numa-node":
        flat = [
            (name, [h for h in hints if h[1] and (h[0] is None or h[0].bit_count() == 1)])
            for name, hints in flat
        ]
        prefer_closest = False
    best_np = max(
        (
            min(m.bit_count() for m, _, _ in hints if m is not None)
            for _, hints in flat
            if any(m is not None for m, _, _ in hints)
        ),
        default=0,
    )

    def avg(mask: int) -> float:
        assert distances is not None
        ns = [i for i in range(64) if mask >> i & 1]
        return sum(distances[a].get(b, 0) for a in ns for b in ns) / (len(ns) ** 2)

    def structural(a: int, b: int) -> int:
        if prefer_closest and a.bit_count() == b.bit_count():
            if avg(a) != avg(b):
                return a if avg(a) < avg(b) else b
            return a if a < b else b
        if a.bit_count() != b.bit_count():
            return a if a.bit_count() < b.bit_count() else b
        return a if a < b else b

    def mask_compare(
        inc: tuple[int, bool, int], cand: tuple[int, bool, int]
    ) -> tuple[int, bool, int]:
        if inc[0] == cand[0]:
            return inc
        fit = inc[0].bit_count() == cand[0].bit_count() and (
            not prefer_closest or avg(inc[0]) == avg(cand[0])
        )
        if strategy not in ("", "none") and fit and inc[2] and cand[2] and inc[2] != cand[2]:
            if strategy == "most-allocated":
                return cand if cand[2] > inc[2] else inc
            return cand if cand[2] < inc[2] else inc
        return inc if structural(inc[0], cand[0]) == inc[0] else cand

    best: tuple[int, bool, int] | None = None
    for perm in itertools.product(*(hints for _, hints in flat)):
        mask, preferred, first = default, True, None
        total = weight = 0
        for (name, _), (m, p, s) in zip(flat, perm, strict=True):
            preferred = preferred and p
            if m is None:
                continue
            mask &= m
            if first is None:
                first = m
            elif m != first:
                preferred = False
            w = (weights or {}).get(name, 1)
            if s > 0 and w:
                total += w * s
                weight += w
        cand = (mask, preferred, total // weight if weight else 0)
        if mask == 0:
            continue
        if best is None or (cand[1] and not best[1]):
            best = cand
        elif best[1] and not cand[1]:
            pass
        elif best[1] and cand[1]:
            best = mask_compare(best, cand)
        else:
            wi, wc = best[0].bit_count(), cand[0].bit_count()
            if wi > best_np:
                best = mask_compare(best, cand)
            elif wi == best_np:
                if wc == best_np:
                    best = mask_compare(best, cand)
            elif wc > best_np:
                pass
            elif wc == best_np or wc > wi:
                best = cand
            elif wc == wi:
                best = mask_compare(best, cand)
    if best is None:
        best = (default, False, 0)
    affinity: list[int] | None = [n for n in range(64) if best[0] >> n & 1]
    score = best[2]
    if policy == "single-numa-node" and best[0] == default:
        affinity, score = None, 0
    admit = policy == "best-effort" or best[1]
    return affinity, best[1], score, admit


def _flatten(providers: Sequence[ProviderHints]) -> list[Flat]:
    flat: list[Flat] = []
    for provider in providers:
        if not provider:
            flat.append(("", [(None, True, 0)]))
            continue
        for name in sorted(provider):
            hints = listed(provider[name])  # a described answer, as the kubelet lists it
            if hints is None:
                flat.append((name, [(None, True, 0)]))
            elif not hints:
                flat.append((name, [(None, False, 0)]))
            else:
                flat.append((name, [(h.mask, h.preferred, h.score) for h in hints]))
    return flat
