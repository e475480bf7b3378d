"""The memory manager: per-node tables, hints, groups, allocation, release, drift.

Table-driven tests over recorded machines and small hand-built ones, then
Hypothesis properties over random machines and random allocate/release runs.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from numad.cpuset import CPUSet, NodeSet
from numad.errors import AllocationError, ConfigError
from numad.placement.hints import Hint
from numad.placement.hintspace import HintSpace, listed
from numad.placement.managers.memory import (
    MEMORY,
    Block,
    Capacity,
    Key,
    MemoryState,
    MemoryTable,
    hugepage_resource,
)
from numad.topology.model import HugePages, NumaNode, Topology

MiB = 1 << 20
GiB = 1 << 30
HUGE_2M = "hugepages-2Mi"
HUGE_1G = "hugepages-1Gi"
KEY: Key = ("w", "c")
INTEL = "32intel64-2p8co2t+8ve"  # 2 nodes; 2048 pages of 2 MiB and 0 of 1 GiB on each
# Regular memory of INTEL's nodes: MemTotal less the 4 GiB of 2 MiB pages.
INTEL_MEMORY = {0: 49075843072 - 4 * GiB, 1: 50708443136 - 4 * GiB}

Masks = list[tuple[tuple[int, ...], bool]]


def _topology(*nodes: NumaNode) -> Topology:
    """A machine reduced to what the memory manager reads: its NUMA nodes."""
    return Topology(all_cpus=(), nodes=nodes, packages=(), cores=(), l3_groups=())


def _node(node_id: int, memory_kb: int | None, pages_2m: int = 0, cpus: int = 1) -> NumaNode:
    cpu_ids = CPUSet(range(node_id * 4, node_id * 4 + cpus))
    huge = (HugePages(2048, pages_2m, pages_2m),) if memory_kb else ()
    return NumaNode(node_id, cpu_ids, memory_total_kb=memory_kb, hugepages=huge)


# Three nodes of 4 GiB regular memory each, no hugepages.
THREE = _topology(*(_node(n, 4 * GiB // 1024) for n in range(3)))


def _state(topo: Topology, kernel_free: Mapping[tuple[int, str], int] | None = None) -> MemoryState:
    return MemoryState(MemoryTable.build(topo), kernel_free=kernel_free or {})


def _listed(hints: Mapping[str, HintSpace] | None) -> dict[str, tuple[Hint, ...]] | None:
    """The provider's described hints as the kubelet lists them."""
    if hints is None:
        return None
    return {r: listed(space) or () for r, space in hints.items()}


def _hints(state: MemoryState, request: Mapping[str, int]) -> Masks:
    """The hint list, checked to be the same for every requested resource."""
    hints = _listed(state.hints(request))
    assert hints is not None
    lists = {tuple((h.affinity, h.preferred) for h in each) for each in hints.values()}
    assert len(lists) == 1, hints
    return [(tuple(h.affinity or ()), h.preferred) for h in next(iter(hints.values()))]


def _setup(state: MemoryState, blocks: list[tuple[tuple[int, ...], int]]) -> MemoryState:
    """Earlier containers: ``GiB`` of memory on the given mask each."""
    for i, (mask, gib) in enumerate(blocks):
        state = state.allocate((f"s{i}", "c"), {MEMORY: gib * GiB}, NodeSet(mask))
    return state


# -- the table ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size_kb", "name"),
    [
        pytest.param(2048, "hugepages-2Mi", id="2Mi"),
        pytest.param(1 << 20, "hugepages-1Gi", id="1Gi"),
        pytest.param(64, "hugepages-64Ki", id="64Ki"),
        pytest.param(32 << 10, "hugepages-32Mi", id="32Mi"),
    ],
)
def test_hugepage_resource_names(size_kb: int, name: str) -> None:
    assert hugepage_resource(size_kb) == name


def test_table_of_a_recorded_machine(recorded: Callable[[str], Topology]) -> None:
    table = MemoryTable.build(recorded(INTEL))
    assert table.nodes == (0, 1)
    for node, memory in INTEL_MEMORY.items():
        # Pre-allocated hugepages sit inside MemTotal and are not regular memory.
        assert table.capacity[(node, MEMORY)] == Capacity(memory + 4 * GiB, 0, memory)
        assert table.capacity[(node, HUGE_2M)] == Capacity(4 * GiB, 0, 4 * GiB)
        assert table.capacity[(node, HUGE_1G)] == Capacity(0, 0, 0)
    assert table.allocatable(7, MEMORY) == 0


