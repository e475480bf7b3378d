"""CPU, memory and device hints from the three managers, merged: the worked examples.

A 2-node machine like the kubelet's fixtures: 6 CPUs per node (3 cores x 2
threads), 16 GiB per node, GPUs on the nodes as each case says. Every case
states the kubelet's decision worked out by hand from the references, and
checks it against numad's merge and against the plain enumeration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from numad.cpuset import CPUSet, NodeSet
from numad.placement.explain import explain
from numad.placement.hints import Hint, ProviderHints
from numad.placement.hintspace import HintSpace, listed
from numad.placement.managers.cpu.state import CPUState
from numad.placement.managers.cpu.static import StaticOptions, StaticPolicy
from numad.placement.managers.cpu.topology import CPUTopology, mask_of
from numad.placement.managers.device import DeviceClass, DeviceInventory, DeviceState
from numad.placement.managers.memory import MemoryState, MemoryTable
from numad.placement.merge import Strategy
from numad.placement.policy import Machine, Policy, PolicyOptions, merge
from numad.topology.model import CPU, Core, NumaNode, Package, PciDevice, Topology
from tests.plain_merge import plain_merge

GiB = 1 << 30


def machine(gpus_per_node: tuple[int, int]) -> Topology:
    """2 sockets = 2 nodes, 3 cores x 2 threads each (siblings n, n+3 within a node)."""
    cpus, cores, packages, nodes = [], [], [], []
    for node in (0, 1):
        ids = list(range(node * 6, node * 6 + 6))
        for i in ids:
            core = node * 6 + (i - node * 6) % 3
            cpus.append(CPU(id=i, online=True, node=node, package=node, core=core))
        cores += [
            Core(node * 6 + k, node, None, k, CPUSet([node * 6 + k, node * 6 + k + 3]))
            for k in range(3)
        ]
        packages.append(Package(node, CPUSet(ids)))
        nodes.append(
            NumaNode(
                node,
                CPUSet(ids),
                16 * GiB // 1024,
                16 * GiB // 1024,
                (),
                {0: 10 + 11 * node, 1: 21 - 11 * node},
            )
        )
    devices = [
        PciDevice(f"0000:{node + 1:02x}:{k:02x}.0", node, "0x10de", "0x2330", "0x030200")
        for node in (0, 1)
        for k in range(gpus_per_node[node])
    ]
    return Topology(tuple(cpus), tuple(nodes), tuple(packages), tuple(cores), (), tuple(devices))


@dataclass
class Host:
    topo: Topology
    cpu: CPUState = field(init=False)
    memory: MemoryState = field(init=False)
    devices: DeviceState = field(init=False)

    def __post_init__(self) -> None:
        self.view = CPUTopology.from_topology(self.topo)
        self.policy = StaticPolicy(self.view, StaticOptions())
        self.cpu = CPUState(online=self.view.all, reserved=0)
        self.memory = MemoryState(MemoryTable.build(self.topo))
        inventory = DeviceInventory.build(
            self.topo, [DeviceClass("example.com/gpu", vendor="0x10de")]
        )
        self.devices = DeviceState(inventory)

    def providers(self, cpus: int, memory: int, gpus: int) -> list[ProviderHints]:
        """In the kubelet's registration order: device, CPU, memory managers."""
        device = (
            {"example.com/gpu": self.devices.hints(("w", "c"), "example.com/gpu", gpus)}
            if gpus
            else {}
        )
        cpu = {"cpu": self.cpu.hints(self.policy, "w", "c", cpus)}
        mem = self.memory.hints({"memory": memory}) or {}
        return [device, cpu, mem]


def _nodes(hints: Sequence[Hint] | HintSpace | None) -> list[tuple[list[int], bool]] | None:
    hints = listed(hints)
    return None if hints is None else [(list(h.affinity or ()), h.preferred) for h in hints]


def _decide(policy: Policy, providers: list[ProviderHints]) -> tuple[list[int] | None, bool, bool]:
    d = merge(policy, PolicyOptions(), Machine(NodeSet([0, 1])), providers)
    got = (None if d.affinity is None else list(d.affinity), d.preferred, d.admit)
    plain = plain_merge(str(policy), [0, 1], providers)
    assert got == (plain[0], plain[1], plain[3])
    return got


def test_cpu_hint_examples_of_the_reference() -> None:
    """cpu-manager.md section 8: 2 nodes of 6 CPUs, CPUs 0 and 1 taken."""
    host = Host(machine((0, 0)))
    free = host.view.all & ~mask_of([0, 1])
    assert _nodes(host.policy.hints(free, 2)) == [([0], True), ([1], True), ([0, 1], False)]
    assert _nodes(host.policy.hints(free, 5)) == [([1], True), ([0, 1], False)]
    assert _nodes(host.policy.hints(free, 7)) == [([0, 1], True)]
    assert host.policy.hints(free, 11) == ()


