"""align-per-resource in a seeded churn on the DGX-like machine (8 GPUs and 8 NICs, 4 of
each a node, every device's local CPUs its whole socket): best-effort arrivals of 1-8
GPUs with 0-2 NICs, 1-24 CPUs, memory and sometimes 1 GiB pages (a tenth with a
second such container), a quarter CPU-heavy ones without devices that fill a node;
40% of steps release a random workload. Three engines per step:

- on: the option on, its own books;
- shadow: the option off, on the on engine's books before the step (what the option
  may change is the allocation, never the decision: compared there);
- off: the option off, its own books, whose history must hash as before the option
  existed (the digests below were taken from the commit before it).

After every step: the on and shadow outcomes admit alike, decide alike and pick the
same devices (for a workload's first container: a later one sees different CPUs
held by the first); the off engine on its own books admits alike too (here a
best-effort rejection is a shortage of CPUs, devices or pages in all, which the
option does not change; with other shapes the books may part, as with any change
of CPUs); every container holds exactly its CPUs and memory amounts, on
the memory manager's mask; no CPU is held twice; each container's groups partition
its CPUs in share sizes; paired containers hold, on each device node n, exactly
min(S_n, F_n) locally paired CPUs, where S_n is the shares of n's devices and F_n
the CPUs free on n before the container (the most any allocation can pair: a
group's CPUs on its node are at most both), never fewer than the shadow's; and on
each device node at least min(its share, what was free) of every memory amount.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

import pytest

from numad.cpuset import CPUSet
from numad.hostfs import HostFS
from numad.placement.admission import (
    Books,
    ContainerRequest,
    Engine,
    Outcome,
    Placement,
    WorkloadRequest,
    admit,
    placements,
    release,
)
from numad.placement.groups import shares
from numad.placement.managers.cpu.state import CPUState
from numad.placement.managers.cpu.static import StaticOptions, StaticPolicy
from numad.placement.managers.cpu.topology import CPUTopology
from numad.placement.managers.device import DeviceClass, DeviceInventory, DeviceState
from numad.placement.managers.memory import MemoryState, MemoryTable, page_size
from numad.placement.policy import Machine, Policy, PolicyOptions
from numad.topology.discover import discover
from tests.conftest import Machines

GIB = 1 << 30
DGX = "224intel64-2pa56co2t+8gpu8nic-dgxlike"
STEPS = 300
# sha256 of the off engine's books after every step, from the commit before the option
# (and how many workloads it admitted): the option off changes nothing.
OFF_DIGESTS = {
    0: ("f572fe2c37f6d1a1", 104),
    1: ("08b42662b076d19e", 111),
    2: ("51b0d3f7bb6c35ae", 103),
    3: ("0e83a906e171ba63", 118),
}


def arrival(rng: random.Random, name: str) -> WorkloadRequest:
    if rng.random() < 0.25:
        cpus = rng.randrange(20, 90)
        big = ContainerRequest("main", cpus, {"memory": rng.randrange(1, 9) * GIB})
        return WorkloadRequest(name, (big,), Policy.BEST_EFFORT)
    containers = [_device_container(rng, "main")]
    if rng.random() < 0.1:
        containers.append(_device_container(rng, "side"))
    return WorkloadRequest(name, tuple(containers), Policy.BEST_EFFORT)


def _device_container(rng: random.Random, name: str) -> ContainerRequest:
    devices = {"gpu": rng.randrange(1, 9), "nic": rng.choice((0, 0, 1, 2))}
    memory = {"memory": rng.randrange(1, 17) * GIB // 2}
    if rng.random() < 0.3:
        memory["hugepages-1Gi"] = rng.randrange(1, 6) * GIB
    return ContainerRequest(
        name, rng.randrange(1, 25), memory, {k: v for k, v in devices.items() if v}
    )


@dataclass(frozen=True)
class Host:
    engine: Engine
    books: Books

    @property
    def topo(self) -> CPUTopology:
        return self.engine.cpu_policy.topo


@pytest.fixture(scope="module")
def dgx(machines: Machines) -> Host:
    topo = discover(HostFS(machines.root(DGX)))
    view = CPUTopology.from_topology(topo)
    policy = StaticPolicy(view, StaticOptions())
    classes = [DeviceClass("gpu", vendor="0x10de"), DeviceClass("nic", vendor="0x15b3")]
    books = Books(
        CPUState(view.all, policy.reserve(2)),
        MemoryState(MemoryTable.build(topo)),
        DeviceState(DeviceInventory.build(topo, classes)),
    )
    return Host(Engine(Machine(topo.node_ids), policy), books)


def _digest(h: hashlib._Hash, step: int, admitted: bool, books: Books) -> None:
    held = sorted((k, sorted(v.items())) for k, v in books.devices.held.items())
    state = (
        step,
        admitted,
        sorted(books.cpu.assignments.items()),
        sorted(books.memory.blocks.items()),
        held,
    )
    h.update(repr(state).encode())


@pytest.mark.slow  # unpacks and discovers the 224-CPU machine: minutes on a loaded host
@pytest.mark.parametrize("seed", sorted(OFF_DIGESTS))
def test_aligned_churn(seed: int, dgx: Host) -> None:
    on_engine = replace(dgx.engine, options=PolicyOptions(align_per_resource=True))
    on, off = dgx.books, dgx.books
    digest = hashlib.sha256()
    tally = Tally()
    rng = random.Random(seed)  # noqa: S311 - a seeded, repeatable churn, no secrets
    held: list[str] = []
    for step in range(STEPS):
        where = f"seed {seed} step {step}"
        if held and rng.random() < 0.4:
            gone = held.pop(rng.randrange(len(held)))
            on, off = release(on, gone), release(off, gone)
            continue
        request = arrival(rng, f"w{step}")
        after, outcome = admit(on_engine, on, request)
        _, shadow = admit(dgx.engine, on, request)
        off, off_outcome = admit(dgx.engine, off, request)
        _digest(digest, step, off_outcome.admitted, off)
        assert outcome.admitted == shadow.admitted == off_outcome.admitted, where
        if not outcome.admitted:
            continue
        tally.admitted += 1
        # The first container saw the same books under both: same decision, devices, mems.
        name, decision = outcome.decisions[0]
        assert shadow.decisions[0] == (name, decision), where
        mine, theirs = outcome.placements[name], shadow.placements[name]
        assert (mine.devices, mine.mems) == (theirs.devices, theirs.mems), where
        if decision.preferred or not mine.groups:
            assert mine == theirs, f"{where}: changed where the option does not apply"
        else:
            tally.shadow += _local(dgx.topo, theirs)
        _check(dgx.topo, after, request, outcome, tally, where)
        held.append(request.name)
        on = after
    assert (digest.hexdigest()[:16], tally.admitted) == OFF_DIGESTS[seed]
    assert tally.paired > 0
    assert tally.local > tally.shadow


@dataclass
class Tally:
    admitted: int = 0
    paired: int = 0  # containers the option applied to
    local: int = 0  # their CPUs paired on their device's node
    shadow: int = 0  # the same, for the first containers, without the option


def _local(topo: CPUTopology, placed: Placement) -> int:
    """The container's CPUs that sit, in its groups, on their device's node."""
    return sum((g.cpus.bits & topo.numa.get(g.node, 0)).bit_count() for g in placed.groups)


def _check(  # noqa: PLR0917 - one step's values
    topo: CPUTopology,
    after: Books,
    request: WorkloadRequest,
    outcome: Outcome,
    tally: Tally,
    where: str,
) -> None:
    """One admitted workload on the option's books (see the module's docstring)."""
    union = 0
    for cpus in after.cpu.assignments.values():
        assert not union & cpus, f"{where}: a CPU held twice"
        union |= cpus
    assert placements(after, request.name, topo) == outcome.placements, where
    decided = dict(outcome.decisions)
    for i, container in enumerate(request.containers):
        placed = outcome.placements.get(container.name)
        held = placed.cpus if placed is not None else CPUSet()
        assert len(held) == container.cpus, where
        blocks = after.memory.blocks.get((request.name, container.name), ())
        assert {b.resource: b.size for b in blocks} == container.memory, where
        for b in blocks:
            assert all(size % page_size(b.resource) == 0 for _, size in b.split), where
        if placed is None or not placed.groups:
            continue
        got = sorted(c for g in placed.groups for c in g.cpus)
        assert got == sorted(held), f"{where}: the groups do not partition the CPUs"
        sizes = [len(g.cpus) for g in placed.groups]
        assert sizes == shares(len(held), len(placed.groups)), where
        if decided[container.name].preferred:
            continue
        tally.paired += 1
        later = request.containers[i:]  # this one and those allocated after it
        local = _local(topo, placed)
        bound = sum(
            min(share, _free_cpus(topo, after, request.name, later, node))
            for node, share in _per_node(placed, container.cpus).items()
        )
        assert local == bound, f"{where}: {local} CPUs paired locally, {bound} possible"
        tally.local += local
        for b in blocks:
            for node, share in _memory_shares(placed, b.size, page_size(b.resource)).items():
                if node in b.nodes:
                    free = _free_memory(after, request.name, later, node, b.resource)
                    on_node = dict(b.split).get(node, 0)
                    assert on_node >= min(share, free), f"{where}: {b.resource} on {node}"


def _per_node(placed: Placement, count: int) -> dict[int, int]:
    """``count`` CPUs in the shares of the container's devices, summed per device node."""
    out: dict[int, int] = {}
    for g, share in zip(placed.groups, shares(count, len(placed.groups)), strict=True):
        out[g.node] = out.get(g.node, 0) + share
    return out


def _memory_shares(placed: Placement, amount: int, page: int) -> dict[int, int]:
    """Each device node's share of ``amount`` by its number of devices, in whole pages."""
    nodes = [g.node for g in placed.groups]
    return {n: amount * nodes.count(n) // len(nodes) // page * page for n in set(nodes)}


def _free_cpus(
    topo: CPUTopology,
    after: Books,
    workload: str,
    later: Sequence[ContainerRequest],
    node: int,
) -> int:
    """The CPUs free on ``node`` before the first of ``later`` was allocated."""
    mask = after.cpu.available
    for c in later:
        mask |= after.cpu.assignments.get((workload, c.name), 0)
    return (mask & topo.numa.get(node, 0)).bit_count()


def _free_memory(
    after: Books, workload: str, later: Sequence[ContainerRequest], node: int, resource: str
) -> int:
    """The bytes of ``resource`` free on ``node`` before the first of ``later``."""
    free = after.memory.free(node, resource)
    for c in later:
        for b in after.memory.blocks.get((workload, c.name), ()):
            if b.resource == resource:
                free += dict(b.split).get(node, 0)
    return free
