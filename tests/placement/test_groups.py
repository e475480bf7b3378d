"""Aligned pairs (numad.placement.groups): the shares, the groups read back from what a
container holds, the CPU and memory managers' per-node preference, and admission
with and without align-per-resource, on the constructed switched machine
(tests/placement/switched.py: 2 nodes of 16 CPUs, two L3 groups a node, each
device's local CPUs its host bridge's L3 group)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from numad.cpuset import CPUSet, NodeSet
from numad.placement.admission import (
    Books,
    ContainerRequest,
    Engine,
    WorkloadRequest,
    admit,
    placements,
)
from numad.placement.groups import Group, cpu_first, groups, memory_weights, shares
from numad.placement.managers.cpu.state import CPUState
from numad.placement.managers.cpu.static import StaticOptions, StaticPolicy
from numad.placement.managers.cpu.topology import CPUTopology
from numad.placement.managers.device import Device, DeviceInventory, DeviceState
from numad.placement.managers.memory import MemoryState, MemoryTable, page_size
from numad.placement.policy import Machine, Policy, PolicyOptions
from tests.placement import switched

GIB = 1 << 30
L3 = {0: CPUSet([0, 1, 2, 3, 8, 9, 10, 11]), 1: CPUSet([4, 5, 6, 7, 12, 13, 14, 15])}
NODE1 = CPUSet(range(16, 32))


def _device(address: str, node: int, local: CPUSet) -> Device:
    return Device(address, node, ("pci0000:00",), local)


@pytest.mark.parametrize(
    ("total", "parts", "expected"),
    [
        pytest.param(8, 3, [3, 3, 2], id="first-get-the-rest"),
        pytest.param(2, 3, [1, 1, 0], id="fewer-than-devices"),
        pytest.param(0, 2, [0, 0], id="nothing"),
        pytest.param(5, 0, [], id="no-devices"),
    ],
)
def test_shares(total: int, parts: int, expected: list[int]) -> None:
    assert shares(total, parts) == expected
    assert sum(expected) == (total if parts else 0)


@pytest.mark.parametrize(
    ("resource", "size"),
    [
        pytest.param("memory", 1, id="memory"),
        pytest.param("hugepages-2Mi", 2 << 20, id="2Mi"),
        pytest.param("hugepages-1Gi", GIB, id="1Gi"),
        pytest.param("hugepages-64Ki", 64 << 10, id="64Ki"),
        pytest.param("hugepages-x", 1, id="unknown"),
    ],
)
def test_page_size(resource: str, size: int) -> None:
    assert page_size(resource) == size


# Node 0: a GPU on each host bridge (local CPUs L3 group 0, then 1) and a NIC on
# bridge 0; node 1: one GPU. The order DeviceState.located gives: node, class, address.
DEVICES = (
    ("gpu", _device("0000:10:00.0", 0, L3[0])),
    ("gpu", _device("0000:11:00.0", 0, L3[1])),
    ("nic", _device("0000:14:00.0", 0, L3[0])),
    ("gpu", _device("0000:90:00.0", 1, NODE1)),
)


def test_what_admission_asks_first() -> None:
    # 10 CPUs over 4 devices: 3, 3, 2, 2; node 0 holds the first three, two of them
    # (the first GPU, the NIC) near L3 group 0, one near group 1.
    assert cpu_first(DEVICES, 10) == (
        (0, 5, L3[0].bits),
        (0, 3, L3[1].bits),
        (1, 2, NODE1.bits),
    )
    assert cpu_first(DEVICES, 2) == ((0, 1, L3[0].bits), (0, 1, L3[1].bits))  # no 0s
    assert memory_weights(DEVICES) == {0: 3, 1: 1}


def test_groups_local_cpus_first_then_the_spare_ones() -> None:
    """8 CPUs, 2 a device. Node 0 holds 5 of them, node 1 three: the node 0 devices
    get their shares from node 0 in order, each its own L3 group first, compact by
    core (0 and 8 are one core); the NIC, one short, gets node 1's spare CPU after
    node 1's GPU has its share. Memory on each node is split evenly among its devices."""
    topo = CPUTopology.from_topology(switched.machine())
    cpus = CPUSet([0, 8, 4, 12, 1, 16, 24, 17])
    got = groups(DEVICES, cpus, {0: 3 * GIB, 1: GIB + 1}, topo)
    assert got == (
        Group("gpu", "0000:10:00.0", 0, CPUSet([0, 8]), GIB, local=True),
        Group("gpu", "0000:11:00.0", 0, CPUSet([4, 12]), GIB, local=True),
        Group("nic", "0000:14:00.0", 0, CPUSet([1, 17]), GIB, local=False),
        Group("gpu", "0000:90:00.0", 1, CPUSet([16, 24]), GIB + 1, local=True),
    )
    # A partition of the container's CPUs, in share sizes.
    assert sorted(c for g in got for c in g.cpus) == sorted(cpus)
    assert [len(g.cpus) for g in got] == shares(len(cpus), len(DEVICES))
    # The shared pool: groups without CPUs, none local; no devices: no groups.
    assert [g.local for g in groups(DEVICES, CPUSet(), {}, topo)] == [False] * 4
    assert groups((), cpus, {}, topo) == ()