def test_everything_fits_on_one_node() -> None:
    host = Host(machine((1, 1)))
    providers = host.providers(cpus=2, memory=4 * GiB, gpus=1)
    for policy in (Policy.BEST_EFFORT, Policy.RESTRICTED, Policy.SINGLE_NUMA_NODE):
        affinity, preferred, admit = _decide(policy, providers)
        assert (preferred, admit) == (True, True)
        assert affinity == [0]


def test_two_gpus_only_on_node_one_pull_everything_there() -> None:
    host = Host(machine((1, 2)))
    assert _decide(Policy.SINGLE_NUMA_NODE, host.providers(cpus=4, memory=8 * GiB, gpus=2)) == (
        [1],
        True,
        True,
    )


def test_memory_that_fits_one_node_by_capacity_but_not_free_is_not_spread() -> None:
    """memory-device-managers.md 1.4-1.5: a 20 GiB block fills node 0 and 4 GiB of node 1,
    which makes {0,1} a group. 8 GiB would fit one node by capacity, but node 0 is full
    and node 1 may only serve its group: the one hint is {0,1}, not preferred. Strict
    policies reject instead of spreading; best-effort spreads."""
    host = Host(machine((0, 0)))
    host.memory = host.memory.allocate(("a", "c"), {"memory": 20 * GiB}, NodeSet([0, 1]))
    block = host.memory.blocks[("a", "c")][0]
    assert block.split == ((0, 16 * GiB), (1, 4 * GiB))
    providers = host.providers(cpus=2, memory=8 * GiB, gpus=0)
    assert _nodes(providers[2]["memory"]) == [([0, 1], False)]
    assert _decide(Policy.RESTRICTED, providers) == ([0, 1], False, False)
    assert _decide(Policy.BEST_EFFORT, providers) == ([0, 1], False, True)


def test_three_gpus_split_one_and_two_cannot_prefer_the_node_holding_two() -> None:
    """memory-device-managers.md 2.2 (kubelet issue #136431)."""
    host = Host(machine((1, 2)))
    providers = host.providers(cpus=2, memory=4 * GiB, gpus=3)
    assert _nodes(providers[0]["example.com/gpu"]) == [([0, 1], True)]
    decision = merge(Policy.RESTRICTED, PolicyOptions(), Machine(NodeSet([0, 1])), providers)
    assert (decision.affinity, decision.preferred, decision.admit) == (
        NodeSet([0, 1]),
        False,
        False,
    )
    assert set(explain(decision).conflict) == {"example.com/gpu", "cpu"}
    assert _decide(Policy.BEST_EFFORT, providers) == ([0, 1], False, True)


@pytest.mark.parametrize(
    ("weights", "strategy", "winner", "score"),
    [
        pytest.param(None, Strategy.MOST_ALLOCATED, [0], 50, id="unweighted-most-allocated"),
        pytest.param({"nvidia.com/gpu": 10}, Strategy.MOST_ALLOCATED, [1], 66, id="gpu-heavy-most"),
        pytest.param(
            {"nvidia.com/gpu": 10}, Strategy.LEAST_ALLOCATED, [0], 31, id="gpu-heavy-least"
        ),
        pytest.param(
            {"cpu": 3, "memory": 1, "nvidia.com/gpu": 6},
            Strategy.LEAST_ALLOCATED,
            [0],
            42,
            id="mixed",
        ),
    ],
)
def test_score_worked_example(
    weights: dict[str, int] | None, strategy: Strategy, winner: list[int], score: int
) -> None:
    """topology-manager.md section 5: scores 75/50/25 on node 0 and 25/25/75 on node 1."""

    def two(s0: int, s1: int) -> tuple[Hint, ...]:
        return (Hint(NodeSet([0]), True, s0), Hint(NodeSet([1]), True, s1))

    providers: list[ProviderHints] = [
        {"nvidia.com/gpu": two(25, 75)},
        {"cpu": two(75, 25)},
        {"memory": two(50, 25)},
    ]
    options = PolicyOptions(strategy=strategy, weights=weights)
    d = merge(Policy.BEST_EFFORT, options, Machine(NodeSet([0, 1])), providers)
    assert (list(d.affinity or ()), d.preferred, d.score) == (winner, True, score)


def test_allocation_follows_the_decision_in_every_manager() -> None:
    host = Host(machine((1, 2)))
    providers = host.providers(cpus=4, memory=8 * GiB, gpus=2)
    d = merge(Policy.SINGLE_NUMA_NODE, PolicyOptions(), Machine(NodeSet([0, 1])), providers)
    assert d.affinity == NodeSet([1])
    cpu = host.cpu.allocate(host.policy, ("w", "c"), 4, d.affinity)
    mem = host.memory.allocate(("w", "c"), {"memory": 8 * GiB}, d.affinity)
    dev = host.devices.allocate(("w", "c"), {"example.com/gpu": 2}, d.affinity)
    assert CPUSet.from_bits(cpu.assignments[("w", "c")]).issubset(host.topo.node(1).cpus)
    assert mem.mems(("w", "c")) == NodeSet([1])
    assert dev.held[("w", "c")]["example.com/gpu"] == ("0000:02:00.0", "0000:02:01.0")
