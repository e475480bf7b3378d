"""The kubelet's admission sequences, replayed through numad on its own discovery."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from numad.cpuset import NodeSet
from numad.hostfs import HostFS
from numad.placement.admission import (
    Books,
    ContainerRequest,
    Engine,
    WorkloadRequest,
    admit,
    release,
)
from numad.placement.conformance import read_cases
from numad.placement.managers.cpu.state import CPUState
from numad.placement.managers.cpu.static import StaticOptions, StaticPolicy
from numad.placement.managers.cpu.topology import CPUTopology, bits
from numad.placement.managers.device import DeviceClass, DeviceInventory, DeviceState, Pick
from numad.placement.managers.memory import MemoryState, MemoryTable
from numad.placement.policy import Machine, Policy
from numad.topology.discover import discover
from tests.conftest import Machines

SCENARIOS = list(
    read_cases(Path(__file__).resolve().parents[1] / "conformance" / "admission-public.jsonl.gz")
)


@pytest.mark.parametrize(
    "scenario", [pytest.param(s, id=f"{s['machine']}-{s['policy']}") for s in SCENARIOS]
)
def test_admission_sequence(machines: Machines, scenario: dict[str, Any]) -> None:
    topo = discover(HostFS(machines.root(scenario["machine"])))
    view = CPUTopology.from_topology(topo)
    assert [(c.cpu, c.core, c.socket, c.numa) for c in view.cpus] == [
        (c["cpu"], c["core"], c["socket"], c["numa"]) for c in scenario["topology"]
    ]
    assert list(topo.node_ids) == scenario["numa_nodes"]
    cpu_policy = StaticPolicy(view, StaticOptions())
    reserved = cpu_policy.reserve(scenario["cpu_manager"]["reserved_count"])
    assert bits(reserved) == scenario["reserved"]
    classes = [  # the kubelet's order: discovery knows the PCIe tree of these recordings
        DeviceClass(n, class_prefix=c["pci_class_prefix"], pick=Pick.INDEX)
        for n, c in scenario["device_classes"].items()
    ]
    inventory = DeviceInventory.build(topo, classes)
    for name, c in scenario["device_classes"].items():
        assert [(d.address, -1 if d.node is None else d.node) for d in inventory.classes[name]] == [
            (a, c["numa_node"][a]) for a in c["devices"]
        ]
    engine = Engine(
        machine=Machine(topo.node_ids),
        cpu_policy=cpu_policy,
        policy=Policy(scenario["policy"]),
        memory_manager=False,
    )
    books = Books(
        CPUState(view.all, reserved), MemoryState(MemoryTable.build(topo)), DeviceState(inventory)
    )
    assert bits(books.cpu.available) == scenario["initial_shared_pool"]
    for index, step in enumerate(scenario["steps"]):
        where = f"step {index} ({step['op']} {step['name']})"
        if step["op"] == "release":
            books = release(books, step["name"])
        else:
            request = WorkloadRequest(
                step["name"], (ContainerRequest("main", step["cpus"], {}, step["devices"]),)
            )
            books, outcome = admit(engine, books, request)
            decision = outcome.decisions[-1][1]
            placement = outcome.placements.get("main")
            got: dict[str, Any] = {
                "admit": outcome.admitted,
                "affinity": None if decision.affinity is None else list(decision.affinity),
                "preferred": decision.preferred,
                "cpus": bits(placement.cpus.bits) if placement else None,
                "devices": sorted(a for d in placement.devices.values() for a in d)
                if placement
                else None,
            }
            if not outcome.admitted:
                got["reason"] = str(outcome.reason)
            expected = {k: v for k, v in step["expect"].items() if k != "detail"}
            assert got == expected, where
        assert bits(books.cpu.available) == step["shared_pool"], where
        for name, free in step.get("free_devices", {}).items():
            assert [d.address for d in books.devices.free(name)] == free, where
    assert NodeSet(scenario["numa_nodes"]) == topo.node_ids
