"""The NUMA-distributing allocator: the kubelet's takeByTopologyNUMADistributed, as intended.

Pure core (reference/cpu-manager.md section 6, with the 2026 fixes #139778,
#139456 and #140730). It spreads a request evenly, in groups of ``g`` CPUs,
over the fewest NUMA nodes that can take it, choosing the combination that
leaves the free CPUs per NUMA node most balanced, and runs the packed
allocator inside each chosen node.

Where numad departs from the kubelet: the kubelet remembers its best
combination in a slice that later combinations overwrite (reference 13.1),
which changes about one multi-NUMA result in nine on machines of five or more
NUMA nodes and can loop forever; numad keeps its own copy (the vectors'
``expect_noalias``), and its remainder hand-out stops with an error instead
of looping when nothing more can be handed out.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from numad.errors import AllocationError
from numad.placement.managers.cpu.packed import Accumulator, Strategy, not_enough, take_packed
from numad.placement.managers.cpu.topology import CPUTopology


@dataclass(frozen=True, slots=True)
class _Choice:
    balance: float
    combo: tuple[int, ...]
    remainder: tuple[int, ...]
    one_socket: bool


def take_distributed(
    topo: CPUTopology,
    available: int,
    count: int,
    *,
    group_size: int = 1,
    strategy: Strategy = Strategy.PACKED,
    align_by_socket: bool = False,
    min_numas_from_hint: int = 0,
) -> int:
    """``count`` CPUs spread over NUMA nodes in groups of ``group_size``."""
    g = max(group_size, 1)
    if count % g:
        return take_packed(topo, available, count, strategy=strategy)
    acc = Accumulator(topo, available, count, strategy)
    if acc.satisfied():
        return acc.result
    if acc.failed():
        raise not_enough(count, available.bit_count())
    # A NUMA node that spans sockets is listed once per socket in socket-first
    # order; the kubelet then pairs a node with itself, subtracts its share
    # twice and can loop forever. Each node is a candidate once.
    numas = list(dict.fromkeys(acc.numa_order()))
    low, high = _numa_range(topo, acc, g, len(numas))
    if low < min_numas_from_hint <= high:
        low = min_numas_from_hint  # the hint's NUMA count is a floor when feasible
    for k in range(low, high + 1):
        best = _best_combo(topo, acc, numas, k, count=count, g=g, align_by_socket=align_by_socket)
        if best is not None:
            return _allocate(topo, acc, best, count=count, g=g, strategy=strategy)
    return take_packed(topo, available, count, strategy=strategy)


def _numa_range(
    topo: CPUTopology, acc: Accumulator, g: int, available_numas: int
) -> tuple[int, int]:
    total_numas = len(topo.numa)
    groups = (len(topo.cpus) - 1) // g + 1
    per_numa = (groups - 1) // total_numas + 1
    needed = (acc.needed - 1) // g + 1
    return (needed - 1) // per_numa + 1, min(needed, available_numas)


def _free(topo: CPUTopology, acc: Accumulator, numa: int) -> int:
    return (topo.numa[numa] & acc.free).bit_count()


def _best_combo(
    topo: CPUTopology,
    acc: Accumulator,
    numas: Sequence[int],
    k: int,
    *,
    count: int,
    g: int,
    align_by_socket: bool,
) -> _Choice | None:
    free = {n: _free(topo, acc, n) for n in numas}
    best: _Choice | None = None
    for combo in itertools.combinations(numas, k):
        if best is not None and best.balance == 0 and (not align_by_socket or best.one_socket):
            break
        if sum(free[n] for n in combo) < count or sum(free[n] // g * g for n in combo) < count:
            continue
        d = _distribution(count, combo, g, free, align_by_socket)
        if any(free[n] < d for n in combo):
            continue
        after = dict(free)
        for n in combo:
            after[n] -= d
        balance, remainder = _best_remainder(after, combo, count - d * k, g)
        if remainder is None:
            continue
        one_socket = len(topo.sockets_of(topo.numa_mask(combo))) == 1
        choice = _Choice(balance, combo, remainder, one_socket)
        if best is None or _better(choice, best, align_by_socket):
            best = choice
    return best


def _better(cand: _Choice, best: _Choice, align_by_socket: bool) -> bool:
    if align_by_socket and cand.one_socket != best.one_socket:
        return cand.one_socket
    return cand.balance < best.balance


def _distribution(
    count: int, combo: Sequence[int], g: int, free: dict[int, int], align_by_socket: bool
) -> int:
    d = count // len(combo) // g * g
    if align_by_socket:
        d = min(d, *(free[n] // g * g for n in combo))
    return d


def _best_remainder(
    after: dict[int, int], combo: Sequence[int], remainder: int, g: int
) -> tuple[float, tuple[int, ...] | None]:
    """The remainder subset that leaves the most balanced free counts (and that balance)."""
    if remainder == 0:
        return _balance(after.values()), ()
    candidates = [n for n in combo if after[n] >= g]
    best_balance, best_subset = math.inf, None
    for size in range(len(candidates), 0, -1):
        for subset in itertools.combinations(candidates, size):
            if sum(after[n] // g * g for n in subset) < remainder:
                continue
            trial = dict(after)
            left = remainder
            while left > 0:
                before = left
                for n in subset:
                    if left == 0:
                        break
                    if trial[n] >= g:
                        trial[n] -= g
                        left -= g
                if left == before:  # nothing more to hand out: never spin
                    break
            if left > 0:
                continue
            balance = _balance(trial.values())
            if balance < best_balance:
                best_balance, best_subset = balance, subset
    return best_balance, best_subset


def _balance(values: Iterable[int]) -> float:
    """Population standard deviation, mean and result rounded to 3 decimals as Go rounds."""
    xs = list(values)
    mean = _round3(sum(xs) / len(xs))
    return _round3(math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs)))


def _round3(x: float) -> float:
    """Go's math.Round(x*1000)/1000: halves away from zero (Python's round() is to even)."""
    scaled = x * 1000
    whole = math.floor(scaled)
    if scaled - whole >= 0.5:
        whole += 1
    return whole / 1000


def _allocate(
    topo: CPUTopology, acc: Accumulator, best: _Choice, *, count: int, g: int, strategy: Strategy
) -> int:
    k = len(best.combo)
    d = count // k // g * g
    d = min(d, *(_free(topo, acc, n) // g * g for n in best.combo))
    for n in best.combo:
        acc.take(take_packed(topo, topo.numa[n] & acc.free, d, strategy=strategy))
    left = count - d * k
    while left > 0:
        handed = False
        for n in best.remainder:
            if left == 0:
                break
            if _free(topo, acc, n) < g:
                continue
            acc.take(take_packed(topo, topo.numa[n] & acc.free, g, strategy=strategy))
            left -= g
            handed = True
        if not handed:  # the kubelet would spin here forever (reference 13.1)
            break
    if acc.needed > 0:
        raise AllocationError(
            "cpu", f"accounting error, not enough CPUs allocated, remaining: {acc.needed}"
        )
    if acc.needed < 0:
        raise AllocationError(
            "cpu", f"accounting error, too many CPUs allocated, remaining: {acc.needed}"
        )
    return acc.result
