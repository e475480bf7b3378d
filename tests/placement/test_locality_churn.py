"""Device picking by locality through admission: a seeded churn of random device
requests on the constructed machine with switches (tests/placement/switched.py), run
three ways in lockstep (locality, index, locality without paths), and the words
``explain`` shows."""

from __future__ import annotations

import itertools
import random
from collections.abc import Mapping

import pytest

from numad.cpuset import NodeSet
from numad.daemon.answers import explained_json
from numad.placement.admission import (
    Books,
    ContainerRequest,
    Engine,
    Outcome,
    WorkloadRequest,
    admit,
    release,
)
from numad.placement.managers.cpu.state import CPUState
from numad.placement.managers.cpu.static import StaticOptions, StaticPolicy
from numad.placement.managers.cpu.topology import CPUTopology
from numad.placement.managers.device import DeviceInventory, DeviceState, Pick
from numad.placement.managers.memory import MemoryState, MemoryTable
from numad.placement.policy import Machine, Policy
from numad.topology.model import Topology
from numad.topology.pcie import common_path
from tests.placement import switched


def _host(topo: Topology, pick: Pick) -> tuple[Engine, Books]:
    view = CPUTopology.from_topology(topo)
    cpu_policy = StaticPolicy(view, StaticOptions())
    reserved = cpu_policy.reserve(1)
    engine = Engine(Machine(topo.node_ids), cpu_policy, memory_manager=False)
    inventory = DeviceInventory.build(topo, switched.classes(pick, pick))
    return engine, Books(
        CPUState(view.all, reserved), MemoryState(MemoryTable.build(topo)), DeviceState(inventory)
    )


def _depth(devices: DeviceState, addresses: list[str]) -> int:
    paths = {d.address: d.path for ds in devices.inventory.classes.values() for d in ds}
    shared = common_path([paths[a] for a in addresses])
    return 0 if shared is None else shared.depth


def _local(devices: DeviceState, placed: Mapping[str, tuple[str, ...]]) -> int:
    """The local CPUs of the devices ``placed``, as a mask."""
    mask = 0
    for name, addresses in placed.items():
        for d in devices.inventory.classes[name]:
            if d.address in addresses and d.local_cpus is not None:
                mask |= d.local_cpus.bits
    return mask


def _kubelets(
    devices: DeviceState, asked: Mapping[str, int], affinity: NodeSet | None
) -> dict[str, list[str]]:
    return {
        name: [d.address for d in devices.order(name, affinity)[:count]]
        for name, count in asked.items()
        if count
    }


def _deepest(devices: DeviceState, kubelets: dict[str, list[str]]) -> int:
    """By brute force: the deepest ancestor any set shares that takes, per class and
    node, as many free devices as the kubelet's order does."""
    nodes = {d.address: d.node for ds in devices.inventory.classes.values() for d in ds}
    choices = []
    for name, picked in kubelets.items():
        for node in {nodes[a] for a in picked}:
            count = sum(1 for a in picked if nodes[a] == node)
            free = [d.address for d in devices.free(name) if d.node == node]
            choices.append(list(itertools.combinations(free, count)))
    return max(
        _depth(devices, [a for part in combo for a in part])
        for combo in itertools.product(*choices)
    )


def _request(rng: random.Random, name: str) -> WorkloadRequest:
    gpus, nics = rng.choice((0, 1, 2, 4, 8)), rng.choice((0, 0, 1, 2))
    devices = {"gpu": gpus or (0 if nics else 1), "nic": nics}
    policy = rng.choice((Policy.BEST_EFFORT, Policy.SINGLE_NUMA_NODE))
    container = ContainerRequest(
        "main", rng.choice((0, 2, 4)), {}, {k: v for k, v in devices.items() if v}
    )
    return WorkloadRequest(name, (container,), policy)


