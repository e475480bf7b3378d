"""Resize in place: one container's exclusive CPUs and memory grown or shrunk on ``Books``.

Pure core, beside ``numad.placement.admission``: ``resize`` returns new books, or the
old ones and the reason it refuses; it never changes the books it is given.

CPUs. Growing keeps every CPU the container holds and adds the free CPUs nearest to
them, level by level, each level through the CPU manager's takeByTopology
(``StaticPolicy.take``) so a level's CPUs are taken packed, whole cores first:

1. the other threads of the cores it holds;
2. the rest of the L3 (uncore) groups it touches, on its NUMA nodes;
3. the rest of the NUMA nodes it is on;
4. only under ``best-effort`` or ``none``: the rest of its L3 groups (one may span
   nodes), then the other nodes, nearest first by NUMA distance. Under
   ``restricted`` and ``single-numa-node`` the container stays on the nodes it spans
   now (its alignment was decided on them); where they have too few free CPUs it is
   refused here; the daemon then re-places a movable workload whole
   (``numad.placement.moves.replace_grown``).

A level is used only once the nearer ones have no free CPU left. Shrinking keeps a
compact subset: one CPU at a time it gives back the CPU whose node, then L3 group,
then core holds the fewest of its CPUs (the highest id among equals), so a node or
group it barely touches is left first and whole cores go together.

Memory (the memory manager's ``memory`` resource) stays on the nodes of its block:
growing adds to its split, lowest node first, as far as those nodes have free
memory; shrinking takes from its split, highest node first. Devices and hugepages
are not resized. A container on the shared pool is not given exclusive CPUs, nor an
exclusive one put on the pool: that changes its QoS class, which the kubelet refuses
in place too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from numad.cpuset import CPUSet, NodeSet
from numad.errors import AllocationError
from numad.placement.admission import Books, Engine
from numad.placement.managers.cpu.topology import CPUTopology, bits
from numad.placement.managers.memory import MEMORY, Block, MemoryState
from numad.placement.policy import Policy

Key = tuple[str, str]  # (workload, container)
# Policies under which a container may grow onto nodes it does not span yet.
SPREADING = frozenset({Policy.BEST_EFFORT, Policy.NONE})


@dataclass(frozen=True, slots=True)
class Resize:
    """The books after a resize, or the old books and why not (``refused``)."""

    books: Books
    refused: str = ""
    added: CPUSet = field(default_factory=CPUSet)
    removed: CPUSet = field(default_factory=CPUSet)


def resize(
    engine: Engine,
    books: Books,
    key: Key,
    *,
    cpus: int | None = None,
    memory: int | None = None,
    policy: Policy | None = None,
    movable: bool = False,
) -> Resize:
    """``key``'s container resized to ``cpus`` exclusive CPUs and ``memory`` bytes
    (None: as it is); ``policy`` is the workload's topology policy (default the
    host's). Atomic: refused, nothing changes."""
    policy = policy or engine.policy
    new = books
    added = removed = 0
    if cpus is not None:
        held = books.cpu.assignments.get(key, 0)
        try:
            new, added, removed = _cpus(engine, books, key, held, cpus, policy, movable)
        except AllocationError as err:
            return Resize(books, f"{err.problem}{'; ' + err.hint if err.hint else ''}")
    if memory is not None and engine.memory_manager:
        try:
            new = replace(new, memory=_memory(new, key, memory))
        except AllocationError as err:
            return Resize(books, err.problem)
    return Resize(new, "", CPUSet.from_bits(added), CPUSet.from_bits(removed))


# -- CPUs --------------------------------------------------------------------------------


def _cpus(  # noqa: PLR0917 - resize's parts, passed on
    engine: Engine, books: Books, key: Key, held: int, cpus: int, policy: Policy, movable: bool
) -> tuple[Books, int, int]:
    """The books with the container on ``cpus`` CPUs, the CPUs added and removed."""
    have = held.bit_count()
    if cpus == have:
        return books, 0, 0
    if not held:
        raise AllocationError(
            "cpus",
            "it runs on the shared pool: exclusive CPUs change its QoS class",
            "release it and admit it again with exclusive CPUs",
        )
    if cpus <= 0:
        raise AllocationError(
            "cpus",
            "it holds exclusive CPUs: the shared pool changes its QoS class",
            "release it and admit it again on the shared pool",
        )
    topo = engine.cpu_policy.topo
    per_core = topo.cpus_per_core
    if engine.cpu_policy.options.full_pcpus_only and per_core and cpus % per_core:
        raise AllocationError(
            "cpus",
            f"full-pcpus-only: {cpus} is not a multiple of {per_core} CPUs per core",
        )
    if cpus > have:
        extra = grow(engine, books, held, cpus - have, policy, movable)
        changed, added, removed = held | extra, extra, 0
    else:
        kept = shrink(topo, held, have - cpus)
        changed, added, removed = kept, 0, held & ~kept
    cpu = books.cpu.reassigned(key, changed)
    if not cpu.shared_pool:
        raise AllocationError("cpus", "taking them would leave the shared pool empty")
    return replace(books, cpu=cpu), added, removed


def _around(masks: Mapping[int, int], held: int) -> int:
    """The union of the domains (cores, L3 groups, nodes) that hold a CPU of ``held``."""
    out = 0
    for mask in masks.values():
        if mask & held:
            out |= mask
    return out