def test_reserved_memory_lowers_allocatable(recorded: Callable[[str], Topology]) -> None:
    reserved = {0: {MEMORY: GiB, HUGE_2M: GiB}, 1: {MEMORY: INTEL_MEMORY[1]}}
    table = MemoryTable.build(recorded(INTEL), reserved)
    assert table.capacity[(0, MEMORY)] == Capacity(
        INTEL_MEMORY[0] + 4 * GiB, GiB, INTEL_MEMORY[0] - GiB
    )
    assert table.capacity[(0, HUGE_2M)] == Capacity(4 * GiB, GiB, 3 * GiB)
    assert table.allocatable(1, MEMORY) == 0  # its regular memory reserved whole
    state = MemoryState(table)
    assert _hints(state, {HUGE_2M: 3 * GiB + 2 * MiB}) == [((1,), True), ((0, 1), False)]


@pytest.mark.parametrize(
    ("reserved", "message"),
    [
        pytest.param(
            {5: {MEMORY: GiB}},
            "reserved-memory node 5: no such NUMA node on this machine; use one of [0, 1]",
            id="unknown-node",
        ),
        pytest.param(
            {0: {"hugepages-3Mi": 3 * MiB}},
            "reserved-memory node 0: unknown resource 'hugepages-3Mi'; "
            "use one of memory, hugepages-1Gi, hugepages-2Mi",
            id="unknown-resource",
        ),
        pytest.param(
            {1: {MEMORY: 0}},
            "reserved-memory node 1: memory reservation must be above zero, got 0",
            id="zero",
        ),
        pytest.param(
            {0: {HUGE_2M: -2 * MiB}},
            "reserved-memory node 0: hugepages-2Mi reservation must be above zero, got -2097152",
            id="negative",
        ),
        pytest.param(
            {0: {MEMORY: 49075843072 + 1}},
            "reserved-memory node 0: memory reservation of 49075843073 bytes exceeds "
            "the node's 44780875776 bytes of regular memory (MemTotal less its hugepages);"
            " lower the reservation",
            id="memory-larger-than-the-node",
        ),
        pytest.param(
            # Within MemTotal, beyond regular memory: the 4 GiB of 2 MiB pages are not
            # the system's to reserve as memory (the kubelet's allocatable subtracts them).
            {0: {MEMORY: INTEL_MEMORY[0] + 1}},
            "reserved-memory node 0: memory reservation of 44780875777 bytes exceeds "
            "the node's 44780875776 bytes of regular memory (MemTotal less its hugepages);"
            " lower the reservation",
            id="memory-inside-the-hugepages",
        ),
        pytest.param(
            {1: {HUGE_2M: 4 * GiB + 2 * MiB}},
            "reserved-memory node 1: hugepages-2Mi reservation of 4297064448 bytes exceeds "
            "the node's 4294967296 bytes of hugepages-2Mi pages; lower the reservation",
            id="hugepages-larger-than-the-pool",
        ),
        pytest.param(
            {1: {HUGE_1G: GiB}},
            "reserved-memory node 1: hugepages-1Gi reservation of 1073741824 bytes exceeds "
            "the node's 0 bytes of hugepages-1Gi pages; lower the reservation",
            id="size-with-no-pages",
        ),
    ],
)
def test_reserved_memory_errors_name_the_node(
    recorded: Callable[[str], Topology], reserved: dict[int, dict[str, int]], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        MemoryTable.build(recorded(INTEL), reserved)
    assert str(caught.value) == message
    assert caught.value.subject == f"reserved-memory node {next(iter(reserved))}"


# -- single-NUMA and multi-NUMA requests on recorded machines ------------------------------


@pytest.mark.parametrize(
    ("name", "amount", "singles", "node"),
    [
        pytest.param(INTEL, 8 * GiB, [0, 1], 1, id="2-nodes"),
        # 400 MiB fits nodes 0-2 (with CPUs) and 4 (memory only, 512 MiB), not 6, 8, 9 (384 MiB).
        pytest.param("fakeheteromemtiers", 400 * MiB, [0, 1, 2, 4], 4, id="cpu-less-node"),
        pytest.param("fakeheteromemtiers", 300 * MiB, [0, 1, 2, 4, 6, 8, 9], 9, id="all-7"),
        pytest.param("offline-cpu0-node0", GiB, [1], 1, id="only-node-1"),
        pytest.param("devmachine-2c1n", GiB, [0], 0, id="one-node"),
    ],
)
def test_single_numa_request(
    recorded: Callable[[str], Topology], name: str, amount: int, singles: list[int], node: int
) -> None:
    state = _state(recorded(name))
    hints = _hints(state, {MEMORY: amount})
    assert [m for m, preferred in hints if preferred] == [(n,) for n in singles]
    assert hints[: len(singles)] == [((n,), True) for n in singles]
    assert all(len(m) > 1 for m, preferred in hints if not preferred)
    # No affinity from the merge: the first preferred hint.
    assert state.allocate(KEY, {MEMORY: amount}, None).mems(KEY) == NodeSet([singles[0]])
    placed = state.allocate(KEY, {MEMORY: amount}, NodeSet([node]))
    assert placed.blocks[KEY] == (Block(MEMORY, NodeSet([node]), ((node, amount),)),)
    assert placed.mems(KEY) == NodeSet([node])
    assert placed.used(node, MEMORY) == amount
    assert placed.free(node, MEMORY) == state.free(node, MEMORY) - amount
    assert placed.groups(node) == {NodeSet([node])}


@pytest.mark.parametrize(
    ("name", "amount", "preferred"),
    [
        pytest.param(INTEL, 60 * GiB, [(0, 1)], id="2-nodes"),
        # 3.5 GiB: nodes 0 and 1 together (3.8 GiB); node 0 with 2 or 4 is 3.37 GiB.
        pytest.param("fakeheteromemtiers", 3584 * MiB, [(0, 1)], id="memory-tiers"),
        # 150 GiB: any two of the 16 big nodes; node 16 has 1 GiB.
        pytest.param(
            "128ia64-17n4s2c",
            150 * GiB,
            list(itertools.combinations(range(16), 2)),
            id="17-nodes",
        ),
    ],
)
def test_multi_numa_request(
    recorded: Callable[[str], Topology], name: str, amount: int, preferred: list[tuple[int, ...]]
) -> None:
    state = _state(recorded(name))
    hints = _hints(state, {MEMORY: amount})
    assert [m for m, p in hints if p] == preferred
    assert hints[: len(preferred)] == [(m, True) for m in preferred]
    assert all(len(m) > 2 for m, p in hints if not p)
    placed = state.allocate(KEY, {MEMORY: amount}, None)
    first, second = preferred[0]
    # Greedy in ascending node order: the lower node is filled first.
    head = state.free(first, MEMORY)
    split = ((first, head), (second, amount - head))
    assert placed.blocks[KEY] == (Block(MEMORY, NodeSet(preferred[0]), split),)
    assert placed.mems(KEY) == NodeSet(preferred[0])
    assert placed.free(first, MEMORY) == 0
    assert placed.groups(first) == placed.groups(second) == {NodeSet(preferred[0])}


# -- the group rule --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("blocks", "gib", "expected"),
    [
        pytest.param(
            [], 6, [((0, 1), True), ((0, 2), True), ((1, 2), True), ((0, 1, 2), False)], id="free"
        ),
        pytest.param([((0,), 1)], 6, [((1, 2), True)], id="single-numa-node-joins-no-group"),
        pytest.param([((0,), 1), ((1,), 1)], 6, [], id="single-numa-nodes-block-all-groups"),
        pytest.param([((0, 1), 6)], 1, [((2,), True), ((0, 1), False)], id="group-serves-group"),
        pytest.param([((0, 1), 6)], 3, [((2,), True)], id="group-without-room"),
        pytest.param([((0, 1), 6)], 5, [], id="group-takes-no-other-mask"),
        pytest.param([((0, 1, 2), 9)], 1, [((0, 1, 2), False)], id="three-node-group"),
    ],
)
def test_group_rule_in_hints(
    blocks: list[tuple[tuple[int, ...], int]], gib: int, expected: Masks
) -> None:
    state = _setup(_state(THREE), blocks)
    assert _hints(state, {MEMORY: gib * GiB}) == expected