@pytest.mark.parametrize("seed", range(6))
def test_churn(seed: int) -> None:
    rng = random.Random(seed)  # noqa: S311 - a seeded, repeatable churn, no secrets
    topo = switched.machine()
    hosts = {
        "locality": _host(topo, Pick.LOCALITY),
        "index": _host(topo, Pick.INDEX),
        "no paths": _host(switched.without_paths(topo), Pick.LOCALITY),
    }
    books = {k: b for k, (_, b) in hosts.items()}
    admitted: list[str] = []
    shared = {"locality": 0, "index": 0}
    local = {"locality": 0, "index": 0}
    for step in range(250):
        if admitted and rng.random() < 0.4:
            gone = admitted.pop(rng.randrange(len(admitted)))
            books = {k: release(b, gone) for k, b in books.items()}
            continue
        request = _request(rng, f"w{step}")
        asked = request.containers[0].devices
        before = dict(books)
        outcomes: dict[str, Outcome] = {}
        for k, (engine, _) in hosts.items():
            books[k], outcomes[k] = admit(engine, before[k], request)
        where = f"seed {seed} step {step}: {asked}"
        # Admissions, and where the merge put them, are the same three ways.
        assert len({o.admitted for o in outcomes.values()}) == 1, where
        if not outcomes["index"].admitted:
            continue
        admitted.append(request.name)
        affinity = outcomes["locality"].decisions[-1][1].affinity
        assert outcomes["index"].decisions == outcomes["locality"].decisions, where
        # pick = "index", and locality without paths: the kubelet's order exactly.
        kubelets = _kubelets(before["index"].devices, asked, affinity)
        assert dict(outcomes["index"].placements["main"].devices) == {
            k: tuple(v) for k, v in kubelets.items()
        }, where
        assert outcomes["no paths"].placements == outcomes["index"].placements, where
        # Locality: the deepest-shared set of those the kubelet's per-node counts allow.
        chosen = [a for v in outcomes["locality"].placements["main"].devices.values() for a in v]
        if len(chosen) >= 2:
            kubelets = _kubelets(before["locality"].devices, asked, affinity)
            expected = _deepest(before["locality"].devices, kubelets)
            assert _depth(books["locality"].devices, chosen) == expected, where
            index_chosen = [
                a for v in outcomes["index"].placements["main"].devices.values() for a in v
            ]
            for k, got in (("locality", chosen), ("index", index_chosen)):
                shared[k] += _depth(books[k].devices, got) >= 3
        for k in ("locality", "index"):  # exclusive CPUs among their devices' local CPUs
            placed = outcomes[k].placements["main"]
            local[k] += (placed.cpus.bits & _local(books[k].devices, placed.devices)).bit_count()
        # No device is held twice.
        for b in books.values():
            held = [a for per in b.devices.held.values() for v in per.values() for a in v]
            assert len(held) == len(set(held)), where
    assert shared["locality"] > shared["index"]
    assert local["locality"] > local["index"]


def test_explain_says_what_the_devices_share() -> None:
    engine, books = _host(switched.machine(), Pick.LOCALITY)
    request = WorkloadRequest("train", (ContainerRequest("main", 2, {}, {"gpu": 2, "nic": 1}),))
    _, outcome = admit(engine, books, request)
    parts = explained_json(outcome)["explained"][0]["parts"]
    assert "gpu 0000:10:00.0, 0000:16:00.0 and nic 0000:14:00.0 share switch 0000:30:00.0" in parts
    single = WorkloadRequest("one", (ContainerRequest("main", 2, {}, {"gpu": 1}),))
    _, outcome = admit(engine, books, single)
    assert not any("share" in p for p in explained_json(outcome)["explained"][0]["parts"])


def test_cpus_near_the_devices() -> None:
    """Node 0's switches on host bridge 00 are taken: two GPUs go under root port 2's
    switch (host bridge 40, local CPUs the second L3 group: cores 4-7), and the CPUs
    with them; by index, the kubelet's lowest free cores (CPU 0 is reserved)."""
    request = WorkloadRequest("near", (ContainerRequest("main", 4, {}, {"gpu": 2}),))
    other = WorkloadRequest("other", (ContainerRequest("main", 0, {}, {"gpu": 4}),))
    got = {}
    for pick in Pick:
        engine, books = _host(switched.machine(), pick)
        books, _ = admit(engine, books, other)
        _, outcome = admit(engine, books, request)
        got[pick] = outcome.placements["main"].cpus.format_list()
    assert got == {Pick.LOCALITY: "4-5,12-13", Pick.INDEX: "1-2,9-10"}
