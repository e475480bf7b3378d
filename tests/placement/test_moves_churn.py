"""Moves to admit (numad.placement.moves) in a seeded churn: on recorded machines under
single-numa-node, workloads of one container (exclusive CPUs, whole cores where SMT,
and memory), half of them movable, arrive and leave around 72-88% occupancy; every
rejection asks ``make_room`` and a plan's books are taken. After every step:

- no CPU is held by two containers, none is reserved, the shared pool is not empty;
- each workload holds its CPUs and its memory on one node, the same one;
- each node's memory in use is the sum of the blocks' splits, never above allocatable.

For every plan: the newcomer is admitted with what it asked; every workload admitted
before still holds as many CPUs and bytes as it asked, the ones not moved the very
same CPUs and nodes; only movable workloads moved. And the search is exact for one
move: by brute force (release one movable workload, admit the newcomer, admit the
workload back), when any single move admits the newcomer, ``make_room`` returned a
plan of at most one move that costs no more than the cheapest of them.
"""

from __future__ import annotations

import random
from collections import Counter

import pytest

from numad.cpuset import NodeSet
from numad.placement.admission import (
    Books,
    ContainerRequest,
    WorkloadRequest,
    admit,
    release,
)
from numad.placement.managers.memory import MEMORY
from numad.placement.moves import Mover, Plan, cost, make_room
from numad.placement.policy import Policy
from tests.conftest import Machines
from tests.placement.test_resize_churn import empty_host, memory_accounted

STEPS = 2000
MIB = 1 << 20
Cost = tuple[int, int, int, int]