def test_a_grouped_allocation_fills_its_group_greedily() -> None:
    state = _setup(_state(THREE), [((0, 1), 6)])
    assert state.blocks[("s0", "c")] == (
        Block(MEMORY, NodeSet([0, 1]), ((0, 4 * GiB), (1, 2 * GiB))),
    )
    # Node 0 is full: the next container of the group takes from node 1 only.
    state = state.allocate(KEY, {MEMORY: GiB}, NodeSet([0, 1]))
    assert state.blocks[KEY] == (Block(MEMORY, NodeSet([0, 1]), ((1, GiB),)),)
    assert state.mems(KEY) == NodeSet([0, 1])
    # Once the group is gone its nodes serve single-NUMA requests again.
    state = state.release("s0").release(KEY[0])
    assert _hints(state, {MEMORY: GiB})[:3] == [((0,), True), ((1,), True), ((2,), True)]
    assert all(state.groups(n) == set() for n in range(3))


# -- default affinity, the "extend" step, errors -----------------------------------------


@pytest.mark.parametrize(
    ("blocks", "gib", "affinity", "split"),
    [
        pytest.param([], 3, None, {0: 3}, id="default-first-preferred"),
        pytest.param([((0,), 2)], 3, None, {1: 3}, id="default-skips-busy-node"),
        pytest.param([], 6, None, {0: 4, 1: 2}, id="default-narrowest-group"),
        pytest.param([], 3, (2,), {2: 3}, id="given-affinity-kept"),
        pytest.param([], 3, (1, 2), {1: 3}, id="given-group-filled-from-lowest"),
        pytest.param([], 6, (1,), {0: 4, 1: 2}, id="extend-to-first-narrowest-superset"),
        pytest.param([((0,), 1)], 6, (1,), {1: 4, 2: 2}, id="extend-skips-single-numa-node"),
        pytest.param([], 10, (2,), {0: 4, 1: 4, 2: 2}, id="extend-to-all-nodes"),
    ],
)
def test_default_affinity_and_extend(
    blocks: list[tuple[tuple[int, ...], int]],
    gib: int,
    affinity: tuple[int, ...] | None,
    split: dict[int, int],
) -> None:
    state = _setup(_state(THREE), blocks)
    asked = None if affinity is None else NodeSet(affinity)
    placed = state.allocate(KEY, {MEMORY: gib * GiB}, asked)
    (block,) = placed.blocks[KEY]
    assert dict(block.split) == {n: g * GiB for n, g in split.items()}
    assert block.size == gib * GiB
    expected_mask = NodeSet(split) | (asked or NodeSet())
    assert block.nodes == expected_mask
    assert placed.mems(KEY) == expected_mask


