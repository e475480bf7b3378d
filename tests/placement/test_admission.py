"""Admission across a workload's containers: what one container's allocation leaves
the next, on the recorded 2-socket machine with its 8 vector engines on node 0."""

from __future__ import annotations

from numad.hostfs import HostFS
from numad.placement.admission import Books, ContainerRequest, Engine, WorkloadRequest, admit
from numad.placement.managers.cpu.state import ContainerKind, CPUState
from numad.placement.managers.cpu.static import StaticOptions, StaticPolicy
from numad.placement.managers.cpu.topology import CPUTopology
from numad.placement.managers.device import DeviceClass, DeviceInventory, DeviceState
from numad.placement.managers.memory import MemoryState, MemoryTable
from numad.placement.policy import Machine, Policy
from numad.topology.discover import discover
from tests.conftest import DAEMON_MACHINE, Machines

VE = DeviceClass("ve", class_prefix="0x0b40")


def _setup(machines: Machines) -> tuple[Engine, Books]:
    topo = discover(HostFS(machines.root(DAEMON_MACHINE)))
    view = CPUTopology.from_topology(topo)
    cpu_policy = StaticPolicy(view, StaticOptions())
    books = Books(
        CPUState(view.all, cpu_policy.reserve(2)),
        MemoryState(MemoryTable.build(topo)),
        DeviceState(DeviceInventory.build(topo, [VE])),
    )
    engine = Engine(Machine(topo.node_ids), cpu_policy, Policy.SINGLE_NUMA_NODE)
    return engine, books


def test_an_app_container_takes_over_its_finished_init_containers_devices(
    machines: Machines,
) -> None:
    """All 8 engines go to the init container; once it has finished they are the app's
    (the kubelet's devicesToReuse): admitted on node 0, the same 8, none held twice."""
    engine, books = _setup(machines)
    assert len(books.devices.free("ve")) == 8
    request = WorkloadRequest(
        "job",
        (
            ContainerRequest("setup", 1, devices={"ve": 8}, kind=ContainerKind.INIT),
            ContainerRequest("main", 2, devices={"ve": 8}),
        ),
    )
    books, outcome = admit(engine, books, request)
    assert outcome.admitted, outcome.detail
    main = outcome.placements["main"].devices["ve"]
    assert sorted(main) == sorted(d.address for d in books.devices.inventory.classes["ve"])
    assert "setup" not in outcome.placements or not outcome.placements["setup"].devices
    assert books.devices.free("ve") == ()


def test_a_sidecars_devices_are_not_taken_over(machines: Machines) -> None:
    """A sidecar (a restartable init container) runs beside the app: nothing to reuse."""
    engine, books = _setup(machines)
    request = WorkloadRequest(
        "job",
        (
            ContainerRequest("proxy", 1, devices={"ve": 8}, kind=ContainerKind.SIDECAR),
            ContainerRequest("main", 2, devices={"ve": 1}),
        ),
    )
    _, outcome = admit(engine, books, request)
    assert not outcome.admitted
    assert outcome.failed_container == "main"
