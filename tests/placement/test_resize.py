"""Resize in place (numad.placement.resize), table-driven on a small machine with SMT and
two L3 groups per node, and on recorded ones: a grow keeps every CPU and takes the
nearest free ones first; the policy bounds the nodes; a shrink keeps a compact subset;
memory stays on its nodes; a refusal leaves the books as they were."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import pytest

from numad.cpuset import CPUSet, NodeSet
from numad.hostfs import HostFS
from numad.placement.admission import (
    Books,
    ContainerRequest,
    Engine,
    WorkloadRequest,
    admit,
)
from numad.placement.managers.cpu.state import CPUState
from numad.placement.managers.cpu.static import StaticOptions, StaticPolicy
from numad.placement.managers.cpu.topology import CPUInfo, CPUTopology
from numad.placement.managers.device import DeviceInventory, DeviceState
from numad.placement.managers.memory import MEMORY, Block, Capacity, MemoryState, MemoryTable
from numad.placement.policy import Machine, Policy
from numad.placement.resize import resize, shrink
from numad.topology.discover import discover
from tests.conftest import Machines

GIB = 1 << 30


def small() -> CPUTopology:
    """2 nodes x 2 L3 groups x 2 cores x 2 threads: CPU c is a thread of core c % 8 (c
    and c + 8 are siblings); cores 0-3 are node 0 (L3 group 0: cores 0-1, group 1:
    cores 2-3), cores 4-7 node 1 (groups 2 and 3)."""
    infos = []
    for cpu in range(16):
        core = cpu % 8
        infos.append(CPUInfo(cpu, core, core // 4, core // 4, core // 2))
    return CPUTopology.of(infos)


def books_on(topo: CPUTopology, reserved: int = 0, memory: int = 8 * GIB) -> Books:
    nodes = tuple(sorted(topo.numa))
    capacity = {(n, MEMORY): Capacity(memory, 0, memory) for n in nodes}
    return Books(
        CPUState(topo.all, reserved),
        MemoryState(MemoryTable(nodes, MappingProxyType(capacity))),
        DeviceState(DeviceInventory(nodes, MappingProxyType({}))),
    )


def engine_on(topo: CPUTopology, policy: Policy = Policy.BEST_EFFORT) -> Engine:
    nodes = NodeSet(topo.numa)
    distances = {a: {b: 10 if a == b else 20 + abs(a - b) for b in nodes} for a in nodes}
    return Engine(Machine(nodes, distances), StaticPolicy(topo, StaticOptions()), policy)


def holding(books: Books, cpus: str, key: tuple[str, str] = ("w", "main")) -> Books:
    held = dict(books.cpu.assignments)
    held[key] = CPUSet.parse_list(cpus).bits
    return replace(books, cpu=replace(books.cpu, assignments=MappingProxyType(held)))


def cpus_of(books: Books, key: tuple[str, str] = ("w", "main")) -> str:
    return CPUSet.from_bits(books.cpu.assignments.get(key, 0)).format_list()


# CPU 1's sibling is 9; its L3 group (cores 0-1) is 0-1,8-9; its node 0-3,8-11.
@pytest.mark.parametrize(
    ("held", "others", "cpus", "policy", "after"),
    [
        pytest.param("1", "", 2, Policy.BEST_EFFORT, "1,9", id="sibling-first"),
        pytest.param("1", "", 4, Policy.BEST_EFFORT, "0-1,8-9", id="then-its-l3-group"),
        pytest.param("1", "", 6, Policy.BEST_EFFORT, "0-2,8-10", id="then-its-node"),
        pytest.param("1", "9", 2, Policy.BEST_EFFORT, "0-1", id="sibling-taken-l3-next"),
        pytest.param("1", "0,8-11", 3, Policy.BEST_EFFORT, "1-3", id="l3-taken-node-next"),
        pytest.param("0-3,8-10", "", 9, Policy.BEST_EFFORT, "0-4,8-11", id="node-full-next-node"),
        pytest.param("0-3,8-10", "", 8, Policy.SINGLE_NUMA_NODE, "0-3,8-11", id="snn-in-node"),
        pytest.param("1,9", "", 1, Policy.RESTRICTED, "1", id="shrink-to-one"),
        pytest.param("0-1,4,8-9,12", "", 4, Policy.BEST_EFFORT, "0-1,8-9", id="shrink-l3-left"),
        pytest.param("0,4-7,12-15", "", 8, Policy.BEST_EFFORT, "4-7,12-15", id="shrink-node-left"),
    ],
)
def test_resize_takes_nearest_and_keeps_compact(
    held: str, others: str, cpus: int, policy: Policy, after: str
) -> None:
    topo = small()
    books = holding(books_on(topo), held)
    if others:
        books = holding(books, others, ("other", "main"))
    done = resize(engine_on(topo, policy), books, ("w", "main"), cpus=cpus, policy=policy)
    assert done.refused == ""
    assert cpus_of(done.books) == after
    before = CPUSet.parse_list(held)
    now = CPUSet.parse_list(after)
    assert before.issubset(now) or now.issubset(before)  # a grow keeps all; a shrink, a subset


@pytest.mark.parametrize(
    ("policy", "movable", "why"),
    [
        pytest.param(
            Policy.SINGLE_NUMA_NODE,
            False,
            "no room on node 0: 1 free, 2 more asked; the workload is not movable",
            id="snn-not-movable",
        ),
        pytest.param(
            Policy.RESTRICTED,
            True,
            "no room on node 0: 1 free, 2 more asked; it is movable, but no re-placement"
            " has room for it either",
            id="restricted-movable",
        ),
    ],
)
def test_a_grow_past_its_nodes_is_refused_and_changes_nothing(
    policy: Policy, movable: bool, why: str
) -> None:
    topo = small()
    books = holding(books_on(topo), "0-3,8-10")
    done = resize(
        engine_on(topo, policy), books, ("w", "main"), cpus=9, policy=policy, movable=movable
    )
    assert done.refused == why
    assert done.books is books


@pytest.mark.parametrize(
    ("held", "cpus", "why"),
    [
        pytest.param("", 2, "it runs on the shared pool", id="shared-to-exclusive"),
        pytest.param("1", 0, "it holds exclusive CPUs", id="exclusive-to-shared"),
        pytest.param("0-13", 17, "not enough free CPUs: 2 free, 3 more asked", id="no-cpus"),
        pytest.param("0-13", 16, "would leave the shared pool empty", id="pool-empty"),
    ],
)
def test_refusals_name_the_reason_and_leave_the_books(held: str, cpus: int, why: str) -> None:
    topo = small()
    books = holding(books_on(topo), held) if held else books_on(topo)
    done = resize(engine_on(topo), books, ("w", "main"), cpus=cpus)
    assert why in done.refused
    assert done.books is books


def test_full_pcpus_only_asks_whole_cores() -> None:
    topo = small()
    engine = replace(
        engine_on(topo), cpu_policy=StaticPolicy(topo, StaticOptions(full_pcpus_only=True))
    )
    books = holding(books_on(topo), "1,9")
    assert "multiple of 2" in resize(engine, books, ("w", "main"), cpus=3).refused
    assert cpus_of(resize(engine, books, ("w", "main"), cpus=4).books) == "0-1,8-9"


def _with_memory(books: Books, split: tuple[tuple[int, int], ...]) -> Books:
    block = Block(MEMORY, NodeSet(n for n, _ in split), split)
    blocks = {("w", "main"): (block,)}
    return replace(books, memory=replace(books.memory, blocks=MappingProxyType(blocks)))


def test_memory_grows_on_its_nodes_lowest_first_and_shrinks_highest_first() -> None:
    topo = small()
    engine = engine_on(topo)
    books = _with_memory(holding(books_on(topo), "1"), ((0, 7 * GIB), (1, 1 * GIB)))
    grown = resize(engine, books, ("w", "main"), memory=10 * GIB)
    assert grown.books.memory.blocks[("w", "main")][0].split == ((0, 8 * GIB), (1, 2 * GIB))
    shrunk = resize(engine, books, ("w", "main"), memory=6 * GIB)
    assert shrunk.books.memory.blocks[("w", "main")][0].split == ((0, 6 * GIB),)
    assert shrunk.books.memory.mems(("w", "main")) == NodeSet([0, 1])  # cpuset.mems stays
    refused = resize(engine, books, ("w", "main"), memory=17 * GIB)
    assert refused.refused == "no room on nodes 0-1: 8589934592 bytes free, 9663676416 more asked"
    assert refused.books is books
    # CPUs and memory at once: all or nothing
    both = resize(engine, books, ("w", "main"), cpus=2, memory=17 * GIB)
    assert both.refused
    assert both.books is books


def test_memory_of_a_container_admitted_without_any_is_refused() -> None:
    topo = small()
    books = holding(books_on(topo), "1")
    assert (
        "admitted without memory" in resize(engine_on(topo), books, ("w", "main"), memory=1).refused
    )


def test_shrink_drops_offline_cpus_first() -> None:
    topo = small()
    assert shrink(topo, CPUSet.parse_list("1,9,40").bits, 1) == CPUSet.parse_list("1,9").bits


@pytest.mark.parametrize("name", ["32intel64-2p8co2t+8ve", "memorysidecaches", "256ppc-8n8s4t"])
def test_grow_on_recorded_machines_takes_siblings_then_l3_then_node(
    machines: Machines, name: str
) -> None:
    """On a recorded machine, a container admitted on 2 CPUs grown one CPU at a time:
    each CPU added is of the nearest level that still had a free CPU."""
    topo = CPUTopology.from_topology(discover(HostFS(machines.root(name))))
    engine = engine_on(topo)
    books = books_on(topo, reserved=1 << min(topo.info))
    books, outcome = admit(engine, books, WorkloadRequest("w", (ContainerRequest("main", 2),)))
    assert outcome.admitted
    key = ("w", "main")
    for size in range(3, min(24, topo.all.bit_count() - 2)):
        held = books.cpu.assignments[key]
        free = books.cpu.available
        done = resize(engine, books, key, cpus=size)
        assert done.refused == ""
        added = done.books.cpu.assignments[key] & ~held
        assert added.bit_count() == 1
        assert done.books.cpu.assignments[key] & held == held
        nearest = _nearest_level(topo, held, free)
        assert added & nearest, f"{CPUSet.from_bits(added)} not of the nearest level"
        books = done.books


def _nearest_level(topo: CPUTopology, held: int, free: int) -> int:
    def around(masks: dict[int, int]) -> int:
        out = 0
        for m in masks.values():
            if m & held:
                out |= m
        return out

    nodes = around(dict(topo.numa))
    for level in (around(dict(topo.core)), around(dict(topo.uncore)) & nodes, nodes):
        if level & free & ~held:
            return level & free & ~held
    return free & ~held