PREFIX = "w/c: [memorymanager] "
NO_ROOM = (
    ", no NUMA nodes with enough memory is available; free memory on this machine or ask for less"
)


@pytest.mark.parametrize(
    ("blocks", "amounts", "affinity", "message"),
    [
        pytest.param(
            [],
            {MEMORY: 13 * GiB},
            None,
            "failed to get the default NUMA affinity" + NO_ROOM,
            id="nothing-fits",
        ),
        pytest.param(
            [((0,), 1), ((1,), 1)],
            {MEMORY: 6 * GiB},
            None,
            "failed to get the default NUMA affinity" + NO_ROOM,
            id="fits-only-across-single-numa-nodes",
        ),
        pytest.param(
            [],
            {HUGE_2M: 2 * MiB},
            None,
            "failed to get the default NUMA affinity" + NO_ROOM,
            id="no-hugepages",
        ),
        # Issue #120733: the node holds single-NUMA memory, so no group may take it.
        pytest.param(
            [((0,), 3)],
            {MEMORY: 2 * GiB},
            (0,),
            "failed to find NUMA nodes to extend the current topology hint" + NO_ROOM,
            id="cannot-extend",
        ),
        pytest.param(
            [((0,), 1)],
            {MEMORY: 2 * GiB},
            (0, 1),
            "preferred hint violates NUMA node allocation; "
            "nodes 0-1 already serve allocations of another NUMA group",
            id="group-over-single-numa-node",
        ),
        pytest.param(
            [((0, 1), 6)],
            {MEMORY: GiB},
            (1,),
            "preferred hint violates NUMA node allocation; "
            "nodes 1 already serve allocations of another NUMA group",
            id="single-numa-on-grouped-node",
        ),
    ],
)
def test_allocation_errors(
    blocks: list[tuple[tuple[int, ...], int]],
    amounts: dict[str, int],
    affinity: tuple[int, ...] | None,
    message: str,
) -> None:
    state = _setup(_state(THREE), blocks)
    with pytest.raises(AllocationError) as caught:
        state.allocate(KEY, amounts, None if affinity is None else NodeSet(affinity))
    assert str(caught.value) == PREFIX + message
    assert caught.value.subject == "w/c"


def test_nothing_requested_and_repeated_allocation() -> None:
    state = _state(THREE)
    assert state.hints({MEMORY: 0, HUGE_2M: 0}) is None
    assert state.allocate(KEY, {MEMORY: 0}, None) is state
    placed = state.allocate(KEY, {MEMORY: GiB}, None)
    assert placed.allocate(KEY, {MEMORY: 3 * GiB}, NodeSet([2])) is placed  # kept as it is
    assert placed.mems(("w", "other")) == NodeSet()


