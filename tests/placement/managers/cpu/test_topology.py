"""The CPU manager's view built from discovered machines."""

from __future__ import annotations

import pytest

from numad.hostfs import HostFS
from numad.placement.managers.cpu.topology import CPUTopology, bits
from numad.topology.discover import discover
from tests.conftest import Machines


@pytest.mark.parametrize(
    ("name", "counts"),
    [
        pytest.param("32intel64-2p8co2t+8ve", (32, 16, 2, 2, 2), id="2-socket-smt2"),
        pytest.param("48amd64-4pa2n6c-sparse", (48, 48, 4, 8, 8), id="sparse-nodes"),
        pytest.param("20em64t-hybrid-1p6c2t+2ca4co1t", (20, 14, 1, 1, 1), id="hybrid"),
        # Node 0 is gone: its online CPUs sit on no node and the CPU manager cannot use them.
        pytest.param("offline-cpu0-node0", (8, 8, 1, 1, 1), id="cpus-without-node"),
        pytest.param("fakeheteromemtiers", (6, 6, 1, 3, 1), id="memory-only-nodes"),
    ],
)
def test_view_of_a_recorded_machine(machines: Machines, name: str, counts: tuple[int, ...]) -> None:
    topo = discover(HostFS(machines.root(name)))
    view = CPUTopology.from_topology(topo)
    got = (view.num_cpus, view.num_cores, view.num_sockets, view.num_numa_nodes, view.num_uncore)
    assert got == counts
    for info in view.cpus:
        assert info.core == topo.cpu(info.cpu).core == min(bits(view.core[info.core]))
        assert info.numa == topo.cpu(info.cpu).node
        assert info.socket == topo.cpu(info.cpu).package
    # CPU-less (memory-only) nodes do not exist for the CPU manager.
    assert set(view.numa) == {n.id for n in topo.nodes if n.cpus}