def _host(*, align: bool, policy: Policy = Policy.BEST_EFFORT) -> tuple[Engine, Books]:
    topo = switched.machine()
    view = CPUTopology.from_topology(topo)
    cpu_policy = StaticPolicy(view, StaticOptions())
    engine = Engine(
        Machine(topo.node_ids),
        cpu_policy,
        policy,
        options=PolicyOptions(align_per_resource=align),
    )
    inventory = DeviceInventory.build(topo, switched.classes())
    books = Books(
        CPUState(view.all, cpu_policy.reserve(1)),
        MemoryState(MemoryTable.build(topo)),
        DeviceState(inventory),
    )
    return engine, books


EIGHT_GPUS = WorkloadRequest(
    "train", (ContainerRequest("main", 8, {"memory": 4 * GIB}, {"gpu": 8}),)
)


def test_eight_gpus_over_both_nodes_get_their_cpus_and_memory_per_node() -> None:
    """8 GPUs: 7 on node 0 and 1 on node 1 (a node has 7); 8 CPUs and 4 GiB would fit
    on one node, so no mask is preferred by all and best-effort takes both. The
    kubelet's allocator puts all 8 CPUs and the memory on node 0; align-per-resource
    gives node 1's GPU one CPU and an eighth of the memory there, each GPU its CPU
    from its own L3 group."""
    got = {}
    for align in (False, True):
        engine, books = _host(align=align)
        after, outcome = admit(engine, books, EIGHT_GPUS)
        assert outcome.admitted
        decision = outcome.decisions[0][1]
        assert (decision.affinity, decision.preferred) == (NodeSet([0, 1]), False)
        placed = outcome.placements["main"]
        got[align] = placed
        assert len(placed.cpus) == 8
        assert placed.mems == NodeSet([0, 1])  # cpuset.mems: the memory manager's mask
        split = after.memory.blocks[("train", "main")][0].split
        assert split == (((0, 4 * GIB),) if not align else ((0, 7 * GIB // 2), (1, GIB // 2)))
        assert placements(after, "train", engine.cpu_policy.topo) == outcome.placements
    assert got[False].devices == got[True].devices  # the same devices either way
    assert [g.local for g in got[False].groups] == [True] * 7 + [False]
    assert all(g.local for g in got[True].groups)
    bridge0 = {"0000:10:00.0", "0000:13:00.0", "0000:16:00.0", "0000:19:00.0"}  # L3 group 0
    for g in got[True].groups[:7]:
        assert len(g.cpus) == 1
        assert g.cpus.issubset(L3[0] if g.device in bridge0 else L3[1])


@pytest.mark.parametrize("policy", [Policy.SINGLE_NUMA_NODE, Policy.RESTRICTED])
def test_only_best_effort_is_paired(policy: Policy) -> None:
    request = replace(EIGHT_GPUS, policy=policy)
    outcomes = []
    for align in (False, True):
        engine, books = _host(align=align, policy=policy)
        outcomes.append(admit(engine, books, request))
    assert outcomes[0][0] == outcomes[1][0]
    assert outcomes[0][1] == outcomes[1][1]


def test_a_preferred_mask_is_not_paired() -> None:
    """Two GPUs, one on each bridge of node 0: node 0 holds everything, preferred;
    the option changes nothing."""
    request = WorkloadRequest("w", (ContainerRequest("main", 4, {"memory": GIB}, {"gpu": 2}),))
    results = [admit(*_host(align=align), request) for align in (False, True)]
    assert results[0][1].decisions[0][1].preferred
    assert results[0][0] == results[1][0]


def test_the_cpu_manager_takes_each_nodes_share_there_first() -> None:
    view = CPUTopology.from_topology(switched.machine())
    policy = StaticPolicy(view, StaticOptions())
    state = CPUState(view.all, 1)  # CPU 0 reserved
    first = ((0, 3, L3[1].bits), (1, 2, NODE1.bits))
    got = state.allocate(policy, ("w", "c"), 6, NodeSet([0, 1]), first=first)
    cpus = CPUSet.from_bits(got.assignments[("w", "c")])
    assert len(cpus & CPUSet(range(16))) >= 3
    assert len(cpus & NODE1) >= 2
    assert len(cpus & L3[1]) >= 3  # node 0's part near its devices
    # Node 1 has only 2 free: it gives those, the rest comes from the union.
    busy = replace(state, assignments={("x", "c"): NODE1.bits & ~0b11 << 16})
    got = busy.allocate(policy, ("w", "c"), 6, NodeSet([0, 1]), first=((1, 6, NODE1.bits),))
    assert CPUSet.from_bits(got.assignments[("w", "c")]) & NODE1 == CPUSet([16, 17])


def test_whole_cores_under_full_pcpus_only() -> None:
    """A node's share of 3 CPUs is 2 under full-pcpus-only (whole cores): the
    allocation stays valid, the rest comes from the union."""
    view = CPUTopology.from_topology(switched.machine())
    policy = StaticPolicy(view, StaticOptions(full_pcpus_only=True))
    state = CPUState(view.all, 0)
    got = state.allocate(
        policy, ("w", "c"), 4, NodeSet([0, 1]), first=((0, 1, L3[0].bits), (1, 3, NODE1.bits))
    )
    cpus = got.assignments[("w", "c")]
    assert bin(cpus).count("1") == 4
    for core in view.core.values():  # whole cores only
        assert cpus & core in (0, core)
    assert bin(cpus & NODE1.bits).count("1") >= 2


def test_without_first_the_allocation_is_the_kubelets() -> None:
    view = CPUTopology.from_topology(switched.machine())
    policy = StaticPolicy(view, StaticOptions())
    state = CPUState(view.all, 1)
    plain = policy.allocate(state.available, 5, NodeSet([0, 1]), reserved=1)
    got = state.allocate(policy, ("w", "c"), 5, NodeSet([0, 1]), first=())
    assert got.assignments[("w", "c")] == plain


def test_the_memory_manager_gives_each_device_node_its_share_first() -> None:
    table = MemoryTable.build(switched.machine())
    state = MemoryState(table)
    both = NodeSet([0, 1])
    plain = state.allocate(("w", "c"), {"memory": 4 * GIB}, both)
    assert plain.blocks[("w", "c")][0].split == ((0, 4 * GIB),)  # the kubelet's: greedy
    assert state.allocate(("w", "c"), {"memory": 4 * GIB}, both, {}).blocks == plain.blocks
    paired = state.allocate(("w", "c"), {"memory": 4 * GIB}, both, {0: 1, 1: 3})
    assert paired.blocks[("w", "c")][0] == replace(
        plain.blocks[("w", "c")][0], split=((0, GIB), (1, 3 * GIB))
    )
    # Node 1 nearly full (in the same group): it gives what it has, node 0 the rest.
    free1 = table.allocatable(1, "memory")
    full = state.allocate(("x", "c"), {"memory": free1 - GIB}, both, {1: 1})
    assert full.per_node(("x", "c")) == {1: free1 - GIB}
    paired = full.allocate(("w", "c"), {"memory": 4 * GIB}, both, {1: 1})
    assert paired.blocks[("w", "c")][0].split == ((0, 3 * GIB), (1, GIB))
    assert paired.per_node(("w", "c")) == {0: 3 * GIB, 1: GIB}