class Churn:
    def __init__(self, machines: Machines, name: str, seed: int) -> None:
        self.engine, self.books = empty_host(machines, name, Policy.SINGLE_NUMA_NODE)
        self.topo = view = self.engine.cpu_policy.topo
        self.rng = random.Random(seed)  # noqa: S311 - seeded: a run is reproducible
        core = view.cpus_per_core or 1
        half = min(m.bit_count() for m in view.numa.values()) // 2
        self.sizes = range(core, max(core, half - half % core) + 1, core)
        self.per_cpu = min(
            self.books.memory.table.allocatable(n, MEMORY) // m.bit_count()
            for n, m in view.numa.items()
        )
        self.allocatable = (view.all & ~self.books.cpu.reserved).bit_count()
        self.asked: dict[str, tuple[int, int]] = {}  # (exclusive CPUs, memory bytes)
        self.movable: set[str] = set()
        self.target = 0.8
        self.seen: Counter[str] = Counter()

    def step(self, index: int) -> None:
        if index % 200 == 0:
            self.target = self.rng.uniform(0.72, 0.88)
        used = sum(cpus for cpus, _ in self.asked.values())
        if self.asked and used / self.allocatable > self.target:
            gone = self.rng.choice(sorted(self.asked))
            self.books = release(self.books, gone)
            del self.asked[gone]
            self.movable.discard(gone)
        else:
            self.arrive(f"w{index}")
        self.check()

    def arrive(self, name: str) -> None:
        cpus = self.rng.choice(self.sizes)
        memory = max(MIB, int(cpus * self.per_cpu * self.rng.uniform(0.25, 1.0)) // MIB * MIB)
        request = WorkloadRequest(name, (ContainerRequest("main", cpus, {MEMORY: memory}),))
        movable = self.rng.random() < 0.5
        books, outcome = admit(self.engine, self.books, request)
        if not outcome.admitted:
            movers = {n: Mover(self._request(n)) for n in sorted(self.movable)}
            plan = make_room(self.engine, self.books, request, movers)
            self.check_exact_for_one_move(request, movers, plan)
            if plan is None:
                self.seen["rejected"] += 1
                return
            self.check_plan(request, movers, plan)
            self.seen[f"moved {len(plan.moves)}"] += 1
            books = plan.books
        self.seen["admitted"] += 1
        self.books = books
        self.asked[name] = (cpus, memory)
        if movable:
            self.movable.add(name)

    def _request(self, name: str) -> WorkloadRequest:
        cpus, memory = self.asked[name]
        return WorkloadRequest(name, (ContainerRequest("main", cpus, {MEMORY: memory}),))

    def check_exact_for_one_move(
        self, request: WorkloadRequest, movers: dict[str, Mover], plan: Plan | None
    ) -> None:
        singles = []
        for name, mover in movers.items():
            trial, outcome = admit(self.engine, release(self.books, name), request)
            if outcome.admitted:
                trial, again = admit(self.engine, trial, mover.request)
                if again.admitted:
                    singles.append(self._cost(name, trial))
        if not singles:
            return
        self.seen["single move exists"] += 1
        assert plan is not None, f"{request.name}: a single move admits it, no plan"
        assert len(plan.moves) <= 1
        assert plan.cost <= min(singles), (plan.cost, min(singles))

    def _cost(self, name: str, after: Books) -> Cost:
        """The cost of moving ``name`` from ``self.books`` to ``after``, worked out
        apart from numad.placement.moves: bytes on the nodes its memory leaves, across
        nodes or not, CPUs given up, one workload moved (none if nothing changed)."""
        key = (name, "main")
        old_cpus, new_cpus = self.books.cpu.assignments[key], after.cpu.assignments[key]
        old_mems, new_mems = self.books.memory.mems(key), after.memory.mems(key)
        old_nodes = NodeSet(self.topo.numas_of(old_cpus)) | old_mems
        new_nodes = NodeSet(self.topo.numas_of(new_cpus)) | new_mems
        leaving = 0
        if new_mems != old_mems:
            split = self.books.memory.per_node(key)
            leaving = sum(size for node, size in split.items() if node not in new_mems)
        changed = (old_cpus & ~new_cpus).bit_count()
        across = old_nodes != new_nodes
        return (leaving, int(across), changed, int(bool(changed or across)))

    def check_plan(self, request: WorkloadRequest, movers: dict[str, Mover], plan: Plan) -> None:
        assert plan.outcome.admitted
        assert plan.cost == cost(plan.moves)
        after = plan.books
        cpus, memory = request.containers[0].cpus, request.containers[0].memory[MEMORY]
        assert self._holds(after, request.name) == (cpus, memory)
        moved = {m.workload for m in plan.moves}
        assert moved <= set(movers), "moved a workload that is not movable"
        for name, asked in self.asked.items():
            assert self._holds(after, name) == asked, name
            key = (name, "main")
            if name not in moved:
                assert after.cpu.assignments[key] == self.books.cpu.assignments[key], name
                assert after.memory.mems(key) == self.books.memory.mems(key), name
        for move in plan.moves:
            key = (move.workload, "main")
            assert move.cpus_from.bits == self.books.cpu.assignments[key]
            assert move.cpus_to.bits == after.cpu.assignments[key]

    @staticmethod
    def _holds(books: Books, name: str) -> tuple[int, int]:
        key = (name, "main")
        blocks = books.memory.blocks.get(key, ())
        size = sum(b.size for b in blocks if b.resource == MEMORY)
        return books.cpu.assignments.get(key, 0).bit_count(), size

    def check(self) -> None:
        cpu, memory = self.books.cpu, self.books.memory
        union = 0
        for key, cpus in cpu.assignments.items():
            assert not cpus & union, f"{key} shares CPUs"
            assert not cpus & cpu.reserved, f"{key} holds reserved CPUs"
            union |= cpus
            nodes = self.topo.numas_of(cpus)
            assert len(nodes) == 1, f"{key} spans nodes {nodes}"
            assert memory.mems(key) == NodeSet(nodes), f"{key}: memory off its CPUs' node"
        assert cpu.shared_pool
        assert set(cpu.assignments) == {(n, "main") for n in self.asked}
        for name, asked in self.asked.items():
            assert self._holds(self.books, name) == asked, name
        memory_accounted(memory)


@pytest.mark.parametrize("name", ["32intel64-2p8co2t+8ve", "128arm-2pa2n8cluster4co"])
def test_moves_churn_keeps_every_promise(machines: Machines, name: str) -> None:
    churn = Churn(machines, name, seed=28)
    for index in range(STEPS):
        churn.step(index)
    for outcome in ("admitted", "rejected", "moved 1", "moved 2", "single move exists"):
        assert churn.seen[outcome] > 5, churn.seen  # each path really ran