def levels(engine: Engine, held: int) -> tuple[int, ...]:
    """The CPUs near ``held``, nearest first: its cores; its L3 groups on its nodes; its
    nodes; the rest of its L3 groups (an L3 group may span nodes); then each other node,
    nearest first by NUMA distance (by id where none is known)."""
    topo = engine.cpu_policy.topo
    cores, caches, nodes = (_around(m, held) for m in (topo.core, topo.uncore, topo.numa))
    mine = topo.numas_of(held)
    distances = engine.machine.distances

    def far(node: int) -> tuple[int, int]:
        if distances is None:
            return (0, node)
        return (sum(distances.get(m, {}).get(node, 0) for m in mine), node)

    others = sorted((n for n in topo.numa if n not in mine), key=far)
    return (cores, caches & nodes, nodes, caches, *(topo.numa[n] for n in others))


def grow(  # noqa: PLR0917 - resize's parts, passed on
    engine: Engine, books: Books, held: int, more: int, policy: Policy, movable: bool
) -> int:
    """``more`` free CPUs nearest to ``held`` (module docstring); AllocationError with
    the reason where the policy's nodes have too few."""
    topo, take = engine.cpu_policy.topo, engine.cpu_policy.take
    free = books.cpu.available & ~held
    spread = policy in SPREADING
    room = free if spread else free & topo.numa_mask(topo.numas_of(held))
    if room.bit_count() < more:
        why = _no_room(topo, held, room, more, spread=spread, moves=movable)
        raise AllocationError("cpus", why)
    out = 0
    for level in levels(engine, held):
        pool = room & level & ~out
        want = min(more - out.bit_count(), pool.bit_count())
        if want > 0:
            out |= take(pool, want)
        if out.bit_count() >= more:
            break
    return out


def _no_room(
    topo: CPUTopology, held: int, room: int, more: int, *, spread: bool, moves: bool
) -> str:
    if spread:
        return f"not enough free CPUs: {room.bit_count()} free, {more} more asked"
    which = _nodes(NodeSet(topo.numas_of(held)))
    why = (
        "it is movable, but no re-placement has room for it either"
        if moves
        else "the workload is not movable"
    )
    return f"no room on {which}: {room.bit_count()} free, {more} more asked; {why}"


def shrink(topo: CPUTopology, held: int, fewer: int) -> int:
    """``held`` less ``fewer`` CPUs: a compact subset (module docstring)."""
    kept = held
    for _ in range(fewer):
        gone = kept & ~topo.all  # a CPU gone offline under it (hotplug) goes first
        kept &= ~(1 << (gone.bit_length() - 1 if gone else _loosest(topo, kept)))
    return kept


def _loosest(topo: CPUTopology, kept: int) -> int:
    """The CPU of ``kept`` whose node, then L3 group, then core holds the fewest of
    ``kept``; the highest id among equals. Narrowed a level at a time, so a drop
    costs the nodes, the L3 groups of the loosest nodes and the CPUs of the loosest
    groups, not every CPU held."""
    pool = _fewest(kept, kept, topo.numa.values())
    nodes = {topo.info[c].numa for c in bits(pool)}
    caches = {u for n in nodes for u in topo.numa_uncores[n]}
    pool = _fewest(kept, pool, (topo.uncore[u] for u in caches))
    cores = {topo.info[c].core for c in bits(pool)}
    pool = _fewest(kept, pool, (topo.core[c] for c in cores))
    return pool.bit_length() - 1


def _fewest(kept: int, pool: int, domains: Iterable[int]) -> int:
    """The CPUs of ``pool`` in the domains holding the fewest of ``kept``."""
    best, out = -1, 0
    for domain in domains:
        if not domain & pool:
            continue
        fill = (domain & kept).bit_count()
        if best < 0 or fill < best:
            best, out = fill, domain & pool
        elif fill == best:
            out |= domain & pool
    return out


# -- memory ------------------------------------------------------------------------------


def _memory(books: Books, key: Key, amount: int) -> MemoryState:
    """The memory manager's state with the container's ``memory`` block at ``amount``
    bytes, on the same nodes (module docstring); AllocationError where they have too
    little free, or where it holds no block to resize."""
    state = books.memory
    blocks = state.blocks.get(key, ())
    found = [b for b in blocks if b.resource == MEMORY]
    if not found:
        raise AllocationError(
            "memory", "it was admitted without memory: no NUMA nodes hold its memory to resize"
        )
    block = found[0]
    split = dict(block.split)
    change = amount - block.size
    if change > 0:
        free = {n: state.free(n, MEMORY) for n in block.nodes}
        if sum(free.values()) < change:
            raise AllocationError(
                "memory",
                f"no room on {_nodes(block.nodes)}: {sum(free.values())} bytes free,"
                f" {change} more asked",
            )
        for node in sorted(block.nodes):  # lowest first, as the allocator's greedy split
            take = min(free[node], change)
            split[node] = split.get(node, 0) + take
            change -= take
    else:
        for node in sorted(split, reverse=True):  # highest first: the greedy split's tail
            take = min(split[node], -change)
            split[node] -= take
            change += take
    resized = Block(MEMORY, block.nodes, tuple((n, b) for n, b in sorted(split.items()) if b))
    new = dict(state.blocks)
    new[key] = tuple(resized if b is block else b for b in blocks)
    return replace(state, blocks=MappingProxyType(new))


def _nodes(nodes: NodeSet) -> str:
    return f"node {nodes}" if len(nodes) == 1 else f"nodes {nodes}"
