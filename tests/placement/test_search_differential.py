"""The merge by search against the fold over listed hints, on 100,000 seeded random pods.

Issue 14: numad's providers describe their hints (numad.placement.hintspace) and the merge
searches them (numad.placement.search); the fold of numad.placement.merge over the kubelet's lists,
exact and checked against every conformance vector, is the reference. Each pod
gets random machines of 1-16 nodes (some memory-only, some CPU-less), random
provider answers shaped as the real providers' (CPU: free CPUs per node and
reused CPUs; memory: several dimensions and the group rule; devices: reused
devices), sometimes a provider without preference or with nowhere to go, a
random policy and random options (prefer-closest over random distances, an allocation
strategy and score weights, which unscored hints leave without effect). The
decision of ``numad.placement.policy.merge`` on the described answers must equal the one
on the same answers listed. Small machines are drawn more often than large
ones (the listing costs 2^N per list).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from numad.cpuset import NodeSet
from numad.placement import policy as policy_module
from numad.placement import search
from numad.placement.hints import ProviderHints
from numad.placement.hintspace import HintSpace, listed, min_width
from numad.placement.merge import Merged, Strategy
from numad.placement.policy import Decision, Machine, Policy, PolicyOptions, merge
from numad.placement.search import LISTABLE

PODS = 100_000
CHUNKS = 50
SEED = 1414
POLICIES = (Policy.BEST_EFFORT, Policy.RESTRICTED, Policy.SINGLE_NUMA_NODE)
# Node counts and their weights: the listed fold costs ~2^N, so large machines are rarer:
# about 6,000 pods of each size up to 9 nodes, then fewer, down to ~150 of 16 nodes.
SIZES = tuple(range(1, LISTABLE + 1))
WEIGHTS = tuple(4.0 if n <= 9 else 4.0 * 2.0 ** ((9 - n) / 1.4) for n in SIZES)


def _bits(mask: int) -> list[int]:
    return [n for n in range(mask.bit_length()) if mask >> n & 1]


def _subset(rng: random.Random, mask: int, p: float) -> int:
    return sum(1 << n for n in _bits(mask) if rng.random() < p)


def _cpu(rng: random.Random, cpu_nodes: int, size: int) -> HintSpace | tuple[()]:
    capacity = [0] * size
    free = [0] * size
    per = rng.choice((1, 2, 4, 8))
    for n in _bits(cpu_nodes):
        capacity[n] = per if rng.random() < 0.8 else rng.randint(1, 2 * per)
        free[n] = rng.choice((0, capacity[n], rng.randint(0, capacity[n])))
    must = _subset(rng, cpu_nodes, 0.1) if rng.random() < 0.15 else 0
    total = sum(capacity)
    count = rng.randint(1, max(1, total))
    reused = min(count, must.bit_count() * rng.randint(0, 2))
    if reused < must.bit_count():
        must = 0
        reused = 0
    width = min_width((tuple(capacity),), (count,), cpu_nodes)
    sockets: tuple[int, ...] = ()
    min_sockets = 0
    if rng.random() < 0.1 and cpu_nodes.bit_count() >= 2:
        ids = _bits(cpu_nodes)
        cut = rng.randint(1, len(ids) - 1)
        sockets = (sum(1 << n for n in ids[:cut]), sum(1 << n for n in ids[cut:]))
        per_socket = max(1, len(ids) // 2)
        min_sockets = (width + per_socket - 1) // per_socket
    return HintSpace(
        cpu_nodes,
        (tuple(free),),
        (count - reused,),
        width,
        must=must,
        sockets=sockets,
        min_sockets=min_sockets,
    )


def _memory(rng: random.Random, mem_nodes: int, size: int) -> HintSpace:
    dims = rng.choice((1, 2, 2, 3))
    capacity = [[0] * size for _ in range(dims)]
    free = [[0] * size for _ in range(dims)]
    for d in range(dims):
        for n in _bits(mem_nodes):
            capacity[d][n] = rng.choice((0, 4, 8, 8, 16)) if d else rng.choice((8, 16, 16, 32))
            free[d][n] = rng.choice((capacity[d][n], rng.randint(0, capacity[d][n]), 0))
    need = tuple(
        rng.randint(1, max(1, sum(capacity[d]) // rng.choice((1, 2, 4)))) for d in range(dims)
    )
    # The group rule: some nodes in multi-node groups, some used single-NUMA, the rest free.
    groups: list[int] = []
    left = mem_nodes
    while left and rng.random() < 0.3:
        g = _subset(rng, left, 0.4)
        if g.bit_count() >= 2:
            groups.append(g)
            left &= ~g
    singles_used = _subset(rng, left, 0.2)
    pool = left & ~singles_used
    singles = left
    width = min_width(tuple(tuple(r) for r in capacity), need, mem_nodes)
    return HintSpace(
        mem_nodes,
        tuple(tuple(r) for r in free),
        need,
        width,
        pool=pool,
        singles=singles,
        groups=tuple(sorted(groups)),
    )


def _devices(rng: random.Random, nodes: int, size: int) -> HintSpace | tuple[()]:
    total = [0] * size
    usable = [0] * size
    for n in _bits(nodes):
        total[n] = rng.choice((0, 0, 1, 2, 4))
        usable[n] = rng.randint(0, total[n])
    must = _subset(rng, nodes, 0.1) if rng.random() < 0.1 else 0
    placed = must.bit_count()
    count = rng.randint(1, max(1, sum(total) + placed))
    if sum(usable) + placed < count:
        return ()
    return HintSpace(
        nodes,
        (tuple(usable),),
        (count - placed,),
        min_width((tuple(total),), (count,), nodes),
        must=must,
    )


def _distances(rng: random.Random, n: int) -> dict[int, dict[int, int]]:
    table = {a: {a: 10} for a in range(n)}
    for a in range(n):
        for b in range(a + 1, n):
            table[a][b] = table[b][a] = rng.choice((11, 12, 16, 20, 21, 32))
    return table


def pods(chunk: int) -> Iterator[tuple[Policy, PolicyOptions, Machine, list[ProviderHints]]]:
    """The chunk's share of the seeded pods."""
    rng = random.Random(SEED * 1000 + chunk)  # noqa: S311 - seeded: reproducible
    for _ in range(PODS // CHUNKS):
        n = rng.choices(SIZES, WEIGHTS)[0]
        all_nodes = (1 << n) - 1
        memory_only = _subset(rng, all_nodes, 0.25) if n > 1 else 0
        cpu_nodes = all_nodes & ~memory_only or all_nodes
        cpu_less_no_memory = _subset(rng, cpu_nodes, 0.1) if n > 2 else 0
        mem_nodes = all_nodes & ~cpu_less_no_memory or all_nodes
        providers: list[ProviderHints] = []
        kinds = rng.sample(("device", "cpu", "memory"), rng.randint(1, 3))
        for kind in ("device", "cpu", "memory"):  # the kubelet's registration order
            if kind not in kinds:
                providers.append({})
            elif kind == "device":
                providers.append({"example.com/dev": _devices(rng, all_nodes, n)})
            elif kind == "cpu":
                providers.append({"cpu": _cpu(rng, cpu_nodes, n)})
            else:
                space = _memory(rng, mem_nodes, n)
                names = ("memory", "hugepages-2Mi", "hugepages-1Gi")[: len(space.need)]
                providers.append(dict.fromkeys(names, space))
        if rng.random() < 0.05:
            providers.append({"example.com/other": None})
        policy = rng.choice(POLICIES)
        closest = rng.random() < 0.3
        strategy = rng.choice(list(Strategy))  # no effect on unscored hints, in either merge
        weights = {"cpu": rng.randint(0, 100), "memory": rng.randint(0, 100)}
        options = PolicyOptions(
            prefer_closest=closest,
            strategy=strategy,
            weights=weights if rng.random() < 0.3 else None,
            max_numa_nodes=rng.choice((None, 16)),
        )
        machine = Machine(NodeSet(range(n)), _distances(rng, n))
        yield policy, options, machine, providers


def _as_lists(providers: list[ProviderHints]) -> list[ProviderHints]:
    return [{r: listed(v) for r, v in p.items()} for p in providers]


def _decision(d: Decision) -> tuple[object, ...]:
    return (d.affinity, d.preferred, d.score, d.admit)


class _Counted(search.Search):
    """The search, counting the merges that ran out of budget (those fall back to the
    fold on machines this small, so they would compare equal without proving anything)."""

    exhausted = 0

    def run(self) -> Merged:
        try:
            return super().run()
        except search.SearchBudgetError:
            _Counted.exhausted += 1
            raise


@pytest.mark.parametrize("chunk", range(CHUNKS))
def test_the_search_decides_as_the_fold_of_the_listed_hints(
    chunk: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(policy_module, "Search", _Counted)
    _Counted.exhausted = 0
    wrong = []
    for i, (policy, options, machine, providers) in enumerate(pods(chunk)):
        searched = merge(policy, options, machine, providers)
        folded = merge(policy, options, machine, _as_lists(providers))
        if _decision(searched) != _decision(folded):
            wrong.append((i, policy, options, machine.nodes, providers, searched, folded))
    assert not wrong, f"{len(wrong)} of {PODS // CHUNKS} differ; first: {wrong[0]}"
    assert _Counted.exhausted == 0, f"{_Counted.exhausted} searches ran out of budget"