def test_release_by_workload_or_container() -> None:
    state = _state(THREE)
    for key in [("a", "x"), ("a", "y"), ("b", "x")]:
        state = state.allocate(key, {MEMORY: GiB}, None)
    assert set(state.release("a", "y").blocks) == {("a", "x"), ("b", "x")}
    assert set(state.release("a").blocks) == {("b", "x")}
    assert state.release("zzz").blocks == state.blocks
    assert state.release("a").release("b") == _state(THREE)


# -- CPU-less and memory-less nodes ----------------------------------------------------------


def test_cpu_less_node_takes_memory(recorded: Callable[[str], Topology]) -> None:
    state = _state(recorded("fakeheteromemtiers"))
    placed = state.allocate(KEY, {MEMORY: 300 * MiB}, NodeSet([6]))
    assert placed.mems(KEY) == NodeSet([6])
    # 500 MiB does not fit node 6 (384 MiB): extended to the narrowest superset, {0, 6}.
    wider = state.allocate(KEY, {MEMORY: 500 * MiB}, NodeSet([6]))
    assert wider.blocks[KEY] == (Block(MEMORY, NodeSet([0, 6]), ((0, 500 * MiB),)),)


def _memory_less(recorded: Callable[[str], Topology], variant: str) -> Topology:
    """Node 1 has CPUs and no memory."""
    if variant == "recorded":
        topo = recorded(INTEL)
        bare = replace(topo.nodes[1], memory_total_kb=None, memory_free_kb=None, hugepages=())
        return replace(topo, nodes=(topo.nodes[0], bare))
    kb = None if variant == "no-meminfo" else 0
    return _topology(_node(0, 4 * GiB // 1024), _node(1, kb), _node(2, 4 * GiB // 1024, cpus=0))


MEMORY_LESS = [
    pytest.param("recorded", 8 * GiB, id="intel-node-1-memory-less"),
    pytest.param("no-meminfo", 3 * GiB, id="single-numa"),
    pytest.param("no-meminfo", 6 * GiB, id="multi-numa"),
    pytest.param("memtotal-0", 3 * GiB, id="memtotal-0"),
]


@pytest.mark.parametrize(("variant", "amount"), MEMORY_LESS)
def test_memory_less_node_gets_no_memory(
    recorded: Callable[[str], Topology], variant: str, amount: int
) -> None:
    state = _state(_memory_less(recorded, variant))
    assert state.table.allocatable(1, MEMORY) == 0
    hints = _hints(state, {MEMORY: amount})
    assert hints
    assert ((1,), True) not in hints
    assert ((1,), False) not in hints
    (block,) = state.allocate(KEY, {MEMORY: amount}, None).blocks[KEY]
    assert 1 not in block.nodes


@pytest.mark.parametrize(("variant", "amount"), [MEMORY_LESS[0], MEMORY_LESS[2]])
def test_memory_less_node_never_appears_in_a_memory_hint(
    recorded: Callable[[str], Topology], variant: str, amount: int
) -> None:
    """A node with no memory adds nothing to a mask: a mask holding it is never a hint.

    (The kubelet does list such masks. With them, a container whose merged affinity is the
    memory-less node is extended to {memory node, memory-less node}; that group then keeps
    the memory node from serving any single-NUMA request until the container goes.)
    """
    hints = _hints(_state(_memory_less(recorded, variant)), {MEMORY: amount})
    assert [m for m, _ in hints if 1 in m] == []


# -- hugepages ---------------------------------------------------------------------------


BOTH = [((0,), True), ((1,), True), ((0, 1), False)]


@pytest.mark.parametrize(
    ("amounts", "expected"),
    [
        pytest.param({MEMORY: 8 * GiB, HUGE_2M: 2 * GiB}, BOTH, id="memory-and-2Mi"),
        pytest.param({HUGE_2M: 6 * GiB}, [((0, 1), True)], id="2Mi-over-one-node"),
        # Memory fits one node, the hugepages need both: one list for the two.
        pytest.param({MEMORY: 8 * GiB, HUGE_2M: 6 * GiB}, [((0, 1), True)], id="2Mi-widens"),
        pytest.param({MEMORY: 8 * GiB, HUGE_2M: 0}, BOTH, id="zero-2Mi-not-requested"),
        pytest.param({HUGE_1G: GiB}, [], id="1Gi-with-no-pages"),
        pytest.param({MEMORY: 8 * GiB, HUGE_1G: GiB}, [], id="memory-and-1Gi"),
    ],
)
def test_hugepage_hints(
    recorded: Callable[[str], Topology], amounts: dict[str, int], expected: Masks
) -> None:
    hints = _listed(_state(recorded(INTEL)).hints(amounts))
    assert hints is not None
    assert set(hints) == {r for r, v in amounts.items() if v > 0}
    for each in hints.values():
        assert [(tuple(h.affinity or ()), h.preferred) for h in each] == expected


def test_memory_and_hugepages_allocated_together(recorded: Callable[[str], Topology]) -> None:
    state = _state(recorded(INTEL))
    placed = state.allocate(KEY, {MEMORY: 8 * GiB, HUGE_2M: 6 * GiB}, None)
    both = NodeSet([0, 1])
    assert placed.blocks[KEY] == (
        Block(HUGE_2M, both, ((0, 4 * GiB), (1, 2 * GiB))),
        Block(MEMORY, both, ((0, 8 * GiB),)),
    )
    assert placed.mems(KEY) == both
    assert placed.free(1, HUGE_2M) == 2 * GiB
    assert placed.free(0, MEMORY) == INTEL_MEMORY[0] - 8 * GiB
    with pytest.raises(AllocationError, match="failed to get the default NUMA affinity"):
        state.allocate(KEY, {HUGE_1G: GiB}, None)


def test_kernel_free_hugepages_limit_the_free_amount(recorded: Callable[[str], Topology]) -> None:
    kernel = {(0, HUGE_2M): GiB, (1, HUGE_2M): 8 * GiB, (0, MEMORY): 0}
    state = _state(recorded(INTEL), kernel)
    assert state.free(0, HUGE_2M) == GiB  # the kernel has fewer pages than the table
    assert state.free(1, HUGE_2M) == 4 * GiB  # the table has fewer pages than the kernel
    assert state.free(0, MEMORY) == INTEL_MEMORY[0]  # only hugepages are limited
    # Node 0 still counts for the preferred width, by its capacity.
    assert _hints(state, {HUGE_2M: 2 * GiB}) == [((1,), True), ((0, 1), False)]
    assert state.allocate(KEY, {HUGE_2M: 2 * GiB}, None).mems(KEY) == NodeSet([1])
    spread = state.allocate(KEY, {HUGE_2M: 2 * GiB}, NodeSet([0]))
    assert spread.blocks[KEY] == (Block(HUGE_2M, NodeSet([0, 1]), ((0, GiB), (1, GiB))),)


def test_pages_the_kernel_had_free_are_not_handed_out_twice(
    recorded: Callable[[str], Topology],
) -> None:
    """The kernel had 1 GiB of 2 MiB pages free on node 0 when the state was made (3 GiB
    are used outside numad). Once numad gives that 1 GiB away, node 0 has none left."""
    state = _state(recorded(INTEL), {(0, HUGE_2M): GiB})
    placed = state.allocate(("a", "c"), {HUGE_2M: GiB}, NodeSet([0]))
    assert placed.free(0, HUGE_2M) == 0
    assert all(0 not in m for m, _ in _hints(placed, {HUGE_2M: GiB}))


# -- MemTotal drift ------------------------------------------------------------------------


def _with_node(topo: Topology, node: NumaNode) -> Topology:
    """The machine with ``node`` in place of the node of the same id."""
    return replace(topo, nodes=tuple(node if n.id == node.id else n for n in topo.nodes))


def _drifted(topo: Topology, drift: str) -> Topology:
    node0, node1 = topo.nodes
    assert node0.memory_total_kb is not None
    assert node1.memory_total_kb is not None
    if drift == "node-0-64MiB-smaller":
        return _with_node(topo, replace(node0, memory_total_kb=node0.memory_total_kb - 65536))
    if drift == "node-1-below-its-blocks":  # allocatable 40 GiB - 1 MiB, 40 GiB allocated
        return _with_node(topo, replace(node1, memory_total_kb=(44 * GiB - MiB) // 1024))
    assert drift == "half-the-2Mi-pages"
    pools = (HugePages(2048, 1024, 1024), node0.hugepages[1])
    return _with_node(topo, replace(node0, hugepages=pools))


@pytest.mark.parametrize(
    ("drift", "conflicts"),
    [
        pytest.param("node-0-64MiB-smaller", [], id="small-drift"),
        pytest.param(
            "node-1-below-its-blocks",
            ["node 1 memory: 1048576 bytes more allocated than allocatable"],
            id="over-commit",
        ),
        pytest.param(
            "half-the-2Mi-pages",
            ["node 0 hugepages-2Mi: 1073741824 bytes more allocated than allocatable"],
            id="fewer-hugepages",
        ),
    ],
)
def test_blocks_survive_a_rebuilt_table(
    recorded: Callable[[str], Topology], drift: str, conflicts: list[str]
) -> None:
    topo = recorded(INTEL)
    state = _state(topo).allocate(("a", "c"), {MEMORY: 30 * GiB, HUGE_2M: 3 * GiB}, NodeSet([0]))
    state = state.allocate(("b", "c"), {MEMORY: 40 * GiB}, NodeSet([1]))
    assert state.conflicts() == []
    rebuilt = MemoryState(MemoryTable.build(_drifted(topo, drift)), state.blocks)
    assert rebuilt.conflicts() == conflicts
    for node, resource in itertools.product((0, 1), (MEMORY, HUGE_2M)):
        expected = rebuilt.table.allocatable(node, resource) - state.used(node, resource)
        assert rebuilt.free(node, resource) == max(0, expected)
    assert rebuilt.mems(("a", "c")) == NodeSet([0])
    if drift == "node-0-64MiB-smaller":
        assert rebuilt.free(0, MEMORY) == state.free(0, MEMORY) - 64 * MiB
        assert rebuilt.allocate(KEY, {MEMORY: GiB}, None).mems(KEY) == NodeSet([0])
    assert rebuilt.release("a").release("b").conflicts() == []
    assert rebuilt.release("a").release("b").blocks == MemoryState(rebuilt.table).blocks


def test_a_block_on_a_vanished_node_is_a_conflict(recorded: Callable[[str], Topology]) -> None:
    topo = recorded(INTEL)
    state = _state(topo).allocate(("b", "c"), {MEMORY: GiB}, NodeSet([1]))
    rebuilt = MemoryState(MemoryTable.build(replace(topo, nodes=topo.nodes[:1])), state.blocks)
    assert any("node 1" in c for c in rebuilt.conflicts()), rebuilt.conflicts()


# -- properties -----------------------------------------------------------------------------

UNIT = 64 * MiB  # memory is drawn in units of 64 MiB, hugepages in 2 MiB pages
RESOURCES = (MEMORY, HUGE_2M)


@dataclass(frozen=True)
class Alloc:
    key: Key
    request: dict[str, int]
    affinity: NodeSet | None


@dataclass(frozen=True)
class Release:
    workload: str
    container: str | None


@dataclass(frozen=True)
class Run:
    state: MemoryState
    ops: tuple[Alloc | Release, ...]

    def __repr__(self) -> str:
        nodes = [
            f"{n}:{self.state.table.allocatable(n, MEMORY) // MiB}M"
            f"+{self.state.table.allocatable(n, HUGE_2M) // MiB}Mh"
            for n in self.state.table.nodes
        ]
        return f"Run(nodes={nodes}, kernel_free={dict(self.state.kernel_free)}, ops={self.ops})"


@st.composite
def _machines(draw: st.DrawFn) -> MemoryState:
    ids = sorted(draw(st.sets(st.integers(0, 9), min_size=1, max_size=4)))
    nodes, kernel_free = [], {}
    for i in ids:
        units = draw(st.sampled_from([None, 0]) | st.integers(1, 12))
        pages = draw(st.integers(0, 8))
        nodes.append(_node(i, None if units is None else units * UNIT // 1024, pages))
        seen = draw(st.none() | st.integers(0, 10))
        if units and seen is not None:
            kernel_free[(i, HUGE_2M)] = seen * 2 * MiB
    return _state(_topology(*nodes), kernel_free)


@st.composite
def _requests(draw: st.DrawFn) -> dict[str, int]:
    pages = draw(st.integers(1, 6)) if draw(st.booleans()) else 0
    return {MEMORY: draw(st.integers(0, 14)) * UNIT, HUGE_2M: pages * 2 * MiB}


@st.composite
def _runs(draw: st.DrawFn) -> Run:
    state = draw(_machines())
    masks = st.sets(st.sampled_from(state.table.nodes), min_size=1).map(NodeSet)
    workloads, containers = st.sampled_from("abcd"), st.sampled_from("xy")
    ops: list[Alloc | Release] = []
    for _ in range(draw(st.integers(1, 14))):
        if draw(st.integers(0, 3)) == 0:
            ops.append(Release(draw(workloads), draw(st.none() | containers)))
        else:
            key = (draw(workloads), draw(containers))
            ops.append(Alloc(key, draw(_requests()), draw(st.none() | masks)))
    return Run(state, tuple(ops))


def _subsets(nodes: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    for width in range(1, len(nodes) + 1):
        yield from itertools.combinations(nodes, width)


def _check_sound(state: MemoryState) -> None:
    for node, resource in itertools.product(state.table.nodes, RESOURCES):
        allocatable = state.table.allocatable(node, resource)
        assert 0 <= state.free(node, resource) <= allocatable
        assert state.used(node, resource) <= allocatable
        if (node, resource) in state.kernel_free:
            assert state.free(node, resource) <= state.kernel_free[(node, resource)]
        groups = state.groups(node)
        # The group rule: single-NUMA blocks only, or blocks of exactly one group.
        assert all(len(g) == 1 for g in groups) or len(groups) == 1
    assert state.conflicts() == []
    for key, blocks in state.blocks.items():
        for block in blocks:
            assert {n for n, b in block.split if b > 0} <= set(block.nodes)
            assert all(b > 0 for _, b in block.split)
        assert state.mems(key) == NodeSet(n for b in blocks for n in b.nodes)


def _step(state: MemoryState, op: Alloc) -> MemoryState:
    hints = _listed(state.hints(op.request))
    wanted = {r: v for r, v in op.request.items() if v > 0}
    try:
        placed = state.allocate(op.key, op.request, op.affinity)
    except AllocationError as err:
        note(f"rejected: {err}")
        assert op.affinity is not None or hints is None or not next(iter(hints.values()))
        return state
    if placed is state:
        assert not wanted or op.key in state.blocks
        return state
    assert hints is not None
    if op.affinity is None:  # the default affinity is one of the hints
        masks = {h.affinity for h in next(iter(hints.values()))}
        assert placed.mems(op.key) in masks
    assert {b.resource: b.size for b in placed.blocks[op.key]} == wanted
    # Release gives back exactly what allocation took.
    released = placed.release(*op.key)
    assert released == state
    for node, resource in itertools.product(state.table.nodes, RESOURCES):
        assert released.free(node, resource) == state.free(node, resource)
    return placed


@settings(max_examples=300, deadline=None)
@given(_runs())
def test_random_runs_keep_the_accounting_sound(run: Run) -> None:
    state = run.state
    for op in run.ops:
        if isinstance(op, Release):
            before = {k for k in state.blocks if k[0] == op.workload}
            state = state.release(op.workload, op.container)
            gone = {k for k in before if op.container in (None, k[1])}
            assert not gone & set(state.blocks)
        else:
            state = _step(state, op)
        _check_sound(state)


@settings(max_examples=300, deadline=None)
@given(_runs(), _requests())
def test_hints_are_exactly_the_masks_that_fit(run: Run, request: dict[str, int]) -> None:
    state = run.state
    for op in run.ops:
        if isinstance(op, Alloc):
            with contextlib.suppress(AllocationError):
                state = state.allocate(op.key, op.request, op.affinity)
    wanted = {r: v for r, v in request.items() if v > 0}
    hints = _listed(state.hints(request))
    if not wanted:
        assert hints is None
        return
    assert hints is not None
    # Nodes with no capacity for any requested resource take no part (numad, not the kubelet).
    nodes = tuple(
        n for n in state.table.nodes if any(state.table.allocatable(n, r) for r in wanted)
    )

    def total(mask: tuple[int, ...], of: Callable[[int, str], int], resource: str) -> int:
        return sum(of(n, resource) for n in mask)

    fitting = [
        m
        for m in _subsets(nodes)
        if all(total(m, state.table.allocatable, r) >= v for r, v in wanted.items())
    ]
    narrowest = min((len(m) for m in fitting), default=len(nodes))
    expected = []
    for mask in fitting:
        groups: set[NodeSet] = set()
        for n in mask:
            groups |= state.groups(n)
        usable = all(len(g) == 1 for g in groups) if len(mask) == 1 else groups <= {NodeSet(mask)}
        if usable and all(total(mask, state.free, r) >= v for r, v in wanted.items()):
            expected.append((mask, len(mask) == narrowest))
    assert set(hints) == set(wanted)
    for each in hints.values():
        assert [(tuple(h.affinity or ()), h.preferred) for h in each] == expected


def test_multi_node_groups_of_one_width_come_in_the_kubelets_order() -> None:
    """Two groups of two nodes each, {1,2} and {0,3}, no node free for a new mask: the
    kubelet lists [0 3] before [1 2] (node lists, lexicographically). numad listed
    them by bit value (6 before 9); hypothesis found it in a random run."""
    space = HintSpace(
        nodes=0b1111,
        free=((10, 10, 10, 10),),
        need=(15,),
        width=2,
        pool=0,  # every node is in a group
        singles=0,
        groups=(0b0110, 0b1001),
    )
    assert [tuple(h.affinity or ()) for h in space.materialize()] == [(0, 3), (1, 2)]
