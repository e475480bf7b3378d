"""NUMA hints: what each hint provider says about where a resource could live.

Pure values, shared by the CPU, memory and device managers (which produce
them) and the merger (which combines them). A hint's affinity is a NodeSet,
or None for "any node / no preference". A provider answers with a mapping
from resource name to a hint list, where (as in the kubelet):

* a resource mapped to ``None`` has no preference;
* a resource mapped to an empty tuple cannot be placed anywhere;
* an empty mapping means the provider has no preference at all.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from numad.placement.hintspace import Hint, HintSpace

__all__ = ["Hint", "HintList", "ProviderHints", "flatten", "masks_in_kubelet_order", "subset_sums"]


# A resource's hints: listed, described (numad.placement.hintspace), or None for no preference.
ProviderHints = Mapping[str, Sequence[Hint] | HintSpace | None]


@dataclass(frozen=True, slots=True)
class HintList:
    """One list of the merge: a resource's hints, in the order they were given."""

    provider: int  # index of the provider, in registration order
    resource: str  # "" for a provider with no preference at all
    hints: tuple[Hint, ...]
    given: tuple[Hint, ...] | None  # the provider's own list (None: no preference, or described)
    space: HintSpace | None = None  # described instead of listed: ``hints`` is empty


_ANY = Hint(affinity=None, preferred=True)
_NOWHERE = Hint(affinity=None, preferred=False)


def flatten(providers: Sequence[ProviderHints]) -> tuple[HintList, ...]:
    """The merge's lists, in the order the kubelet walks them.

    Providers in registration order; a provider's resources in sorted name
    order (the kubelet uses Go's random map order; numad fixes it).
    """
    lists: list[HintList] = []
    for index, provider in enumerate(providers):
        if not provider:
            lists.append(HintList(index, "", (_ANY,), None))
            continue
        for resource in sorted(provider):
            given = provider[resource]
            if given is None:
                lists.append(HintList(index, resource, (_ANY,), None))
            elif not isinstance(given, Sequence):  # a HintSpace
                if given.first() is None:
                    lists.append(HintList(index, resource, (_NOWHERE,), ()))
                else:
                    lists.append(HintList(index, resource, (), None, given))
            elif not given:
                lists.append(HintList(index, resource, (_NOWHERE,), ()))
            else:
                lists.append(HintList(index, resource, tuple(given), tuple(given)))
    return tuple(lists)


def subset_sums(values: Sequence[int]) -> list[int]:
    """``sums[m]`` = sum of ``values[i]`` for every bit i of m, for all 2^n masks m."""
    sums = [0] * (1 << len(values))
    for m in range(1, len(sums)):
        low = m & -m
        sums[m] = sums[m ^ low] + values[low.bit_length() - 1]
    return sums


def masks_in_kubelet_order(n: int) -> Iterator[tuple[int, tuple[int, ...]]]:
    """Every non-empty subset of positions 0..n-1 as (bit mask, positions): by width,
    then lexicographically, as the kubelet's providers enumerate NUMA masks."""
    for width in range(1, n + 1):
        for combo in itertools.combinations(range(n), width):
            mask = 0
            for i in combo:
                mask |= 1 << i
            yield mask, combo
