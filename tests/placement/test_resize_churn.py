"""Resize in place in a seeded churn: on recorded machines, random workloads (one or two
app containers, exclusive or shared, with memory, under every topology policy) are
admitted, released and resized (CPUs, memory or both, growing and shrinking) through
the pure core. After every step:

- no CPU is held by two containers, none is reserved, the shared pool is not empty;
- every container holds exactly the CPUs and memory it asks for now;
- each node's memory in use is the sum of the blocks' splits, never above allocatable;
- a grow keeps every CPU (a superset), a shrink keeps a subset; under restricted and
  single-numa-node the container stays on the nodes it spanned;
- a refused resize leaves the books as they were (the same object).
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from numad.cpuset import CPUSet
from numad.hostfs import HostFS
from numad.placement.admission import (
    Books,
    ContainerRequest,
    Engine,
    WorkloadRequest,
    admit,
    release,
)
from numad.placement.managers.cpu.state import CPUState
from numad.placement.managers.cpu.static import StaticOptions, StaticPolicy
from numad.placement.managers.cpu.topology import CPUTopology
from numad.placement.managers.device import DeviceInventory, DeviceState
from numad.placement.managers.memory import MEMORY, MemoryState, MemoryTable
from numad.placement.policy import Machine, Policy
from numad.placement.resize import SPREADING, resize
from numad.topology.discover import discover
from tests.conftest import Machines

GIB = 1 << 30
STEPS = 500
MACHINES = ("32intel64-2p8co2t+8ve", "memorysidecaches", "48amd64-4pa2n6c-sparse")
Key = tuple[str, str]


class Churn:
    def __init__(self, machines: Machines, name: str, seed: int) -> None:
        self.engine, self.books = empty_host(machines, name)
        self.topo = self.engine.cpu_policy.topo
        self.rng = random.Random(seed)  # noqa: S311 - seeded: a run is reproducible
        self.asked: dict[Key, tuple[int, int]] = {}  # (exclusive CPUs, memory bytes)
        self.policies: dict[str, Policy] = {}
        self.seen: Counter[str] = Counter()
        self.memory_cap = min(
            self.books.memory.table.allocatable(n, MEMORY) for n in self.books.memory.table.nodes
        )

    def step(self) -> None:
        roll = self.rng.random()
        if roll < 0.35 or not self.policies:
            self.admit()
        elif roll < 0.5:
            name = self.rng.choice(sorted(self.policies))
            self.books = release(self.books, name)
            del self.policies[name]
            self.asked = {k: v for k, v in self.asked.items() if k[0] != name}
        else:
            self.resize()
        self.check()

    def admit(self) -> None:
        name = f"w{self.rng.randrange(10**6)}"
        policy = self.rng.choice(list(Policy))
        memory = self.rng.randrange(1, 5) * max(1, self.memory_cap // 64)
        containers = tuple(
            ContainerRequest(f"c{i}", self.rng.choice((0, 1, 2, 3, 4, 6)), {MEMORY: memory})
            for i in range(self.rng.choice((1, 1, 2)))
        )
        books, outcome = admit(self.engine, self.books, WorkloadRequest(name, containers, policy))
        self.seen["admitted" if outcome.admitted else "rejected"] += 1
        if outcome.admitted:
            self.books = books
            self.policies[name] = policy
            for c in containers:
                self.asked[(name, c.name)] = (c.cpus, memory)

    def resize(self) -> None:
        key = self.rng.choice(sorted(self.asked))
        cpus_now, memory_now = self.asked[key]
        cpus = None
        if cpus_now and self.rng.random() < 0.8:
            cpus = max(1, cpus_now + self.rng.choice((-3, -2, -1, 1, 2, 4, 8, 16)))
        memory = None
        if self.rng.random() < 0.4 or cpus is None:
            memory = max(1, memory_now + self.rng.choice((-1, 1, 2, 20)) * (self.memory_cap // 64))
        before, held = self.books, self.books.cpu.assignments.get(key, 0)
        policy = self.policies[key[0]]
        done = resize(self.engine, before, key, cpus=cpus, memory=memory, policy=policy)
        if done.refused:
            self.seen["refused"] += 1
            assert done.books is before
            return
        self.seen["grown" if cpus and cpus > cpus_now else "resized"] += 1
        self.books = done.books
        now = self.books.cpu.assignments.get(key, 0)
        assert now & held == held or now & ~held == 0, "both added and removed CPUs"
        if policy not in SPREADING and now & ~held:
            assert self.topo.numas_of(now) <= self.topo.numas_of(held)
        self.asked[key] = (cpus_now if cpus is None else cpus, memory or memory_now)

    def check(self) -> None:
        cpu, memory = self.books.cpu, self.books.memory
        union = 0
        for key, cpus in cpu.assignments.items():
            assert not cpus & union, f"{key} shares CPUs"
            assert not cpus & cpu.reserved
            union |= cpus
        assert cpu.shared_pool
        for key, (cpus, size) in self.asked.items():
            assert cpu.assignments.get(key, 0).bit_count() == cpus, key
            blocks = memory.blocks.get(key, ())
            assert sum(b.size for b in blocks if b.resource == MEMORY) == size, key
        memory_accounted(memory)
        assert set(memory.blocks) == set(self.asked)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name", MACHINES)
def test_resize_churn_keeps_every_promise(machines: Machines, name: str, seed: int) -> None:
    churn = Churn(machines, name, seed)
    for _ in range(STEPS):
        churn.step()
    for outcome in ("admitted", "grown", "resized", "refused"):
        assert churn.seen[outcome] > 5, churn.seen  # each path really ran
    assert CPUSet.from_bits(churn.books.cpu.shared_pool)


def empty_host(
    machines: Machines, name: str, policy: Policy = Policy.BEST_EFFORT
) -> tuple[Engine, Books]:
    """The engine and empty books of a recorded machine: the static CPU policy with 2
    CPUs reserved, the memory manager on, no devices."""
    topo = discover(HostFS(machines.root(name)))
    view = CPUTopology.from_topology(topo)
    cpu_policy = StaticPolicy(view, StaticOptions())
    books = Books(
        CPUState(view.all, cpu_policy.reserve(2)),
        MemoryState(MemoryTable.build(topo)),
        DeviceState(DeviceInventory.build(topo, [])),
    )
    return Engine(Machine(topo.node_ids), cpu_policy, policy), books


def memory_accounted(memory: MemoryState) -> None:
    """Each node's ``memory`` bytes in use are the sum of the blocks' split there, and
    within what the node can allocate."""
    for node in memory.table.nodes:
        used = sum(
            amount
            for blocks in memory.blocks.values()
            for b in blocks
            for n, amount in b.split
            if n == node and b.resource == MEMORY
        )
        assert used == memory.used(node, MEMORY)
        assert used <= memory.table.allocatable(node, MEMORY)
